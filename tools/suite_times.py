#!/usr/bin/env python3
"""Where the suite's time goes.

``tools/suite_times.py run -- CMD...`` runs CMD and, when it ends, prints one line: its wall time, the CPU-seconds
of CMD and every process it waited for, and the CPU-seconds the whole machine spent meanwhile (``/proc/stat``: the
Slurm jobs that slurmd starts are not CMD's children, so only this counts them). It exits with CMD's code.

``tools/suite_times.py report [--file F] [--top N]`` reads the durations that ``tools/pytest_times.py`` wrote
(``.test-times/durations.jsonl`` by default) and prints the N slowest tests, the N costliest in CPU-seconds (the
submit side's: the test's process and what it waited for), then the seconds by marker and by file.

``tools/suite_times.py slurm [--window-file F] [--top N]`` splits what the Slurm jobs spent during the last ``run``
(its start and end, which ``run`` writes to ``.test-times/window.json``), from Slurm's own accounting (``sacct``'s
``TotalCPU`` of every step): the CPU-seconds by kind of step (the clients, the controllers' batch steps, the model
servers, the proxies, the collections) and the N tests whose jobs spent the most (a job's working directory names its
test: ``/tmp/pytest-of-*/pytest-*/popen-gw*/<test>/``).

``tools/suite_times.py last [--window-file F]`` prints again the line the last ``run`` printed at its end (CI's
summary ends with it). Standard library only: it runs before and without the
workspace's environment."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

DEFAULT_FILE = Path(".test-times/durations.jsonl")
DEFAULT_WINDOW = Path(".test-times/window.json")
SACCT_FORMAT = "JobID,JobName,State,TotalCPU,WorkDir%400"
NO_MARKER = "(no marker)"


def machine_cpu_s() -> float:
    """CPU-seconds every core of the machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(argv: Sequence[str], label: str, window: Path | None = None) -> int:
    start_wall, start_machine, started = time.monotonic(), machine_cpu_s(), _now()
    code = subprocess.call(list(argv))
    wall = time.monotonic() - start_wall
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine = machine_cpu_s() - start_machine
    line = (
        f"{label}: {wall:.0f} s wall, {usage.ru_utime + usage.ru_stime:.0f} CPU-s in its processes, "
        f"{machine:.0f} CPU-s on the machine (Slurm's jobs included), {os.cpu_count()} cores; exit {code}"
    )
    if window is not None:  # for ``slurm`` (what the jobs of this window spent) and ``last``
        window.parent.mkdir(parents=True, exist_ok=True)
        window.write_text(json.dumps({"label": label, "start": started, "end": _now(), "summary": line}) + "\n")
    print(line, flush=True)
    return code


def _now() -> str:
    """The local time to the second, as ``sacct -S``/``-E`` read it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class SlurmStep:
    job: str
    name: str
    state: str
    cpu_s: float
    workdir: str
    job_name: str = ""


def sacct_seconds(text: str) -> float:
    """``TotalCPU`` as sacct prints it (``[D-][HH:]MM:SS[.mmm]``) in seconds."""
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        days = int(head)
    parts = [float(p) for p in text.split(":")] if text else [0.0]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    hours, minutes, seconds = parts[-3:]
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def parse_sacct(text: str) -> list[SlurmStep]:
    """The steps (``JOB.STEP``, ``JOB.batch``) of ``sacct -P --noheader --format=SACCT_FORMAT`` output, each with its
    job's name and working directory (a step has none of its own)."""
    jobs: dict[str, tuple[str, str]] = {}  # job id: its name and working directory
    rows: list[tuple[str, str, str, str]] = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 5:
            continue
        job_id, name, state, cpu, workdir = fields
        job, _, step = job_id.partition(".")
        if not step:
            jobs[job] = (name, workdir)
        elif step != "extern":
            rows.append((job, name, state, cpu))
    steps = []
    for job, name, state, cpu in rows:
        job_name, workdir = jobs.get(job, ("", ""))
        steps.append(SlurmStep(job, name, state.split()[0] if state else "", sacct_seconds(cpu), workdir, job_name))
    return steps


STEP_KINDS = (("client", "clients"), ("batch", "controllers (batch steps)"), ("server-", "model servers"),
              ("proxy-", "proxies"))  # fmt: skip


def step_kind(step: SlurmStep) -> str:
    """What a step of ddslurm's is, by its name (``client``, ``client-3``, ``batch``, ``server-m-0``, ...); a
    collection job's (``ddslurm-collect-*``) are the collections."""
    if step.job_name.startswith("ddslurm-collect"):
        return "collections"
    return next((kind for prefix, kind in STEP_KINDS if step.name.startswith(prefix)), "other steps")


