"""Who besides the user can change a path: the checks of ``init --dir`` and of the profile's ``python_env``.

A user who can change a directory ddslurm writes into, or the Python environment it runs, makes the submitting user
run their code (a ``build.py``, a ``.pth`` file, a replaced ``bin/ddslurm-runtime``) or send their keys elsewhere
(a replaced ``model_providers.yaml``). So both are refused when another user can write them. The words used here:

- another user can *write* an entry when a user other than this one (the effective uid) and root owns it (its owner
  can change its mode at will), or when its group or every user may write it (``chmod g+w``/``o+w``); the sticky bit
  does not change that for the entry itself, since others may still add files to it;
- a directory *on the way* to it (each directory the path passes through, the directories its symbolic links lead
  through included) is trusted when only this user or root can rename or replace what is in it: owned by one of them
  and writable by others only with the sticky bit set (``/tmp``: others add entries but cannot rename the user's);
- a symbolic link on the way is trusted when this user or root owns it (in a sticky directory its owner could
  point it elsewhere).

:func:`resolve_trusted` walks a path as the kernel resolves it, judging every directory and link on the way, and
:func:`others_can_write` says who else can write one entry.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections import deque
from pathlib import Path

from ddslurm.config import OTHERS_WRITE, UnsafePathError

MAX_LINKS = 40
"""Symbolic links followed in one path at most (the kernel's limit)."""


def user_name(uid: int) -> str:
    """``uid`` as ``name (uid N)``, or ``uid N`` when it has no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def others_can_write(st: os.stat_result, uid: int, *, sticky_ok: bool = False, owner_only: bool = False) -> str | None:
    """Who besides ``uid`` (and root, unless ``owner_only``) can change the entry ``st`` describes, in words
    (``its owner nobody (uid 65534)``, ``group staff (gid 50) (mode 0775)``); None when nobody. ``sticky_ok``: a
    sticky directory writable by others counts as not writable (a directory on the way)."""
    owners = {uid} if owner_only else {uid, 0}
    if st.st_uid not in owners:
        return f"its owner {user_name(st.st_uid)}"
    mode = stat.S_IMODE(st.st_mode)
    if not mode & OTHERS_WRITE or (sticky_ok and stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX):
        return None
    if mode & 0o002:
        return f"every user (mode {mode:04o})"
    return f"group {group_name(st.st_gid)} (mode {mode:04o})"


def lstat_of(path: Path) -> os.stat_result | None:
    """``lstat`` of ``path``; None when nothing is there. Another error (no permission to look) is refused."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafePathError(f"{path}: cannot be examined: {exc.strerror}") from None


def _judge_on_way(path: Path, st: os.stat_result, uid: int) -> None:
    who = others_can_write(st, uid, sticky_ok=True)
    if who is not None:
        raise UnsafePathError(f"{path}: {who} can rename or replace what is in this directory")


def resolve_trusted(path: Path, *, uid: int | None = None) -> tuple[Path, tuple[str, ...]]:
    """``path`` resolved as the kernel resolves it, one component at a time, every directory on the way judged
    (owned by ``uid``, this process's effective one by default, or root, and writable by others only when sticky)
    and every symbolic link followed owned by ``uid`` or root. Returns the real path of its longest existing part,
    a directory, and the names below it that do not exist yet (none when ``path`` exists). That directory is judged
    as one on the way when names are missing below it; when ``path`` exists, the caller judges it. Raises
    :class:`UnsafePathError` naming the first entry another user could change, or one that is not a directory."""
    uid = os.geteuid() if uid is None else uid
    root = Path("/")
    current = root
    judged: set[Path] = set()
    pending = deque(Path(path).absolute().parts[1:])  # ``..`` kept: it is resolved below as the kernel does
    followed = 0
    while pending:
        name = pending.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent  # ``current`` is real: its parent is what ``..`` names
            continue
        if current not in judged:  # a directory is judged where a name is looked up in it: the last is the caller's
            here = lstat_of(current)
            assert here is not None
            _judge_on_way(current, here, uid)
            judged.add(current)
        entry = current / name
        st = lstat_of(entry)
        if st is None:
            tail = os.path.normpath(Path(name, *pending))
            if tail.split(os.sep, 1)[0] == "..":
                raise UnsafePathError(f"{path}: names a directory above {current} through one that does not exist")
            return current, Path(tail).parts
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (uid, 0):
                raise UnsafePathError(
                    f"{entry}: a symbolic link owned by {user_name(st.st_uid)}, who can point it elsewhere"
                )
            followed += 1
            if followed > MAX_LINKS:
                raise UnsafePathError(f"{path}: more than {MAX_LINKS} symbolic links on the way")
            target = entry.readlink()
            if target.is_absolute():
                current = root
            pending.extendleft(reversed(target.parts[1:] if target.is_absolute() else target.parts))
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"{entry}: is not a directory")
        current = entry
    return current, ()
