"""Safe file primitives: atomic writes, write-once publication, private directories, hashing.

Nothing here follows a symbolic link at the final path component, and nothing replaces a file that must be
written once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import pwd
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ddslurm.config.errors import LockHeldError, UnsafePathError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a rename into it, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _temp_beside(path: Path, data: bytes, mode: int) -> Iterator[Path]:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write(path: Path, data: bytes, *, mode: int = PRIVATE_FILE) -> None:
    """Replace ``path`` with ``data`` atomically (temp file, fsync, rename, fsync of the directory).

    A symbolic link at ``path`` is refused, never followed or replaced.
    """
    if path.is_symlink():
        raise UnsafePathError(f"{path}: is a symbolic link; refusing to write through it")
    with _temp_beside(path, data, mode) as tmp:
        tmp.replace(path)
    fsync_dir(path.parent)


def publish_once(path: Path, data: bytes, *, mode: int = PRIVATE_FILE) -> bool:
    """Create ``path`` with ``data`` only if nothing exists there; return whether this call created it.

    The content is complete before the name appears (hard link of a fsynced temp file), and an existing
    entry, including a symbolic link, is never replaced.
    """
    with _temp_beside(path, data, mode) as tmp:
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            return False
    fsync_dir(path.parent)
    return True


def open_append(path: Path) -> IO[bytes]:
    """``path`` opened for appending, created owner-only (0600) if it is missing; a symbolic link at ``path`` is
    refused, never followed. Each ``write`` of a line ends up whole at the end of the file (``O_APPEND``)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE)
    except OSError as exc:
        if path.is_symlink():
            raise UnsafePathError(f"{path}: is a symbolic link; refusing to write through it") from None
        raise exc
    return os.fdopen(fd, "ab")


def _mkdir_private(path: Path) -> None:
    """``mkdir`` then ``chmod`` to 0700: the mode of ``mkdir`` alone is masked by the umask (0o700 at umask 0o700
    would be 0o000), and an explicit chmod is what makes it exactly owner-only whatever the umask."""
    path.mkdir(mode=PRIVATE_DIR)
    path.chmod(PRIVATE_DIR)  # just made by mkdir: a directory, not a link


def make_private_dir(path: Path, *, exist_ok: bool = False) -> None:
    """Create ``path`` and every missing parent owner-only (0700 whatever the umask); refuse a symbolic link in
    its place. Existing parents are left as they are (:func:`check_run_tree` judges them)."""
    if path.is_symlink():
        raise UnsafePathError(f"{path}: is a symbolic link; refusing to use it as a directory")
    missing = [p for p in (path.parent, *path.parent.parents) if not os.path.lexists(p)]
    for parent in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process: judged like any other
            _mkdir_private(parent)
    try:
        _mkdir_private(path)
    except FileExistsError:
        if not exist_ok:
            raise UnsafePathError(f"{path}: already exists") from None
        if not path.is_dir():
            raise UnsafePathError(f"{path}: exists and is not a directory") from None


