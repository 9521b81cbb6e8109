"""ddslurm.collector: merges the published shards of a run into one Parquet dataset."""

from ddslurm.collector._merge import (
    MANIFEST,
    CollectResult,
    Manifest,
    collect,
    progress_reporter,
    read_manifest,
    unified_schema,
)
from ddslurm.collector.errors import (
    CollectError,
    DestinationExistsError,
    MissingWinnersError,
    SchemaConflictError,
)

__all__ = [
    "MANIFEST",
    "CollectError",
    "CollectResult",
    "DestinationExistsError",
    "Manifest",
    "MissingWinnersError",
    "SchemaConflictError",
    "collect",
    "progress_reporter",
    "read_manifest",
    "unified_schema",
]
