"""``ddslurm-collect RUN_DIR``: merge a run's published shards into one Parquet dataset.

Exit codes: 0 collected, 1 the collection failed, 2 the run directory cannot be read, 128 + N interrupted by
signal N (SIGTERM: 143). Nothing is published unless it exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddslurm.collector._command import collect_command
from ddslurm.config import RunLayout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddslurm-collect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--output", type=Path, default=None, help="destination directory (default RUN_DIR/dataset)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    return collect_command(
        RunLayout(args.run_dir.resolve()),
        destination=args.output,
        overwrite=args.overwrite,
        as_json=args.json,
        out=sys.stdout,
        err=sys.stderr,
    )
