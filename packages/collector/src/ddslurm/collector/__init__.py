"""ddslurm.collector: merges the published shards of a run into one Parquet dataset."""

from ddslurm.collector._command import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGNAL_BASE,
    EXIT_UNREADABLE,
    collect_command,
    print_result,
    result_json,
    sigterm_unwinds,
)
from ddslurm.collector._merge import (
    MANIFEST,
    MANIFEST_VERSION,
    CollectResult,
    Manifest,
    SchemaField,
    ShardEntry,
    collect,
    manifest_schema,
    preflight,
    progress_reporter,
    read_manifest,
)
from ddslurm.collector._schema import unified_schema
from ddslurm.collector._verify import verify_winner
from ddslurm.collector._writer import ROW_GROUP_BYTES, ROW_GROUP_ROWS, TARGET_FILE_BYTES
from ddslurm.collector.errors import (
    BatchChangedError,
    CollectError,
    DestinationExistsError,
    MissingWinnersError,
    SchemaConflictError,
    WinnerUnreadableError,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGNAL_BASE",
    "EXIT_UNREADABLE",
    "MANIFEST",
    "MANIFEST_VERSION",
    "ROW_GROUP_BYTES",
    "ROW_GROUP_ROWS",
    "TARGET_FILE_BYTES",
    "BatchChangedError",
    "CollectError",
    "CollectResult",
    "DestinationExistsError",
    "Manifest",
    "SchemaField",
    "ShardEntry",
    "MissingWinnersError",
    "SchemaConflictError",
    "WinnerUnreadableError",
    "collect",
    "collect_command",
    "manifest_schema",
    "preflight",
    "print_result",
    "progress_reporter",
    "read_manifest",
    "result_json",
    "sigterm_unwinds",
    "unified_schema",
    "verify_winner",
]
