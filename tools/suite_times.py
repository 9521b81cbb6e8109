#!/usr/bin/env python3
"""Where the suite's time goes.

``tools/suite_times.py run -- CMD...`` runs CMD and, when it ends, prints one line: its wall time, the CPU-seconds
of CMD and every process it waited for, and the CPU-seconds the whole machine spent meanwhile (``/proc/stat``: the
Slurm jobs that slurmd starts are not CMD's children, so only this counts them). It exits with CMD's code.

``tools/suite_times.py report [--file F] [--top N]`` reads the durations that ``tools/pytest_times.py`` wrote
(``.test-times/durations.jsonl`` by default) and prints the N slowest tests, the N costliest in CPU-seconds (the
submit side's: the test's process and what it waited for), then the seconds by marker and by file. Standard library
only: it runs before and without the workspace's environment."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

DEFAULT_FILE = Path(".test-times/durations.jsonl")
NO_MARKER = "(no marker)"


def machine_cpu_s() -> float:
    """CPU-seconds every core of the machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(argv: Sequence[str], label: str) -> int:
    start_wall, start_machine = time.monotonic(), machine_cpu_s()
    code = subprocess.call(list(argv))
    wall = time.monotonic() - start_wall
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine = machine_cpu_s() - start_machine
    print(
        f"{label}: {wall:.0f} s wall, {usage.ru_utime + usage.ru_stime:.0f} CPU-s in its processes, "
        f"{machine:.0f} CPU-s on the machine (Slurm's jobs included), {os.cpu_count()} cores; exit {code}",
        flush=True,
    )
    return code


@dataclass(frozen=True)
class TestTime:
    test: str
    file: str
    markers: tuple[str, ...]
    outcome: str
    s: float
    cpu_s: float


def load(path: Path) -> list[TestTime]:
    tests = []
    for line in path.read_text().splitlines():
        if line.strip():
            raw = json.loads(line)
            cpu = float(raw.get("cpu_s", 0.0))  # a file written before CPU was kept has none
            tests.append(
                TestTime(raw["test"], raw["file"], tuple(raw["markers"]), raw["outcome"], float(raw["s"]), cpu)
            )
    return tests


def report(path: Path, top: int, out: TextIO) -> None:
    tests = sorted(load(path), key=lambda t: -t.s)
    print(
        f"{len(tests)} tests, {sum(t.s for t in tests):.0f} test-seconds (summed over the workers) and "
        f"{sum(t.cpu_s for t in tests):.0f} CPU-seconds on the submit side (Slurm's jobs not included) in {path}",
        file=out,
    )
    print(f"\nthe {min(top, len(tests))} slowest tests:", file=out)
    for t in tests[:top]:
        print(f"  {t.s:8.1f} s  {t.cpu_s:7.1f} CPU-s  {t.outcome:<7} {t.test}", file=out)
    print(f"\nthe {min(top, len(tests))} costliest tests in CPU-seconds:", file=out)
    for t in sorted(tests, key=lambda t: -t.cpu_s)[:top]:
        print(f"  {t.cpu_s:7.1f} CPU-s  {t.s:8.1f} s  {t.test}", file=out)
    by_marker: dict[str, list[TestTime]] = defaultdict(list)
    by_file: dict[str, list[TestTime]] = defaultdict(list)
    for t in tests:
        for marker in t.markers or (NO_MARKER,):
            by_marker[marker].append(t)
        by_file[t.file].append(t)
    print("\nseconds by marker (a test with two markers counts under both):", file=out)
    for marker, group in sorted(by_marker.items(), key=lambda kv: -sum(t.s for t in kv[1])):
        print(_sums(group, marker), file=out)
    print(f"\nseconds by file (the {min(top, len(by_file))} costliest of {len(by_file)}):", file=out)
    for file, group in sorted(by_file.items(), key=lambda kv: -sum(t.s for t in kv[1]))[:top]:
        print(_sums(group, file), file=out)


def _sums(group: list[TestTime], name: str) -> str:
    seconds, cpu = sum(t.s for t in group), sum(t.cpu_s for t in group)
    return f"  {seconds:8.1f} s  {cpu:7.1f} CPU-s  {len(group):5d} tests  {name}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/suite_times.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run a command and print its wall time and CPU-seconds")
    run_p.add_argument("--label", default="make test")
    run_p.add_argument("argv", nargs=argparse.REMAINDER)
    rep = sub.add_parser("report", help="the slowest tests, seconds by marker and by file")
    rep.add_argument("--file", type=Path, default=DEFAULT_FILE)
    rep.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    if args.command == "run":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("run: no command given (tools/suite_times.py run -- CMD ...)")
        return run(command, args.label)
    if not args.file.exists():
        print(f"{args.file}: no durations recorded yet (make test writes them)", file=sys.stderr)
        return 1
    try:
        report(args.file, args.top, sys.stdout)
    except BrokenPipeError:  # a reader that closed the pipe (| head): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
