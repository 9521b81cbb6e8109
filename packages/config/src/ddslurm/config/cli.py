"""``ddslurm-config check FILE --kind run|profile``: validate a run file or profile and print it resolved."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddslurm.config._codec import encode_pretty, load_profile, load_run_file
from ddslurm.config.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddslurm-config", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate a file and print it with every default filled in")
    check.add_argument("file", type=Path)
    check.add_argument("--kind", choices=["run", "profile"], default="run")
    args = parser.parse_args(argv)
    try:
        loaded = load_run_file(args.file) if args.kind == "run" else load_profile(args.file)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(encode_pretty(loaded))
    return 0
