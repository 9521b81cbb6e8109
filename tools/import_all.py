#!/usr/bin/env python3
"""Import every module of a package and run its console scripts' ``--help``: the proof that a distribution works
with only its declared dependencies installed (``make test-isolated`` runs it in an environment holding just that).

``python tools/import_all.py ddslurm.config ddslurm-config`` imports ``ddslurm.config`` and each of its modules,
then runs each console script the distribution ``ddslurm-config`` declares with ``--help``; it prints one line
and exits 1 naming each module that did not import and each script that failed. Standard library only."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import shutil
import subprocess
import sys
import traceback
from collections.abc import Sequence


def import_every_module(package: str) -> tuple[int, list[str]]:
    """How many modules of ``package`` imported, and one line for each that did not."""
    failed: list[str] = []
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            last = traceback.format_exc().strip().splitlines()[-1]
            failed.append(f"{name}: {last}")
    return len(names) - len(failed), failed


def console_scripts(distribution: str) -> list[str]:
    points = importlib.metadata.distribution(distribution).entry_points
    return sorted(ep.name for ep in points if ep.group == "console_scripts")


def run_help(script: str) -> str | None:
    """None when ``script --help`` exits 0; else why not."""
    found = shutil.which(script)
    if found is None:
        return f"{script}: not on PATH"
    done = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        return f"{script} --help: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: tools/import_all.py PACKAGE DISTRIBUTION", file=sys.stderr)
        return 2
    package, distribution = args
    imported, failed = import_every_module(package)
    scripts = console_scripts(distribution)
    failed += [problem for script in scripts if (problem := run_help(script)) is not None]
    print(f"{distribution}: {imported} modules of {package} imported, {len(scripts)} console script(s) answered --help")
    for line in failed:
        print(f"  FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
