"""``ddslurm-providers RUN.yaml [--json] [--check]``: show how each model alias of a run resolves, and what
would stop a submission (never a secret value).

Exit status: 0 when ``ddslurm submit`` would accept the providers (and, with ``--check``, every hosted endpoint
answered and lists its model); 1 when the table shows problems (listed on stderr); 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import msgspec

from ddslurm.config import ConfigError
from ddslurm.providers._capture import describe_run
from ddslurm.providers._check import check_endpoints
from ddslurm.providers._resolve import AliasRow, Resolution
from ddslurm.providers.errors import ProvidersError


def key_text(row: AliasRow) -> str:
    """The API-key cell: the variable's name and whether it is set; never a value."""
    if row.key_literal:
        return "(literal key, not shown)"
    if row.key_env is None:
        return "-"
    if not row.key_set:
        return f"{row.key_env} (UNSET)"
    if row.key_scanned is False:
        return f"{row.key_env} (set; placeholder value, not scanned for)"
    return f"{row.key_env} (set)"


def format_table(rows: Sequence[AliasRow], *, check: bool = False) -> str:
    header: tuple[str, ...] = ("ALIAS", "KIND", "PROVIDER", "ENDPOINT", "MODEL", "API KEY VARIABLE")
    body: list[tuple[str, ...]] = [(r.alias, r.kind, r.provider, r.endpoint, r.model, key_text(r)) for r in rows]
    if check:
        header = (*header, "CHECK")
        body = [(*line, r.check or "-") for line, r in zip(body, rows, strict=True)]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in (header, *body)
    )


def exit_code(resolution: Resolution, *, checked: bool) -> int:
    """0 when nothing would stop a submission and every check passed, else 1."""
    failed_check = checked and any(r.check not in (None, "ok") for r in resolution.rows)
    return 1 if resolution.problems or failed_check else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddslurm-providers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_file", type=Path)
    parser.add_argument("--json", action="store_true", help="print the table and the problems as JSON")
    parser.add_argument(
        "--check",
        action="store_true",
        help="ask every hosted endpoint's /models whether it lists the model and accepts the key (off by default)",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per endpoint for --check")
    args = parser.parse_args(argv)
    try:
        resolution = describe_run(args.run_file, os.environ)
    except (ConfigError, ProvidersError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        resolution = check_endpoints(resolution, os.environ, timeout=args.timeout)
    return print_resolution(resolution, checked=args.check, as_json=args.json, out=sys.stdout, err=sys.stderr)


def print_resolution(resolution: Resolution, *, checked: bool, as_json: bool, out: TextIO, err: TextIO) -> int:
    """Print the table (or its JSON) to ``out`` and the problems to ``err``; return the exit status."""
    if as_json:
        document = {"aliases": list(resolution.rows), "problems": list(resolution.problems)}
        out.write(msgspec.json.encode(document).decode() + "\n")
    else:
        out.write(format_table(resolution.rows, check=checked) + "\n")
    out.flush()
    if resolution.problems:
        lines = "".join(f"  - {p}\n" for p in resolution.problems)
        err.write(f"{len(resolution.problems)} problem(s) would stop `ddslurm submit`:\n{lines}")
        err.flush()
    return exit_code(resolution, checked=checked)