def _directory_stat(path: Path) -> os.stat_result:
    """``lstat`` of ``path``, which must be a real directory (a symbolic link in its place is refused)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UnsafePathError(f"{path}: cannot be examined: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path}: is not a directory (a symbolic link or a file in its place)")
    return st


def check_private_dir(path: Path, *, uid: int | None = None) -> None:
    """``path`` is a real directory (not a symbolic link) owned by ``uid`` (this process's) that nobody else can
    read, enter or change (no group or other bits)."""
    uid = os.getuid() if uid is None else uid
    st = _directory_stat(path)
    if st.st_uid != uid:
        raise UnsafePathError(f"{path}: belongs to uid {st.st_uid}, not to this user (uid {uid}); refusing to use it")
    if st.st_mode & 0o077:
        raise UnsafePathError(
            f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users in; a run directory must be 0700 "
            f"(chmod 700 {path})"
        )


OTHERS_WRITE = 0o022
"""Group and other write bits: a directory or file with either is one another user can change."""


def _user(uid: int) -> str:
    """``uid``'s login name, ``$USER`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "$USER"


def check_not_swappable(path: Path, *, uid: int | None = None, workspace: bool = False) -> None:
    """Nobody but ``uid`` (or root) can add, rename or replace anything inside directory ``path``: it is owned by
    them and writable by no one else. The sticky bit is not enough: it stops others renaming what is not theirs,
    not planting files of their own (a ``facts.json``, a FIFO, a lock) for ddslurm to read. ``workspace``: ``path``
    is a profile's workspace (the refusal says to use a directory of the user's own instead)."""
    uid = os.getuid() if uid is None else uid
    st = _directory_stat(path)
    if st.st_uid not in (uid, 0):
        raise UnsafePathError(
            f"{path}: belongs to uid {st.st_uid}, who could replace the runs in it; use a workspace of your own"
        )
    if st.st_mode & OTHERS_WRITE:
        sticky = " (the sticky bit stops them renaming what is yours, not adding files of their own)"
        instead = (
            f"use a directory of your own as the profile's workspace (mkdir -m 700 {path}/{_user(uid)}, and "
            f"workspace: {path}/{_user(uid)}), or make this one yours alone (chmod 700 {path})"
            if workspace
            else f"make it owner-only (chmod 700 {path})"
        )
        raise UnsafePathError(
            f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users write in it"
            f"{sticky if st.st_mode & stat.S_ISVTX else ''}: they could plant files ddslurm reads there, or rename "
            f"or replace the runs in it; {instead}"
        )


def check_workspace(workspace: Path, *, uid: int | None = None) -> None:
    """The workspace and its ``runs/`` are directories only ``uid`` (or root) can write (:func:`check_not_swappable`),
    whatever their sticky bit; what does not exist yet is not judged (submit makes it owner-only). ``doctor``,
    ``submit`` and its dry run check this before they read anything in the workspace."""
    for path in (workspace, workspace / "runs"):
        if os.path.lexists(path):
            check_not_swappable(path, uid=uid, workspace=path == workspace)


def check_run_tree(run_dir: Path, *, uid: int | None = None) -> None:
    """A run directory (``<workspace>/runs/<run_id>``) that only its owner can change: the run directory is
    owner-only and neither ``runs/`` nor the workspace lets another user rename it aside and put another in its
    place. Every launcher command and every runtime step checks this before it reads a plan."""
    check_private_dir(run_dir, uid=uid)
    check_not_swappable(run_dir.parent, uid=uid)
    check_not_swappable(run_dir.parent.parent, uid=uid, workspace=True)


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


def file_problem(st: os.stat_result, *, own: bool = False, uid: int | None = None) -> str | None:
    """What makes the entry ``st`` describes no file to read, in words; None when it is a regular file (with
    ``own``: one that belongs to ``uid``, by default the effective uid, and that no other user can write)."""
    if not stat.S_ISREG(st.st_mode):
        return f"is {_KINDS.get(stat.S_IFMT(st.st_mode), 'not a regular file')}, not a regular file"
    if own:
        uid = os.geteuid() if uid is None else uid
        if st.st_uid != uid:
            return f"belongs to uid {st.st_uid}, not to this user (uid {uid})"
        if st.st_mode & OTHERS_WRITE:
            return f"mode {stat.S_IMODE(st.st_mode):04o} lets other users change it"
    return None


def open_regular(
    path: Path, flags: int = os.O_RDONLY, *, own: bool = False, uid: int | None = None, mode: int = PRIVATE_FILE
) -> int:
    """A descriptor of the regular file at ``path`` (``flags``: how it is opened, ``O_CREAT`` with ``mode``),
    opened without following a symbolic link and without blocking, so that a FIFO or a device in its place never
    stalls the open; then judged by what it is (``fstat``, not the name): anything but a regular file is refused
    (:class:`UnsafePathError`). ``own``: the file must also belong to ``uid`` (by default the effective uid) and be
    writable by no other user, and a symbolic link in its place is an :class:`UnsafePathError` too (without
    ``own`` it is ``OSError`` ``ELOOP``). A missing file is ``FileNotFoundError``."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if own and exc.errno == errno.ELOOP and path.is_symlink():
            raise UnsafePathError(f"{path}: is a symbolic link, not a regular file") from None
        raise
    try:
        problem = file_problem(os.fstat(fd), own=own, uid=uid)
        if problem is not None:
            raise UnsafePathError(f"{path}: {problem}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, *, own: bool = False) -> bytes:
    """Read a regular file without following a symbolic link at ``path`` and without blocking on a FIFO in its
    place (:func:`open_regular`; ``own``: only a file of this user's that no other user can write)."""
    fd = open_regular(path, own=own)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


LOCK_WAIT_S = 30.0
"""How long :func:`exclusive_lock` waits for another holder of a lock by default."""
_LOCK_RETRY_S = 0.05


def proc_locks(st: os.stat_result) -> list[list[str]]:
    """The lines of ``/proc/locks`` about the file ``st`` describes, split into fields (a lock held:
    ``1: FLOCK ADVISORY WRITE <pid> <dev:inode> 0 EOF``; a request waiting for it: ``1: -> FLOCK ...``); none when
    it cannot be read."""
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    found = [line.split() for line in lines]
    return [p for p in found if len(p) > 6 and (p[5] == inode if p[1] != "->" else p[6] == inode)]


def lock_holder(fd: int) -> str:
    """Who holds a ``flock`` on the file of ``fd``, as ``/proc/locks`` tells it (``process 123 of uid 1000``); ""
    when it does not say."""
    for parts in proc_locks(os.fstat(fd)):
        if parts[1] != "FLOCK":
            continue
        pid = parts[4]
        try:
            return f"process {pid} of uid {(Path('/proc') / pid).stat().st_uid}"
        except OSError:
            return f"process {pid}"
    return ""


@contextlib.contextmanager
def exclusive_lock(path: Path, *, wait_s: float | None = LOCK_WAIT_S) -> Iterator[None]:
    """An exclusive ``flock`` on the lock file ``path``, held until the block ends: the one lock helper of every
    package. The file is made owner-only if missing; one that is not this user's own regular file is refused, never
    followed or trusted (:func:`open_regular`). It is opened for writing: over NFS ``flock`` is a byte-range lock on
    the whole file, which an exclusive lock takes only on a descriptor open for writing (flock(2), NFS details).

    ``wait_s``: how long another holder is waited for. A number: at most that many seconds, then a
    :class:`LockHeldError` that names the file, who holds it when that can be told, and what to do; 0 tries once
    (a caller that refuses a second one at once, a second submitter of a run, turns the error into its own
    message). None: as long as it takes (the hosted key budget, whose every client must settle its share)."""
    fd = open_regular(path, os.O_RDWR | os.O_CREAT, own=True)
    try:
        if wait_s is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            _lock_within(fd, path, wait_s)
        yield
    finally:
        os.close(fd)


def _lock_within(fd: int, path: Path, wait_s: float) -> None:
    """Take the lock of ``fd`` within ``wait_s`` seconds (one try at 0), or raise :class:`LockHeldError`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                holder = lock_holder(fd)
                by = f"{holder} holds it" if holder else "another process holds it"
                end = f" (kill {holder.split()[1]})" if holder else ""
                raise LockHeldError(
                    path,
                    holder,
                    f"{path}: still locked after {wait_s:g} s: {by} (another ddslurm recording in the same "
                    f"workspace, or one that hangs); wait for it to end, or end it{end}, and try again",
                ) from None
            time.sleep(min(_LOCK_RETRY_S, left))


def read_tail(path: Path, lines: int = 20, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a log file, reading at most ``max_bytes``; "" if it cannot be read."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
