"""``ddslurm``: run Data Designer recipes on Slurm.

    ddslurm submit RUN.yaml --profile PROFILE.yaml   capture inputs, compile the plan, submit the arrays
                                [--dry-run]          show the arrays and the limits they fit in; submit nothing
    ddslurm submit --continue RUN                    submit the arrays a stopped submission did not submit
    ddslurm providers RUN.yaml [--check]             how each model alias resolves; --check asks hosted endpoints
    ddslurm status RUN [--json] [--watch]            the run and every shard
    ddslurm wait RUN [--json]                        wait until the run ends; exit 0 only if it succeeded
    ddslurm cancel RUN [--shards 1,3]                cancel the whole run (every array) or the shards' tasks
    ddslurm retry RUN [--shards 1,3] [--fresh]       new attempts for shards without a winner (resuming);
                      [--resume-cancelled]           a run cancelled as a whole needs this flag
    ddslurm accept-partial RUN --shards 1,3          publish short shards' results as their winners
    ddslurm logs RUN [--shard N] [--step S] [-f]     a step's log of a shard's latest attempt
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

from ddslurm.collector import CollectError, collect_command
from ddslurm.config import ConfigError, PlannedArray, RunLayout, load_profile, read_plan
from ddslurm.launcher._collect import collect_job_command
from ddslurm.launcher._render import compact_ranges, render_generation
from ddslurm.launcher._slurm import NODE_ENV_ALLOWED, SchedulerLimits, Slurm
from ddslurm.launcher._status import RunStatus, find_run, run_status
from ddslurm.launcher._steer import accept_partial, cancel, continue_submission, log_files, retry
from ddslurm.launcher._submit import (
    HEADROOM,
    PartialSubmitError,
    SubmissionPlan,
    describe_limit,
    job_variables,
    new_stamp,
    plan_submission,
    prepare,
    read_limits,
    submit,
)
from ddslurm.launcher.errors import LauncherError, SlurmError
from ddslurm.providers import ProvidersError
from ddslurm.providers.cli import main as providers_main

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
TERMINAL = {"succeeded", "failed", "cancelled", "incomplete"}


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
    unsubmitted = st.counts.get("unsubmitted", 0)
    if st.cancelled_at:
        never = f"; {unsubmitted} shard(s) were never submitted" if unsubmitted else ""
        lines.insert(
            2, f"  cancelled at {st.cancelled_at} (ddslurm cancel){never}; retry --resume-cancelled continues it"
        )
    if st.submission_incomplete:
        lines.insert(
            2,
            f"  submission incomplete: {st.unsubmitted_arrays} array(s) of its plan were not submitted"
            + (f" ({unsubmitted} shard(s) have no task: unsubmitted)" if unsubmitted else "")
            + f"\n    submit the rest: ddslurm submit --continue {st.run_dir}"
            + f"\n    or cancel what was submitted: ddslurm cancel {st.run_dir}",
        )
    for s in st.shards:
        rows = f"{s.rows if s.rows is not None else '-'}/{s.records}"
        why = f"{s.reason}: {s.message}" if s.reason and s.message else (s.reason or "")
        lines.append(
            f"  {s.shard:>5}  {s.state:<10} {rows:>11}  {s.job_id or '-':<10} {s.slurm_state or '-':<11} {why}"
        )
    return "\n".join(lines)


def cmd_submit(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    if args.continue_run:
        return _continue(args, slurm, env, out)
    if args.profile is None:
        raise LauncherError("submit needs --profile PROFILE.yaml (the cluster profile)")
    if args.dry_run:
        return _dry_run(args, slurm, env, out)
    try:
        done = submit(args.run_file, args.profile, slurm=slurm, env=env)
    except PartialSubmitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.json:
            _json(_partial_json(exc), out)
        return EXIT_RUN_FAILED
    if args.json:
        _json(
            {
                "run_id": done.layout.run_id,
                "run_dir": str(done.layout.root),
                "job_id": done.job_id,
                "job_ids": list(done.job_ids),
                "shards": len(done.plan.shards),
                "secret_env_unscanned": list(done.plan.secret_env_unscanned),
            },
            out,
        )
    else:
        jobs = f"array job {done.job_id}" if len(done.job_ids) <= 1 else f"array jobs {', '.join(done.job_ids)}"
        out.write(
            f"submitted run {done.layout.run_id}: {jobs}, {len(done.plan.shards)} shard(s), "
            f"{done.plan.num_records} records\n  run dir: {done.layout.root}\n"
            f"  next: ddslurm wait {done.layout.root}\n"
        )
        if note := placeholder_note(done.plan.secret_env_unscanned):
            out.write(f"  note: {note}\n")
    return EXIT_OK


def _array_json(array: PlannedArray, job_id: str | None = None) -> dict[str, Any]:
    return {
        "index": array.index,
        "kind": array.kind,
        "array": array.array,
        "shards": compact_ranges(array.shards),
        "tasks": len(array.shards),
        "after": array.after,
        **({"job_id": job_id} if job_id is not None else {}),
    }


def _partial_json(exc: PartialSubmitError) -> dict[str, Any]:
    return {
        "run_id": exc.layout.run_id,
        "run_dir": str(exc.layout.root),
        "state": "incomplete",
        "error": str(exc.cause),
        "submitted": [_array_json(a, job) for a, job in exc.submitted],
        "not_submitted": [_array_json(a) for a in exc.missing],
    }


def _continue(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    """``submit --continue RUN``: the arrays of the run's submission plan that were never submitted."""
    layout = find_run(str(args.run_file), _workspace(args, env))
    try:
        done = continue_submission(layout, slurm, env)
    except PartialSubmitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.json:
            _json(_partial_json(exc), out)
        return EXIT_RUN_FAILED
    if args.json:
        _json({"run_dir": str(layout.root), "job_ids": list(done.job_ids), "adopted": list(done.adopted)}, out)
    elif not done.job_ids and not done.adopted:
        out.write(f"nothing to submit: every array of run {layout.run_id} was submitted\n")
    else:
        found = f"; found in the queue and recorded: {', '.join(done.adopted)}" if done.adopted else ""
        out.write(
            f"submitted the rest of run {layout.run_id}: array job(s) {', '.join(done.job_ids) or '(none)'}{found}; "
            f"shards {compact_ranges(done.shards)}\n  next: ddslurm wait {layout.root}\n"
        )
    return EXIT_OK


