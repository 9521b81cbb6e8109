"""Errors of the collector.

CollectError                root: the dataset cannot be collected; nothing was published
├── MissingWinnersError     some shards have no published winner yet
├── WinnerUnreadableError   a shard's ``winner.json`` cannot be read or does not describe that shard
├── BatchChangedError       a winner's batch file is missing or differs from what was published (size, sha256)
├── SchemaConflictError     a column has types that cannot be unified without changing values
└── DestinationExistsError  the destination exists and ``overwrite`` was not given
"""

from __future__ import annotations

from pathlib import Path


class CollectError(Exception):
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
