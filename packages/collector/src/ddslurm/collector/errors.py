"""Errors of the collector.

CollectError                root (a DdslurmError): the dataset cannot be collected; nothing was published
├── MissingWinnersError     some shards have no published winner yet
├── WinnerUnreadableError   a shard's ``winner.json`` cannot be read or does not describe that shard
├── BatchChangedError       a winner's batch file is missing or differs from what was published (size, sha256)
├── SchemaConflictError     a column has types that cannot be unified without changing values
├── DestinationExistsError  the destination exists and ``overwrite`` was not given
└── OutputWriteError        an output file could not be written (a full disk or quota, an I/O error)
"""

from __future__ import annotations

import errno
from pathlib import Path

from ddslurm.config import DdslurmError


class CollectError(DdslurmError):
    """Root of the errors raised by ddslurm.collector."""


class MissingWinnersError(CollectError):
    def __init__(self, shards: list[int]) -> None:
        self.shards = shards
        listed = ", ".join(str(s) for s in shards[:20]) + (" ..." if len(shards) > 20 else "")
        super().__init__(f"{len(shards)} shard(s) have no published result yet: {listed}")


class WinnerUnreadableError(CollectError):
    def __init__(self, shard: int, path: Path, why: str) -> None:
        self.shard = shard
        self.path = path
        super().__init__(f"shard {shard}: {path}: {why}")


class BatchChangedError(CollectError):
    """``expected``/``actual`` are sha256 digests, or sizes as text (``"123 bytes"``); ``actual`` is None for a
    file that is missing or not a regular file."""

    def __init__(self, shard: int, file: str, location: Path, problem: str, expected: str, actual: str | None) -> None:
        self.shard = shard
        self.file = file
        self.location = location
        self.expected = expected
        self.actual = actual
        super().__init__(f"shard {shard}: {file} {problem} ({location})")


class SchemaConflictError(CollectError):
    def __init__(self, message: str, files: tuple[Path, ...] = ()) -> None:
        self.files = files
        """The files whose types conflict (empty when not known)."""
        super().__init__(message)


class DestinationExistsError(CollectError):
    pass


class OutputWriteError(CollectError):
    """Writing ``path`` failed with ``cause`` (ENOSPC or EDQUOT: the file system or the quota is full); the
    collection removes its staging directory, so nothing was published."""

    def __init__(self, path: Path, cause: OSError) -> None:
        self.path = path
        self.cause = cause
        full = ": the file system or your quota is full" if cause.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        super().__init__(f"cannot write {path}: {cause.strerror or cause}{full}; nothing was published")