def placeholder_note(names: tuple[str, ...]) -> str:
    """What submit says about API-key variables whose values are placeholders (names only, never values)."""
    if not names:
        return ""
    if len(names) == 1:
        return f"{names[0]} holds a placeholder value (not a secret): attempts do not scan their files for it"
    return f"{', '.join(names)} hold placeholder values (not secrets): attempts do not scan their files for them"


def _dry_run(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    """Validate and compile everything, read the scheduler's limits and show the arrays the submission would make
    (``plan_submission``, as ``submit`` does), or refuse as ``submit`` would; write nothing, submit nothing."""
    now = datetime.now(UTC)
    prepared = prepare(args.run_file, args.profile, env, now)
    plan, layout = prepared.plan, prepared.layout
    try:
        limits = read_limits(slurm, plan)
    except SlurmError as exc:  # no scheduler here: show the arrays for Slurm's default MaxArraySize
        limits = SchedulerLimits(1001, notes=(f"scheduler limits not read ({exc}); arrays assume MaxArraySize 1001",))
    planned = plan_submission(plan, layout, [s.index for s in plan.shards], limits, stamp=new_stamp(now))
    first = planned.arrays[0]
    script = render_generation(plan, layout, list(first.shards))
    if args.json:
        _json(
            {
                "plan": plan,
                "arrays": [_array_json(a) for a in planned.arrays],
                "tasks": planned.tasks,
                "limits": _limits_json(planned),
                "script": script,
                "aliases": list(prepared.aliases),
            },
            out,
        )
        return EXIT_OK
    out.write(f"# dry run: nothing was written or submitted\n# run dir would be {layout.root}\n")
    names = ", ".join((*NODE_ENV_ALLOWED, *job_variables(plan)))
    out.write(
        f"# sbatch --export=ALL from an environment of {names} only (values stay in your shell; "
        "the node reads no login file)\n"
    )
    if note := placeholder_note(plan.secret_env_unscanned):
        out.write(f"# note: {note}\n")
    out.write("".join(f"# {line}\n" for line in _plan_lines(planned)))
    out.write(f"# the batch script of array 0 (the others differ in --array, the shards and --dependency):\n{script}")
    return EXIT_OK


def _limits_json(planned: SubmissionPlan) -> dict[str, Any]:
    return {
        "max_array_size": planned.limits.max_array_size,
        "headroom": HEADROOM,
        "checked": [
            {"name": c.name, "scope": c.scope, "limit": c.limit, "used": c.used, "usable": c.usable}
            for c in planned.checks
        ],
        "notes": list(planned.limits.notes),
    }


def _plan_lines(planned: SubmissionPlan) -> list[str]:
    """The arrays and the limits, as the dry run prints them."""
    lines = [
        f"{len(planned.arrays)} sbatch call(s), {planned.tasks:,} array task(s) "
        f"(MaxArraySize {planned.limits.max_array_size:,}):"
    ]
    for a in planned.arrays:
        after = f"  --dependency=afternotok:<array {a.after}>" if a.after is not None else ""
        lines.append(f"  array {a.index}: --array={a.array:<14} shards {compact_ranges(a.shards)} ({a.kind}){after}")
    lines.append(f"limits checked (a submission uses at most {round(HEADROOM * 100)} % of what is left under each):")
    lines += [f"  {describe_limit(c)}: this run needs {planned.tasks:,}" for c in planned.checks]
    lines += [f"  {note}" for note in planned.limits.notes]
    return lines


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = min(width, width * done // total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _format_watch(st: RunStatus) -> str:
    lines = [
        f"{st.run_id}: {st.state}  {_bar(st.records_done, st.records_requested)} "
        f"{st.records_done}/{st.records_requested} records"
    ]
    for s in st.shards:
        rate = f" {s.rate:.1f} rec/s" if s.rate else ""
        why = f"  {s.reason}" if s.reason and s.state in {"failed", "partial", "cancelled", "corrupt"} else ""
        lines.append(
            f"  shard {s.shard:>5} {s.state:<10} {_bar(s.rows or 0, s.records, 16)} "
            f"{s.rows or 0}/{s.records}{rate}{why}"
        )
    return "\n".join(lines)


def cmd_status(
    args: argparse.Namespace,
    slurm: Slurm,
    env: Mapping[str, str],
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    layout = find_run(args.run, _workspace(args, env))
    if not args.watch:
        st = run_status(layout, slurm)
        if args.json:
            _json(st, out)
        else:
            out.write(_format_status(st) + "\n")
        return EXIT_OK
    delay = 2.0
    while True:
        try:
            st = run_status(layout, slurm)
            delay = 2.0
        except SlurmError as exc:  # a busy controller: back off, keep watching
            print(f"scheduler query failed ({exc}); retrying in {delay:.0f} s", file=sys.stderr)
            sleep(delay)
            delay = min(delay * 2, 60.0)
            continue
        if args.json:
            _json(st, out)
        else:
            out.write("\x1b[2J\x1b[H" if out.isatty() else "")
            out.write(_format_watch(st) + "\n")
        out.flush()
        if st.state in TERMINAL:
            return EXIT_OK
        sleep(delay)


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


def _shards(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        out: list[int] = []
        for part in value.split(","):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
        return out
    except ValueError:
        raise LauncherError(f"--shards {value!r}: expected numbers and ranges such as 1,3,5-7") from None


def cmd_cancel(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    layout = find_run(args.run, _workspace(args, env))
    done = cancel(layout, slurm, _shards(args.shards))
    if args.json:
        _json({"cancelled": list(done.ids), "run_cancelled": done.run}, out)
    elif done.run:
        out.write(
            f"cancelled run {layout.run_id}: array job(s) {', '.join(done.ids) or '(none)'}, pending retries "
            "included; no later attempt will generate and no unsubmitted array will be submitted "
            "(ddslurm retry --resume-cancelled to continue it)\n"
        )
    else:
        out.write(f"cancelled {len(done.ids)} task(s) of run {layout.run_id}: {', '.join(done.ids) or '(none)'}\n")
    return EXIT_OK


def cmd_retry(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    layout = find_run(args.run, _workspace(args, env))
    done = retry(layout, slurm, env, _shards(args.shards), resume_cancelled=args.resume_cancelled, fresh=args.fresh)
    if args.json:
        _json({"shards": list(done.shards), "job_ids": list(done.job_ids)}, out)
    elif not done.shards:
        out.write(f"nothing to retry: every shard of {layout.run_id} has a winner or is still running\n")
    else:
        out.write(f"retrying {len(done.shards)} shard(s) as array job(s) {', '.join(done.job_ids)}\n")
    return EXIT_OK


def cmd_accept_partial(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    layout = find_run(args.run, _workspace(args, env))
    shards = _shards(args.shards) or []
    accepted = accept_partial(layout, shards)
    if args.json:
        _json({"accepted": [{"shard": s, "rows": r} for s, r in accepted]}, out)
    else:
        for shard, rows in accepted:
            out.write(f"shard {shard}: accepted {rows} rows as its result\n")
    return EXIT_OK


def cmd_logs(
    args: argparse.Namespace,
    slurm: Slurm,
    env: Mapping[str, str],
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    layout = find_run(args.run, _workspace(args, env))
    files = log_files(layout, args.shard, args.step)
    if not files:
        raise LauncherError(f"shard {args.shard} has no {args.step} log yet")
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        if len(files) > 1:
            out.write(f"==> {path} <==\n")
        out.write("".join(f"{line}\n" for line in lines[-args.lines :]))
    if not args.follow:
        return EXIT_OK
    offsets = {p: p.stat().st_size for p in files}
    while True:
        for path in files:
            size = path.stat().st_size
            if size > offsets[path]:
                with path.open("rb") as fh:
                    fh.seek(offsets[path])
                    out.write(fh.read(size - offsets[path]).decode(errors="replace"))
                out.flush()
                offsets[path] = size
        if run_status(layout, slurm).state in TERMINAL:
            return EXIT_OK
        sleep(1.0)


def cmd_collect(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    """Exit codes are the collector's (``ddslurm.collector.collect_command``), in a job or with --local alike."""
    layout = find_run(args.run, _workspace(args, env))
    if args.local:
        return collect_command(layout, overwrite=args.overwrite, as_json=args.json, out=out, err=sys.stderr)
    return collect_job_command(layout, slurm, overwrite=args.overwrite, as_json=args.json, out=out, err=sys.stderr)


def cmd_list(args: argparse.Namespace, slurm: Slurm, env: Mapping[str, str], out: TextIO) -> int:
    workspace = _workspace(args, env)
    if workspace is None:
        raise LauncherError("list needs --profile (or DDSLURM_PROFILE) to find the workspace")
    rows = []
    for plan_path in sorted((workspace / "runs").glob("*/run.json")):
        layout = RunLayout(plan_path.parent)
        state: str
        try:
            plan = read_plan(plan_path)
            state, name, records = run_status(layout, slurm).state, plan.run_name, plan.num_records
        except ConfigError:  # a run written by another ddslurm version: list it, do not fail the listing
            state, name, records = "unreadable", "?", 0
        rows.append(
            {"run_id": layout.run_id, "name": name, "state": state, "records": records, "run_dir": str(layout.root)}
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
    p.add_argument("run_file", type=Path, metavar="RUN_FILE", help="the run file; with --continue, the run (RUN)")
    p.add_argument("--profile", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--dry-run", action="store_true", help="validate, show the arrays and the limits they fit in; submit nothing"
    )
    p.add_argument(
        "--continue",
        dest="continue_run",
        action="store_true",
        help="submit the arrays of RUN's submission plan that a stopped submission did not submit",
    )
    p = sub.add_parser("providers", help="show how the run's model aliases resolve, and what would stop a submit")
    p.add_argument("run_file", type=Path)
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true", help="ask each hosted endpoint for the model and accept the key")
    p.add_argument("--timeout", default="10", help="seconds per endpoint for --check")
    for name, help_text in (
        ("status", "show a run"),
        ("wait", "wait for a run to end"),
        ("cancel", "cancel a run's queued and running tasks"),
        ("collect", "merge a run's shards"),
        ("retry", "new attempts for shards without a winner"),
        ("accept-partial", "accept short shards as their results"),
        ("logs", "a step's log of a shard's latest attempt"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("run")
        p.add_argument("--profile", type=Path, default=None)
        p.add_argument("--json", action="store_true")
        if name == "wait":
            p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
        if name == "collect":
            p.add_argument("--local", action="store_true", help="collect in this process instead of a Slurm job")
            p.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
        if name in {"cancel", "retry", "accept-partial"}:
            p.add_argument("--shards", default=None, required=name == "accept-partial", help="e.g. 1,3,5-7")
        if name == "status":
            p.add_argument("--watch", action="store_true", help="refresh until the run ends")
        if name == "retry":
            p.add_argument(
                "--resume-cancelled", action="store_true", help="retry a run cancelled as a whole (clears the mark)"
            )
            p.add_argument(
                "--fresh", action="store_true", help="start the shards from nothing (never resume earlier batches)"
            )
        if name == "logs":
            p.add_argument("--shard", type=int, default=0)
            p.add_argument("--step", choices=["client", "server", "proxy", "slurm"], default="client")
            p.add_argument("--lines", type=int, default=50)
            p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
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
    "retry": cmd_retry,
    "accept-partial": cmd_accept_partial,
    "logs": cmd_logs,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "providers":
        flags = [*(["--json"] if args.json else []), *(["--check", "--timeout", args.timeout] if args.check else [])]
        return providers_main([str(args.run_file), *flags])
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
