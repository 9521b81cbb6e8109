"""``ddslurm-plan RUN_DIR``: print a run's compiled plan and its hash."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddslurm.config import ConfigError, RunLayout, digest, encode_pretty, read_plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddslurm-plan", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    layout = RunLayout(args.run_dir)
    try:
        plan = read_plan(layout.plan)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(encode_pretty(plan))
    print(f"plan sha256: {digest(plan)}", file=sys.stderr)
    return 0
