"""Safe file primitives: atomic writes, write-once publication, private directories, hashing.

Nothing here follows a symbolic link at the final path component, and nothing replaces a file that must be
written once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ddslurm.config.errors import UnsafePathError

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


def check_not_swappable(path: Path, *, uid: int | None = None) -> None:
    """Nobody but ``uid`` (or root) can rename or replace what is inside directory ``path``: it is owned by them
    and writable by no one else, unless its sticky bit is set (then others cannot rename what they do not own)."""
    uid = os.getuid() if uid is None else uid
    st = _directory_stat(path)
    if st.st_uid not in (uid, 0):
        raise UnsafePathError(
            f"{path}: belongs to uid {st.st_uid}, who could replace the runs in it; use a workspace of your own"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(
            f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users rename or replace the runs in it; "
            f"make it owner-only (chmod 700 {path}) or set its sticky bit (chmod +t {path})"
        )


def check_run_tree(run_dir: Path, *, uid: int | None = None) -> None:
    """A run directory (``<workspace>/runs/<run_id>``) that only its owner can change: the run directory is
    owner-only and neither ``runs/`` nor the workspace lets another user rename it aside and put another in its
    place. Every launcher command and every runtime step checks this before it reads a plan."""
    check_private_dir(run_dir, uid=uid)
    for parent in (run_dir.parent, run_dir.parent.parent):
        check_not_swappable(parent, uid=uid)


def read_regular(path: Path) -> bytes:
    """Read a regular file without following a symbolic link at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


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
