"""Safe file primitives: atomic writes, write-once publication, private directories, hashing.

Nothing here follows a symbolic link at the final path component, and nothing replaces a file that must be
written once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from ddslurm.config.errors import UnsafePathError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def _fsync_dir(path: Path) -> None:
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
    _fsync_dir(path.parent)


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
    _fsync_dir(path.parent)
    return True


def make_private_dir(path: Path, *, exist_ok: bool = False) -> None:
    """Create ``path`` (and missing parents) owner-only; refuse a symbolic link in its place."""
    if path.is_symlink():
        raise UnsafePathError(f"{path}: is a symbolic link; refusing to use it as a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:
        if not exist_ok:
            raise UnsafePathError(f"{path}: already exists") from None
        if not path.is_dir():
            raise UnsafePathError(f"{path}: exists and is not a directory") from None


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
