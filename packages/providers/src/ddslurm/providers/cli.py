"""``ddslurm-providers RUN.yaml``: show how each model alias of a run resolves (never a secret value)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ddslurm.config import ConfigError
from ddslurm.providers._capture import resolve_run
from ddslurm.providers._resolve import AliasRow
from ddslurm.providers.errors import ProvidersError


def format_table(rows: Sequence[AliasRow]) -> str:
    header = ("ALIAS", "KIND", "PROVIDER", "ENDPOINT", "MODEL", "API KEY VARIABLE")
    body = [
        (
            r.alias,
            r.kind,
            r.provider,
            r.endpoint,
            r.model,
            "-" if r.key_env is None else f"{r.key_env} ({'set' if r.key_set else 'UNSET'})",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in (header, *body)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddslurm-providers", description=__doc__)
    parser.add_argument("run_file", type=Path)
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)
    try:
        resolution = resolve_run(args.run_file, os.environ)
    except (ConfigError, ProvidersError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(msgspec.json.encode({"aliases": list(resolution.rows)}).decode())
    else:
        print(format_table(resolution.rows))
    return 0