def step_test(workdir: str) -> str:
    """The test a job ran for, from its working directory (``.../popen-gw3/<test>/...``); else the directory."""
    parts = Path(workdir).parts
    for i, part in enumerate(parts[:-1]):
        if part.startswith("popen-gw"):
            return parts[i + 1]
    return workdir or "(no working directory)"


def slurm_report(steps: list[SlurmStep], window: dict[str, str], top: int, out: TextIO) -> None:
    total = sum(s.cpu_s for s in steps)
    jobs = len({s.job for s in steps})
    print(
        f"{len(steps)} steps of {jobs} jobs spent {total:.0f} CPU-seconds (sacct's TotalCPU) during "
        f"{window.get('label', 'the run')}, {window['start']} to {window['end']}",
        file=out,
    )
    by_kind: dict[str, list[SlurmStep]] = defaultdict(list)
    by_test: dict[str, list[SlurmStep]] = defaultdict(list)
    for step in steps:
        by_kind[step_kind(step)].append(step)
        by_test[step_test(step.workdir)].append(step)
    print("\nCPU-seconds by kind of step:", file=out)
    for kind, group in sorted(by_kind.items(), key=lambda kv: -sum(s.cpu_s for s in kv[1])):
        cpu = sum(s.cpu_s for s in group)
        print(f"  {cpu:8.1f} CPU-s  {len(group):5d} steps  {cpu / len(group):5.2f} each  {kind}", file=out)
    print(f"\nthe {min(top, len(by_test))} tests whose jobs spent the most:", file=out)
    for test, group in sorted(by_test.items(), key=lambda kv: -sum(s.cpu_s for s in kv[1]))[:top]:
        clients = [s for s in group if step_kind(s) == "clients"]
        print(
            f"  {sum(s.cpu_s for s in group):8.1f} CPU-s  {len(clients):3d} clients  {len(group):4d} steps  {test}",
            file=out,
        )


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
    run_p.add_argument("--window-file", type=Path, default=None, help="write the run's start and end here")
    run_p.add_argument("argv", nargs=argparse.REMAINDER)
    rep = sub.add_parser("report", help="the slowest tests, seconds by marker and by file")
    rep.add_argument("--file", type=Path, default=DEFAULT_FILE)
    rep.add_argument("--top", type=int, default=30)
    slurm = sub.add_parser("slurm", help="what the Slurm jobs of the last run spent, by kind of step and by test")
    slurm.add_argument("--window-file", type=Path, default=DEFAULT_WINDOW)
    slurm.add_argument("--top", type=int, default=15)
    last = sub.add_parser("last", help="the line the last run printed at its end (CI prints it in its summary)")
    last.add_argument("--window-file", type=Path, default=DEFAULT_WINDOW)
    args = parser.parse_args(argv)
    if args.command == "run":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("run: no command given (tools/suite_times.py run -- CMD ...)")
        return run(command, args.label, args.window_file)
    if args.command == "slurm":
        return _slurm(args.window_file, args.top)
    if args.command == "last":
        return _last(args.window_file)
    if not args.file.exists():
        print(f"{args.file}: no durations recorded yet (make test writes them)", file=sys.stderr)
        return 1
    return _printed(lambda: report(args.file, args.top, sys.stdout))


def _printed(write: Callable[[], None]) -> int:
    """Run ``write`` (it prints to stdout); a reader that closed the pipe (``| head``) ends it quietly."""
    try:
        write()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _recorded_window(window_file: Path) -> dict[str, str] | None:
    """What the last ``run`` recorded (its label, start, end and last line); None, said on stderr, before any."""
    if not window_file.exists():
        print(f"{window_file}: no run recorded yet (make test writes it)", file=sys.stderr)
        return None
    window: dict[str, str] = json.loads(window_file.read_text())
    return window


def _last(window_file: Path) -> int:
    window = _recorded_window(window_file)
    if window is None:
        return 1
    print(window.get("summary") or f"{window.get('label', 'the run')}: ended at {window['end']} (no summary kept)")
    return 0


def _slurm(window_file: Path, top: int) -> int:
    window = _recorded_window(window_file)
    if window is None:
        return 1
    command = ["sacct", "-a", "-S", window["start"], "-E", window["end"], "-P", "--noheader"]
    command.append(f"--format={SACCT_FORMAT}")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"sacct could not be asked: {exc}", file=sys.stderr)
        return 1
    if done.returncode != 0:
        print(f"sacct failed (exit {done.returncode}): {done.stderr.strip()}", file=sys.stderr)
        return 1
    return _printed(lambda: slurm_report(parse_sacct(done.stdout), window, top, sys.stdout))


if __name__ == "__main__":
    sys.exit(main())
