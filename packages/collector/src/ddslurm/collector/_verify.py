"""A winner's batch files, verified against the size and sha256 recorded at publication while they are read.

The bytes are hashed as they come off the disk and parsed from the same memory afterwards: what is collected is
exactly what was hashed, and no file is read twice.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddslurm.collector.errors import BatchChangedError
from ddslurm.config import FileEntry, WinnerRecord

if TYPE_CHECKING:
    import pyarrow as pa

_CHUNK = 4 << 20  # hash what was just read while it is still in the cache


@dataclass(frozen=True, slots=True)
class Batch:
    """One published batch file of a shard's winner."""

    shard: int
    entry: FileEntry
    path: Path


def batches_of(winner: WinnerRecord, dataset_dir: Path | None = None) -> list[Batch]:
    root = Path(winner.dataset_dir) if dataset_dir is None else dataset_dir
    return [Batch(winner.shard, entry, root / entry.path) for entry in winner.files]


def _changed(batch: Batch, problem: str, expected: str, actual: str | None) -> BatchChangedError:
    return BatchChangedError(batch.shard, batch.entry.path, batch.path, problem, expected, actual)


def _size_changed(batch: Batch, actual: int) -> BatchChangedError:
    return _changed(
        batch,
        f"changed since it was published: size expected {batch.entry.size} bytes, actual {actual} bytes",
        f"{batch.entry.size} bytes",
        f"{actual} bytes",
    )


def _missing(batch: Batch, what: str) -> BatchChangedError:
    published = f"published with {batch.entry.size} bytes, sha256 {batch.entry.sha256}"
    return _changed(batch, f"{what} ({published})", batch.entry.sha256, None)


def check_present(batch: Batch) -> None:
    """Cheap checks before any data is read: the file exists, is a regular file and has its published size."""
    try:
        st = batch.path.lstat()
    except FileNotFoundError:
        raise _missing(batch, "is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise _missing(batch, "is not a regular file any more")
    if st.st_size != batch.entry.size:
        raise _size_changed(batch, st.st_size)


def _open(batch: Batch) -> int:
    try:
        # O_NONBLOCK: opening a FIFO put in the file's place must not hang; no effect on regular files
        return os.open(batch.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _missing(batch, "is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _missing(batch, "is not a regular file any more") from None
        raise _missing(batch, f"cannot be read ({exc.strerror})") from None


def read_verified(batch: Batch, *, keep: bool = True) -> Any:
    """The file's bytes as a ``pyarrow.Buffer`` (``keep``) or None, after checking its size and sha256.

    Raises :class:`BatchChangedError` naming the shard, the file, and the expected and actual values.
    """
    size = batch.entry.size
    fd = _open(batch)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _missing(batch, "is not a regular file any more")
        if st.st_size != size:
            raise _size_changed(batch, st.st_size)
        digest = hashlib.sha256()
        buffer = _allocate(size) if keep else None
        view = memoryview(buffer if buffer is not None else bytearray(min(size, _CHUNK)))
        done = 0
        while done < size:
            target = view[done : done + _CHUNK] if keep else view[: min(_CHUNK, size - done)]
            got = fh.readinto(target)
            if not got:
                raise _size_changed(batch, done)  # shortened while it was being read
            digest.update(target[:got])
            done += got
        view.release()
    actual = digest.hexdigest()
    if actual != batch.entry.sha256:
        problem = f"changed since it was published: sha256 expected {batch.entry.sha256}, actual {actual}"
        raise _changed(batch, problem, batch.entry.sha256, actual)
    return buffer


def verify_winner(winner: WinnerRecord, dataset_dir: Path | None = None, *, hashes: bool = True) -> list[str]:
    """Problems with a published winner's files (missing, not a regular file, size or sha256 changed); [] if
    every file still is what was published. ``dataset_dir`` defaults to the winner's own ``dataset_dir``.

    Reads every file once, one chunk of memory at a time (sha256 runs at about 2 GB/s); ``hashes=False`` checks
    only presence and sizes, without reading any data (cheap enough for every refresh of a status display)."""
    problems: list[str] = []
    for batch in batches_of(winner, dataset_dir):
        try:
            if hashes:
                read_verified(batch, keep=False)
            else:
                check_present(batch)
        except BatchChangedError as exc:
            problems.append(str(exc))
    return problems


def _allocate(size: int) -> pa.Buffer:
    """A pyarrow buffer of ``size`` bytes (imported here: checking a winner's hashes needs no pyarrow)."""
    import pyarrow as pa

    return pa.allocate_buffer(size)
