"""Errors of the collector.

CollectError             root: the dataset cannot be collected; nothing was published
├── MissingWinnersError  some shards have no published winner yet
├── SchemaConflictError  a column has types that cannot be unified without changing values
└── DestinationExistsError  the destination exists and ``overwrite`` was not given
"""

from __future__ import annotations


class CollectError(Exception):
    """Root of the errors raised by ddslurm.collector."""


class MissingWinnersError(CollectError):
    def __init__(self, shards: list[int]) -> None:
        self.shards = shards
        listed = ", ".join(str(s) for s in shards[:20]) + (" ..." if len(shards) > 20 else "")
        super().__init__(f"{len(shards)} shard(s) have no published result yet: {listed}")


class SchemaConflictError(CollectError):
    pass


class DestinationExistsError(CollectError):
    pass
