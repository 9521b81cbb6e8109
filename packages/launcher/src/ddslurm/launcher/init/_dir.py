"""Where ``ddslurm init`` may write: a directory of the user's own, and never through a symbolic link.

``init --dir D`` writes files that decide where the user's keys go (``dd-home/model_providers.yaml``) and code that
runs as the user (``build.py``). Another user who can change ``D``, or any directory on the way to it, could plant
a symbolic link where init writes, or replace those files after it, so :func:`check_target` refuses, before
anything is written and before the cluster is asked:

- a ``D`` that exists and is not owned by the user, or that its group or every user may write (sticky or not);
- any directory on the way to ``D`` (or to where a missing ``D`` will be made) that a user other than this one and
  root owns, or that others may write without the sticky bit: they could rename ``D`` aside and put their own in its
  place (:func:`~ddslurm.launcher.cluster._trust.resolve_trusted`, symbolic links on the way included);
- a symbolic link, or anything but a regular file of the user's, where init writes a file, and a symbolic link or a
  directory another user can write where it writes into one (``dd-home``), ``--force`` or not.

A missing ``D`` (and ``dd-home``) is made owner-only (0700, whatever the umask) by :func:`make_dir`, which refuses
an entry that appeared meanwhile; files are written by the safe primitives of ``ddslurm.config`` (a temporary file
made with ``O_EXCL | O_NOFOLLOW``, then linked or renamed into place: never through a link).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from ddslurm.config import UnsafePathError
from ddslurm.launcher.cluster._trust import lstat_of, others_can_write, resolve_trusted, user_name
from ddslurm.launcher.errors import InitError

DIR_MODE = 0o700
ADVICE = (
    "give --dir a directory of your own: one you own and no other user can write, reached through directories "
    "only you or root can change (a new one in your home directory, for example: --dir ~/my-run)"
)


@dataclass(frozen=True, slots=True)
class InitTarget:
    """Where init writes, as :func:`check_target` found it."""

    real: Path
    """The real path of ``--dir`` (symbolic links resolved), which may not exist yet."""
    create: tuple[Path, ...]
    """The directories to make (real paths), each after its parent."""
    existing: tuple[str, ...]
    """The files init writes that exist already (names relative to ``--dir``): regular files of the user's."""


def _refuse(shown: Path, why: str) -> InitError:
    return InitError(f"{shown}: {why}; nothing was written. {ADVICE[0].upper()}{ADVICE[1:]}")


def _link_text(path: Path) -> str:
    try:
        return f" (to {path.readlink()})"
    except OSError:
        return ""


def check_target(target: Path, relatives: Sequence[str], *, uid: int | None = None) -> InitTarget:
    """``target`` (``--dir``) and the files init writes in it (``relatives``), judged as the module says; raises
    :class:`InitError` naming the first thing refused. Reads only: nothing is made."""
    uid = os.geteuid() if uid is None else uid
    try:
        base, missing = resolve_trusted(target, uid=uid)
    except UnsafePathError as exc:
        raise _refuse(target, f"cannot be trusted: {exc}") from None
    real = base.joinpath(*missing)
    create = [base.joinpath(*missing[: i + 1]) for i in range(len(missing))]
    if not missing:
        st = lstat_of(real)
        assert st is not None
        who = others_can_write(st, uid, owner_only=True)
        if who is not None:
            raise _refuse(target, f"{who} can write in this directory")
    existing: list[str] = []
    seen: set[Path] = set()
    for relative in relatives:
        parts = PurePath(relative).parts
        for depth in range(1, len(parts)):
            sub = real.joinpath(*parts[:depth])
            if sub in seen:
                continue
            seen.add(sub)
            shown = target.joinpath(*parts[:depth])
            st = None if sub.parent in create else lstat_of(sub)
            if st is None:
                create.append(sub)
            elif stat.S_ISLNK(st.st_mode):
                raise _refuse(shown, f"is a symbolic link{_link_text(sub)}: init never writes through one")
            elif not stat.S_ISDIR(st.st_mode):
                raise _refuse(shown, "is not a directory")
            elif (who := others_can_write(st, uid, owner_only=True)) is not None:
                raise _refuse(shown, f"{who} can write in this directory")
        path, shown = real / relative, target / relative
        st = None if path.parent in create else lstat_of(path)
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(shown, f"is a symbolic link{_link_text(path)}: init never writes through one")
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(shown, "is not a regular file")
        if st.st_uid != uid:
            raise _refuse(shown, f"belongs to {user_name(st.st_uid)}, not to you")
        existing.append(relative)
    return InitTarget(real, tuple(create), tuple(existing))


def make_dir(path: Path) -> None:
    """Make directory ``path`` owner-only (0700 whatever the umask); an entry already there (a directory or a link
    made since :func:`check_target`) is refused, never used."""
    try:
        path.mkdir(DIR_MODE)
    except FileExistsError:
        raise InitError(f"{path} appeared while init was writing; nothing was written") from None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)
