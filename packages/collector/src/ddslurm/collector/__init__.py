"""ddslurm.collector: merges the published shards of a run into one Parquet dataset.

The names below are imported when first used (as Data Designer's own packages do): a caller that only checks a
winner's files (``verify_winner``, the launcher's ``status``) does not pay for pyarrow's Parquet code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddslurm.config import lazy_exports

if TYPE_CHECKING:
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
    from ddslurm.collector._manifest import (
        MANIFEST,
        MANIFEST_VERSION,
        Manifest,
        SchemaField,
        ShardEntry,
        read_manifest,
    )
    from ddslurm.collector._merge import (
        CollectResult,
        collect,
        manifest_schema,
        preflight,
        progress_reporter,
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

_LAZY_IMPORTS: dict[str, str] = {
    "BatchChangedError": "ddslurm.collector.errors",
    "CollectError": "ddslurm.collector.errors",
    "CollectResult": "ddslurm.collector._merge",
    "DestinationExistsError": "ddslurm.collector.errors",
    "EXIT_FAILED": "ddslurm.collector._command",
    "EXIT_OK": "ddslurm.collector._command",
    "EXIT_SIGNAL_BASE": "ddslurm.collector._command",
    "EXIT_UNREADABLE": "ddslurm.collector._command",
    "MANIFEST": "ddslurm.collector._manifest",
    "MANIFEST_VERSION": "ddslurm.collector._manifest",
    "Manifest": "ddslurm.collector._manifest",
    "MissingWinnersError": "ddslurm.collector.errors",
    "ROW_GROUP_BYTES": "ddslurm.collector._writer",
    "ROW_GROUP_ROWS": "ddslurm.collector._writer",
    "SchemaConflictError": "ddslurm.collector.errors",
    "SchemaField": "ddslurm.collector._manifest",
    "ShardEntry": "ddslurm.collector._manifest",
    "TARGET_FILE_BYTES": "ddslurm.collector._writer",
    "WinnerUnreadableError": "ddslurm.collector.errors",
    "collect": "ddslurm.collector._merge",
    "collect_command": "ddslurm.collector._command",
    "manifest_schema": "ddslurm.collector._merge",
    "preflight": "ddslurm.collector._merge",
    "print_result": "ddslurm.collector._command",
    "progress_reporter": "ddslurm.collector._merge",
    "read_manifest": "ddslurm.collector._manifest",
    "result_json": "ddslurm.collector._command",
    "sigterm_unwinds": "ddslurm.collector._command",
    "unified_schema": "ddslurm.collector._schema",
    "verify_winner": "ddslurm.collector._verify",
}

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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY_IMPORTS, __all__)
