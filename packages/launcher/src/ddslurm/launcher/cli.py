"""``ddslurm``: run Data Designer recipes on Slurm.

    ddslurm submit RUN.yaml --profile PROFILE.yaml   capture inputs, compile the plan, submit the array
    ddslurm providers RUN.yaml                       how each model alias resolves (local or hosted)
    ddslurm status RUN [--json]                      the run and every shard
    ddslurm wait RUN [--json]                        wait until the run ends; exit 0 only if it succeeded
    ddslurm cancel RUN                               cancel the run's jobs
    ddslurm collect RUN [--local] [--json]           merge the shards into one Parquet dataset
    ddslurm list --profile PROFILE.yaml              runs in the workspace

RUN is a run directory or, with --profile (or DDSLURM_PROFILE), a run id in the profile's workspace.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import msgspec

from ddslurm.collector import CollectError, CollectResult
from ddslurm.config import ConfigError, Plan, RunLayout, load_profile, read_json
from ddslurm.launcher._collect import collect_local, collect_with_slurm
from ddslurm.launcher._render import render_generation
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher._status import RunStatus, find_run, run_status, submissions
from ddslurm.launcher._submit import prepare, submit
from ddslurm.launcher.errors import LauncherError
from ddslurm.providers import ProvidersError
from ddslurm.providers.cli import main as providers_main

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
TERMINAL = {"succeeded", "failed", "cancelled"}


def _json(obj: Any, out: TextIO) -> None:
    out.write(msgspec.json.encode(obj).decode() + "\n")


def _workspace(args: argparse.Namespace, env: Mapping[str, str]) -> Path | None:
    profile = getattr(args, "profile", None) or env.get("DDSLURM_PROFILE")
    return Path(load_profile(Path(profile)).workspace) if profile else None


def _format_status(st: RunStatus) -> str:
    lines = [
        f"run {st.run_id}: {st.state}  ({st.records_done}/{st.records_requested} records, "
        + ", ".join(f"{n} {k}" for k, n in sorted(st.counts.items()))
        + ")",
        f"  dir: {st.run_dir}",
        f"  {'SHARD':>5}  {'STATE':<10} {'ROWS':>11}  {'JOB':<10} {'SLURM':<11} REASON",
    ]
    for s in st.shards:
        rows = f"{s.rows if s.rows is not None else '-'}/{s.records}"
        why = f"{s.reason}: {s.message}" if s.reason and s.message else (s.reason or "")
        lines.append(
            f"  {s.shard:>5}  {s.state:<10} {rows:>11}  {s.job_id or '-':<10} {s.slurm_state or '-':<11} {why}"
        )
    return "\n".join(lines)


def cmd_submit(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    if args.dry_run:
        return _dry_run(args, env, out)
    done = submit(args.run_file, args.profile, slurm=slurm, env=env)
    if args.json:
        _json(
            {
                "run_id": done.layout.run_id,
                "run_dir": str(done.layout.root),
                "job_id": done.job_id,
                "shards": len(done.plan.shards),
            },
            out,
        )
    else:
        out.write(
            f"submitted run {done.layout.run_id}: array job {done.job_id}, {len(done.plan.shards)} shard(s), "
            f"{done.plan.num_records} records\n  run dir: {done.layout.root}\n"
            f"  next: ddslurm wait {done.layout.root}\n"
        )
    return EXIT_OK


def _dry_run(args: argparse.Namespace, env: Mapping[str, str], out: TextIO) -> int:
    """Validate and compile everything and show what would be submitted; write nothing, submit nothing."""
    prepared = prepare(args.run_file, args.profile, env, datetime.now(UTC))
    script = render_generation(prepared.plan, prepared.layout, [s.index for s in prepared.plan.shards])
    if args.json:
        _json({"plan": prepared.plan, "script": script, "aliases": list(prepared.aliases)}, out)
    else:
        out.write(f"# dry run: nothing was written or submitted\n# run dir would be {prepared.layout.root}\n")
        out.write(f"# sbatch --export={','.join(prepared.plan.secret_env) or 'NONE'} (values stay in your shell)\n")
        out.write(script)
    return EXIT_OK


def cmd_status(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    layout = find_run(args.run, _workspace(args, env))
    st = run_status(layout, slurm)
    if args.json:
        _json(st, out)
    else:
        out.write(_format_status(st) + "\n")
    return EXIT_OK


def cmd_wait(
    args: argparse.Namespace,
    slurm: Slurm,
    env: Mapping[str, str],
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    layout = find_run(args.run, _workspace(args, env))
    start = time.monotonic()
    delay, last = 1.0, ""
    while True:
        st = run_status(layout, slurm)
        line = f"{st.state}: {st.records_done}/{st.records_requested} records, " + ", ".join(
            f"{n} {k}" for k, n in sorted(st.counts.items())
        )
        if line != last and not args.json:
            print(f"[{time.monotonic() - start:6.1f}s] {line}", file=sys.stderr)
            last = line
        if st.state in TERMINAL:
            break
        if args.timeout is not None and time.monotonic() - start > args.timeout:
            if args.json:
                _json(st, out)
            print(f"error: run still {st.state} after {args.timeout:.0f} s", file=sys.stderr)
            return EXIT_TIMEOUT
        sleep(delay)
        delay = min(delay * 1.3, 5.0)
    if args.json:
        _json(st, out)
    else:
        out.write(_format_status(st) + "\n")
    return EXIT_OK if st.state == "succeeded" else EXIT_RUN_FAILED


def cmd_cancel(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    layout = find_run(args.run, _workspace(args, env))
    ids = [s.array_job_id for s in submissions(layout)]
    slurm.scancel(ids)
    out.write(f"cancelled job(s) {', '.join(ids) or '(none)'} of run {layout.run_id}\n")
    return EXIT_OK


def cmd_collect(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    layout = find_run(args.run, _workspace(args, env))
    result: CollectResult = (
        collect_local(layout, overwrite=args.overwrite)
        if args.local
        else collect_with_slurm(layout, slurm, overwrite=args.overwrite)
    )
    if args.json:
        _json(
            {
                "dataset": str(result.dataset),
                "rows": result.rows,
                "files": [str(f) for f in result.files],
                "manifest": str(result.manifest),
            },
            out,
        )
    else:
        out.write(f"collected {result.rows} rows into {result.dataset}\n")
    return EXIT_OK


def cmd_list(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    workspace = _workspace(args, env)
    if workspace is None:
        raise LauncherError("list needs --profile (or DDSLURM_PROFILE) to find the workspace")
    rows = []
    for plan_path in sorted((workspace / "runs").glob("*/run.json")):
        layout = RunLayout(plan_path.parent)
        plan = read_json(plan_path, Plan)
        rows.append(
            {
                "run_id": layout.run_id,
                "name": plan.run_name,
                "state": run_status(layout, slurm).state,
                "records": plan.num_records,
                "run_dir": str(layout.root),
            }
        )
    if args.json:
        _json(rows, out)
    else:
        for r in rows:
            out.write(f"{r['run_id']:<48} {r['state']:<10} {r['records']:>8}  {r['run_dir']}\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddslurm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="submit a run")
    p.add_argument("run_file", type=Path)
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan and script; submit nothing")
    p = sub.add_parser("providers", help="show how the run's model aliases resolve")
    p.add_argument("run_file", type=Path)
    p.add_argument("--json", action="store_true")
    for name, help_text in (
        ("status", "show a run"),
        ("wait", "wait for a run to end"),
        ("cancel", "cancel a run"),
        ("collect", "merge a run's shards"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("run")
        p.add_argument("--profile", type=Path, default=None)
        if name != "cancel":
            p.add_argument("--json", action="store_true")
        if name == "wait":
            p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
        if name == "collect":
            p.add_argument("--local", action="store_true", help="collect in this process instead of a Slurm job")
            p.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    p = sub.add_parser("list", help="list runs in the workspace")
    p.add_argument("--profile", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    return parser


COMMANDS = {
    "submit": cmd_submit,
    "status": cmd_status,
    "wait": cmd_wait,
    "cancel": cmd_cancel,
    "collect": cmd_collect,
    "list": cmd_list,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "providers":
        return providers_main([str(args.run_file), *(["--json"] if args.json else [])])
    env = os.environ
    try:
        return COMMANDS[args.command](args, Slurm(env=env), env, sys.stdout)
    except (ConfigError, ProvidersError, CollectError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if args.command == "submit" else EXIT_RUN_FAILED
    except KeyboardInterrupt:
        return 130
