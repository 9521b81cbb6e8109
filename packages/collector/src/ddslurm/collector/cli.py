"""``ddslurm-collect RUN_DIR``: merge a run's published shards into one Parquet dataset."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

import msgspec

from ddslurm.collector._merge import collect, progress_reporter
from ddslurm.collector.errors import CollectError
from ddslurm.config import ConfigError, RunLayout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddslurm-collect", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--output", type=Path, default=None, help="destination directory (default RUN_DIR/dataset)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    def on_term(signum: int, _: FrameType | None) -> None:
        # Unwind like Ctrl-C so the half-written staging directory is removed and nothing is published.
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)

    try:
        result = collect(
            RunLayout(args.run_dir.resolve()),
            destination=args.output,
            overwrite=args.overwrite,
            progress=progress_reporter(sys.stderr),
        )
    except (CollectError, ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out = {
            "dataset": str(result.dataset),
            "rows": result.rows,
            "files": [str(f) for f in result.files],
            "manifest": str(result.manifest),
        }
        print(msgspec.json.encode(out).decode())
    else:
        print(f"collected {result.rows} rows into {result.dataset}")
    return 0
