"""``ddslurm``: run Data Designer recipes on Slurm (a Typer app; ``docs/cli.md`` documents every command).

Commands: init (--dir, --force), submit (--dry-run, --continue), providers, status (--watch), wait (--timeout),
cancel (--shards), retry (--shards, --fresh, --resume-cancelled, --dry-run), accept-partial, logs, collect (--local,
--overwrite), report (--output), list. Every command takes --json (errors included); exit codes are
:class:`ddslurm.launcher._output.ExitCode`. Rendering for people lives in ``_console``, JSON and errors in
``_output``. A command here only reads its options, builds the :class:`Session`, calls one service of the launcher
(the functions ``ddslurm.launcher`` exports: ``dry_run``, ``follow_run``, ``retry``, ``list_runs``, ...), renders
what it returns and gives the exit code; what the command does lives in the service.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, TextIO, TypeVar

import typer
from typer.main import get_command

from ddslurm.config import RunLayout, compact_ranges, expand_ranges, read_plan
from ddslurm.launcher._bill import bill_lines
from ddslurm.launcher._collect import collect_job_command, collect_local_command
from ddslurm.launcher._console import (
    FileProgress,
    RunDisplay,
    dry_run_text,
    job_spinner,
    placeholder_note,
    plan_lines,
    run_table,
    show,
    show_status,
    summary_line,
)
from ddslurm.launcher._dry_run import DryRun
from ddslurm.launcher._dry_run import dry_run as plan_dry_run
from ddslurm.launcher._follow import SchedulerBusy, follow_run, release, wait_for_run
from ddslurm.launcher._init import init_command
from ddslurm.launcher._logs import LogFollower
from ddslurm.launcher._output import (
    REPORTED,
    CommandFailed,
    ErrorCode,
    ErrorReport,
    ExitCode,
    Recording,
    array_json,
    collect_report,
    emit_error,
    error_report,
    limits_json,
    write_json,
)
from ddslurm.launcher._runs import list_runs, open_run, resolve_profile, save_report, workspace_of
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher._status import RunStatus, run_status
from ddslurm.launcher._steer import (
    accept_partial,
    cancel,
    continue_submission,
    retry,
)
from ddslurm.launcher._submit import submit
from ddslurm.launcher.errors import DISK_FULL, UsageError, WriteError
from ddslurm.launcher.report import render_html, report_json, run_report
from ddslurm.providers import check_endpoints, describe_run
from ddslurm.providers.cli import print_resolution

DISTRIBUTIONS = (
    "ddslurm-launcher",
    "ddslurm-config",
    "ddslurm-providers",
    "ddslurm-planner",
    "ddslurm-collector",
    "ddslurm-runtime",
    "data-designer",
)
"""What ``--version`` reports (``ddslurm-runtime`` is what the nodes run; it may be absent on a submit host)."""


@dataclass(slots=True)
class Session:
    """What every command works with: the environment, the scheduler, the output streams and the clock."""

    env: Mapping[str, str]
    slurm: Slurm
    out: TextIO
    err: TextIO
    sleep: Callable[[float], None]
    json: bool = False
    """``--json`` is on the command line (so an error of the command line itself is reported as JSON too)."""
    command: str | None = None


def _session(ctx: typer.Context, as_json: bool) -> Session:
    """The session of the command ``ctx`` runs, with its ``--json``."""
    session = ctx.find_object(Session)
    if session is None:
        raise RuntimeError("the ddslurm app runs through ddslurm.launcher.cli.main")
    session.command = ctx.info_name
    session.json = session.json or as_json
    return session


class PipeClosed(Exception):
    """Whoever read stdout stopped (``| head``): ``main`` exits quietly."""


_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(command: _F) -> _F:
    """A command whose closed stdout and Ctrl-C ``main`` handles: Typer would turn a BrokenPipeError into
    ``sys.exit(1)`` (rewrapping the process's streams) and Ctrl-C into a silent exit 130."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            raise PipeClosed from None
        except KeyboardInterrupt:
            raise CommandFailed(ErrorReport(ErrorCode.INTERRUPTED, "interrupted", ExitCode.INTERRUPTED)) from None

    return run  # type: ignore[return-value]


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _show_version(ctx: typer.Context, value: bool) -> None:
    if not value:
        return
    session = ctx.find_object(Session)
    out = session.out if session is not None else sys.stdout
    found = _versions()
    if session is not None and session.json:
        write_json(found, out)
    else:
        out.write(f"ddslurm {found['ddslurm-launcher']}\n")
        out.write("".join(f"  {name} {v or '(not installed)'}\n" for name, v in found.items()))
    raise typer.Exit(int(ExitCode.OK))


app = typer.Typer(
    name="ddslurm",
    help="Run NVIDIA Data Designer recipes on Slurm: submit a run as job arrays, follow it, steer its shards, "
    "and collect one Parquet dataset. RUN is a run directory, or a run id with --profile or DDSLURM_PROFILE. "
    "Exit codes and the JSON of every command: docs/cli.md.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _top(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, as every command's own --json does.")] = False,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print the versions of the ddslurm distributions and Data Designer, and exit.",
        ),
    ] = False,
) -> None:
    """Run NVIDIA Data Designer recipes on Slurm."""
    session = ctx.find_object(Session)
    if session is not None:
        session.json = session.json or as_json


# --- the options several commands share ---

RunArg = Annotated[
    str,
    typer.Argument(
        metavar="RUN",
        help="The run: its directory, or its run id in the workspace of --profile.",
        show_default=False,
    ),
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        metavar="PROFILE.yaml",
        help="The cluster profile, whose workspace holds the runs. Default: the file DDSLURM_PROFILE names.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help='Print JSON instead of text; an error as {"error": {"code", "message", "exit_code"}}.'),
]
ShardsHelp = "Shards by number and range, such as 1,3,5-7."


class Step(StrEnum):
    client = "client"
    server = "server"
    proxy = "proxy"
    slurm = "slurm"


def _run(session: Session, run: str, profile: Path | None) -> RunLayout:
    """RUN (with ``--profile``, else ``DDSLURM_PROFILE``, for a run id)."""
    return open_run(run, session.env, profile)


def _write_lines(out: TextIO, lines: Iterable[str]) -> None:
    out.write("".join(f"{line}\n" for line in lines))


def parse_shards(value: str | None, layout: RunLayout) -> list[int] | None:
    """``1,3,5-7`` → [1, 3, 5, 6, 7]; None stays None. Checked against the run's shards before it is expanded
    (``0-999999999`` is a usage error naming what the run has, not a list of a billion numbers)."""
    if value is None:
        return None
    count = len(read_plan(layout.plan).shards)
    have = "shard 0 (1 shard)" if count == 1 else f"shards 0-{count - 1} ({count} shards)"

    def refused(message: str) -> UsageError:
        return UsageError(f"--shards {value!r}: {message}")

    try:
        return expand_ranges(value, below=count, what="shard", have=f"the run has {have}", error=refused)
    except ValueError:  # not numbers and ranges (the bounds are ``refused``)
        raise UsageError(f"--shards {value!r}: expected numbers and ranges such as 1,3,5-7") from None


# --- submit ---


@app.command("submit")
@_guarded
def cmd_submit(
    ctx: typer.Context,
    run_file: Annotated[
        Path,
        typer.Argument(
            metavar="RUN_FILE",
            help="The run file (recipe, records, shards, scheduler settings); with --continue, the run (RUN).",
            show_default=False,
        ),
    ],
    profile: ProfileOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Validate, show the arrays and the limits they fit in; write and submit nothing."
        ),
    ] = False,
    continue_run: Annotated[
        bool,
        typer.Option(
            "--continue",
            help="Submit the arrays of RUN's submission plan that a submission stopped part-way did not submit.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Capture the inputs, compile the plan and submit the run's job arrays."""
    session = _session(ctx, as_json)
    if continue_run:
        return _continue(session, str(run_file), profile)
    profile_path = resolve_profile(profile, session.env)
    if profile_path is None:
        raise UsageError("submit needs --profile PROFILE.yaml (the cluster profile), or DDSLURM_PROFILE naming it")
    if dry_run:
        return _show_dry_run(session, plan_dry_run(run_file, profile_path, slurm=session.slurm, env=session.env))
    done = submit(run_file, profile_path, slurm=session.slurm, env=session.env)
    out = session.out
    if session.json:
        write_json(
            {
                "run_id": done.layout.run_id,
                "run_dir": str(done.layout.root),
                "job_id": done.job_id,
                "job_ids": list(done.job_ids),
                "shards": len(done.plan.shards),
                "secret_env_unscanned": list(done.plan.secret_env_unscanned),
                "warnings": list(done.warnings),
            },
            out,
        )
        return ExitCode.OK
    jobs = f"array job {done.job_id}" if len(done.job_ids) <= 1 else f"array jobs {', '.join(done.job_ids)}"
    out.write(
        f"submitted run {done.layout.run_id}: {jobs}, {len(done.plan.shards)} shard(s), "
        f"{done.plan.num_records} records\n  run dir: {done.layout.root}\n"
        f"  next: ddslurm wait {done.layout.root}\n"
    )
    if note := placeholder_note(done.plan.secret_env_unscanned):
        out.write(f"  note: {note}\n")
    for warning in done.warnings:
        out.write(f"  warning: {warning}\n")
    return ExitCode.OK


def _continue(session: Session, run: str, profile: Path | None) -> int:
    """``submit --continue RUN``: the arrays of the run's submission plan that were never submitted."""
    layout = _run(session, run, profile)
    done = continue_submission(layout, session.slurm, session.env)
    out = session.out
    if session.json:
        write_json({"run_dir": str(layout.root), "job_ids": list(done.job_ids), "adopted": list(done.adopted)}, out)
    elif not done.job_ids and not done.adopted:
        out.write(f"nothing to submit: every array of run {layout.run_id} was submitted\n")
    else:
        found = f"; found in the queue and recorded: {', '.join(done.adopted)}" if done.adopted else ""
        out.write(
            f"submitted the rest of run {layout.run_id}: array job(s) {', '.join(done.job_ids) or '(none)'}{found}; "
            f"shards {compact_ranges(done.shards)}\n"
            f"  next: ddslurm wait {layout.root}\n"
        )
    return ExitCode.OK


def _show_dry_run(session: Session, done: DryRun) -> int:
    """``submit --dry-run``: the plan, the bill, the arrays and the limits they fit in, the first batch script."""
    planned = done.planned
    if session.json:
        write_json(
            {
                "plan": done.plan,
                "bill": done.bill,
                "arrays": [array_json(a, plan=planned.arrays) for a in planned.arrays],
                "tasks": planned.tasks,
                "limits": limits_json(planned),
                "script": done.script,
                "aliases": list(done.prepared.aliases),
                "warnings": list(done.warnings),
            },
            session.out,
        )
    else:
        session.out.write(dry_run_text(done.plan, done.layout, planned, done.script, bill_lines(done.bill)))
        _write_lines(session.out, (f"warning: {warning}" for warning in done.warnings))
    return ExitCode.OK


# --- providers ---


@app.command("providers")
@_guarded
def cmd_providers(
    ctx: typer.Context,
    run_file: Annotated[
        Path, typer.Argument(metavar="RUN_FILE", help="The run file whose recipe names the models.", show_default=False)
    ],
    check: Annotated[
        bool, typer.Option("--check", help="Ask each hosted endpoint whether it lists the model and accepts the key.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per endpoint for --check.")] = 10.0,
    as_json: JsonOpt = False,
) -> int:
    """Show how the run's model aliases resolve, and what would stop a submit (never a key's value).

    Exit 0 when submit would accept the providers (and every --check passed), 1 when the table shows problems."""
    session = _session(ctx, as_json)
    resolution = describe_run(run_file, session.env)
    if check:
        resolution = check_endpoints(resolution, session.env, timeout=timeout)
    return print_resolution(resolution, checked=check, as_json=session.json, out=session.out, err=session.err)


# --- status, wait ---


def _say_busy(session: Session, busy: SchedulerBusy) -> None:
    session.err.write(f"scheduler query failed ({busy.error}); retrying in {busy.retry_in:.0f} s\n")
    session.err.flush()


def _display(session: Session, *, table: bool) -> RunDisplay | None:
    """The live view, on a terminal only (and never with --json)."""
    return RunDisplay(session.out, table=table) if not session.json and session.out.isatty() else None


@app.command("status")
@_guarded
def cmd_status(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Refresh until the run ends: live progress on a terminal, a line per change elsewhere, "
            "a JSON object per refresh with --json.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Show the run and every shard: state, rows, rate, attempt, array task, Slurm's state and why it failed."""
    session = _session(ctx, as_json)
    layout = _run(session, run, profile)
    if not watch:
        st = run_status(layout, session.slurm)
        if session.json:
            write_json(st, session.out)
        else:
            show_status(session.out, st)
        return ExitCode.OK
    display = _display(session, table=True)
    last = ""
    with display if display is not None else nullcontext():
        for polled in follow_run(layout, session.slurm, sleep=session.sleep):
            if isinstance(polled, SchedulerBusy):
                _say_busy(session, polled)
                continue
            st = polled
            if session.json:
                write_json(st, session.out)
            elif display is not None:
                display.update(st)
            elif (line := summary_line(st)) != last:
                session.out.write(line + "\n")
                session.out.flush()
                last = line
    if not session.json:
        show_status(session.out, st)
    return ExitCode.OK


@app.command("wait")
@_guarded
def cmd_wait(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", metavar="SECONDS", help="Give up (exit 3) after this many seconds.", show_default=False
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> int:
    """Wait until the run ends, then show it; exit 0 only if it succeeded (progress on a terminal)."""
    session = _session(ctx, as_json)
    layout = _run(session, run, profile)
    display = _display(session, table=False)

    def update(polled: RunStatus | SchedulerBusy) -> None:
        if isinstance(polled, SchedulerBusy):
            _say_busy(session, polled)
        elif display is not None:
            display.update(polled)

    with display if display is not None else nullcontext():
        st = wait_for_run(layout, session.slurm, timeout=timeout, sleep=session.sleep, on_update=update)
    released = release(layout, session.slurm, st)
    if released.error is not None:  # the run's result stands; the leftovers only cost job starts
        session.err.write(f"note: the run's leftover queued tasks could not be cancelled ({released.error})\n")
    if released.tasks:
        session.err.write(
            f"note: cancelled {len(released.tasks)} queued task(s) of the succeeded run that could only have "
            f"recorded superseded: {', '.join(released.tasks)}\n"
        )
    if session.json:
        write_json(st, session.out)
    else:
        show_status(session.out, st)
    return ExitCode.OK if st.state == "succeeded" else ExitCode.FAILED


# --- steering: cancel, retry, accept-partial ---


@app.command("cancel")
@_guarded
def cmd_cancel(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    shards: Annotated[
        str | None,
        typer.Option("--shards", metavar="1,3,5-7", help=f"{ShardsHelp} Default: the whole run.", show_default=False),
    ] = None,
    as_json: JsonOpt = False,
) -> int:
    """Cancel the whole run (every array, pending retries included) or the queued and running tasks of shards."""
    session = _session(ctx, as_json)
    layout = _run(session, run, profile)
    done = cancel(layout, session.slurm, parse_shards(shards, layout))
    out = session.out
    found = (
        f" (found in the queue by its batch script, its sbatch having been stopped, and recorded: "
        f"{', '.join(done.adopted)})"
        if done.adopted
        else ""
    )
    if session.json:
        write_json({"cancelled": list(done.ids), "run_cancelled": done.run, "adopted": list(done.adopted)}, out)
    elif done.run:
        out.write(
            f"cancelled run {layout.run_id}: array job(s) {', '.join(done.ids) or '(none)'}, pending retries "
            f"included{found}; no later attempt will generate and no unsubmitted array will be submitted "
            "(ddslurm retry --resume-cancelled to continue it)\n"
        )
    else:
        out.write(
            f"cancelled {len(done.ids)} task(s) of run {layout.run_id}: {', '.join(done.ids) or '(none)'}{found}\n"
        )
    return ExitCode.OK


@app.command("retry")
@_guarded
def cmd_retry(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    shards: Annotated[
        str | None,
        typer.Option(
            "--shards",
            metavar="1,3,5-7",
            help=f"{ShardsHelp} Default: every shard without a result and without a task.",
            show_default=False,
        ),
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Start the shards from nothing: never resume earlier attempts' batches.")
    ] = False,
    resume_cancelled: Annotated[
        bool,
        typer.Option("--resume-cancelled", help="Retry a run cancelled as a whole (clears its cancel record)."),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show the shards and the arrays a retry would submit; change nothing."),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Submit new attempts, as one array, for shards without a winner (resuming their batches)."""
    session = _session(ctx, as_json)
    layout = _run(session, run, profile)
    done = retry(
        layout,
        session.slurm,
        session.env,
        parse_shards(shards, layout),
        resume_cancelled=resume_cancelled,
        fresh=fresh,
        dry_run=dry_run,
    )
    out = session.out
    if done.planned is not None:
        if session.json:
            write_json(
                {
                    "shards": list(done.shards),
                    "arrays": [array_json(a, plan=done.planned.arrays) for a in done.planned.arrays],
                    "tasks": done.planned.tasks,
                    "limits": limits_json(done.planned),
                },
                out,
            )
        else:
            head = f"dry run: a retry would submit {len(done.shards)} shard(s): {compact_ranges(done.shards)}"
            _write_lines(out, [head, *plan_lines(done.planned)])
        return ExitCode.OK
    if session.json:
        write_json({"shards": list(done.shards), "job_ids": list(done.job_ids)}, out)
    elif not done.shards:
        out.write(f"nothing to retry: every shard of {layout.run_id} has a winner or is still running\n")
    else:
        out.write(f"retrying {len(done.shards)} shard(s) as array job(s) {', '.join(done.job_ids)}\n")
    return ExitCode.OK


@app.command("accept-partial")
@_guarded
def cmd_accept_partial(
    ctx: typer.Context,
    run: RunArg,
    shards: Annotated[
        str, typer.Option("--shards", metavar="1,3,5-7", help=f"{ShardsHelp} Required.", show_default=False)
    ],
    profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> int:
    """Publish the best short result of each shard as its winner (marked partial); a two-stage shard whose GPU
    stage ended short: as its GPU-stage result, then its CPU stage is submitted (as retry does)."""
    session = _session(ctx, as_json)
    layout = _run(session, run, profile)
    done = accept_partial(layout, parse_shards(shards, layout) or [], session.slurm, session.env)
    if session.json:
        write_json(
            {
                "accepted": [{"shard": a.shard, "rows": a.rows, "stage": a.stage} for a in done.accepted],
                "cpu_stage": {
                    "shards": list(done.cpu_stage),
                    "job_ids": list(done.job_ids),
                    "queued": list(done.queued),
                },
            },
            session.out,
        )
        return ExitCode.OK
    lines = [
        f"shard {a.shard}: accepted {a.rows} rows as the result of its GPU stage (partial); its CPU stage runs on them"
        if a.stage == "gpu"
        else f"shard {a.shard}: accepted {a.rows} rows as its result"
        for a in done.accepted
    ]
    if done.cpu_stage:
        lines.append(
            f"submitted the CPU stage of shard(s) {compact_ranges(done.cpu_stage)} as array job(s) "
            f"{', '.join(done.job_ids)} (as ddslurm retry does)"
        )
    if done.queued:
        lines.append(f"shard(s) {compact_ranges(done.queued)}: a CPU-stage array of the run already queued runs them")
    _write_lines(session.out, lines)
    return ExitCode.OK


# --- logs ---


@app.command("logs")
@_guarded
def cmd_logs(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    shard: Annotated[
        int | None,
        typer.Option(
            "--shard", help="The shard. Default: the first shard that failed, else shard 0.", show_default=False
        ),
    ] = None,
    attempt: Annotated[
        str | None,
        typer.Option(
            "--attempt",
            metavar="ID",
            help="The attempt (its id as status shows it, such as 4243). Default: the shard's latest.",
            show_default=False,
        ),
    ] = None,
    step: Annotated[
        Step,
        typer.Option(
            "--step",
            help="Which log: client (the generation step), server, proxy, or slurm (the array task's batch output).",
        ),
    ] = Step.client,
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many of the last lines to show.")] = 50,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing until the run ends; waits for a log that does not exist yet."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Print a step's log of a shard's attempt; structured log lines as time, level, event and key=value."""
    session = _session(ctx, as_json)
    follower = LogFollower(_run(session, run, profile), session.slurm, session.out, session.err, session.sleep)
    index = follower.pick_shard(shard)
    follower.show(index, step.value, attempt, lines=lines, follow=follow, as_json=session.json)
    return ExitCode.OK


# --- collect, list ---


@app.command("collect")
@_guarded
def cmd_collect(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    local: Annotated[bool, typer.Option("--local", help="Collect in this process instead of a CPU Slurm job.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing dataset.")] = False,
    as_json: JsonOpt = False,
) -> int:
    """Merge the shards' results into one Parquet dataset (RUN/dataset); the collector's exit codes.

    Progress on a terminal: a bar over the batch files with --local, the job's elapsed time otherwise."""
    session = _session(ctx, as_json)
    layout = _run(session, run, profile)
    live = not session.json and session.out.isatty()
    held_out, held_err = io.StringIO(), io.StringIO()  # printed once the live display lets go of the terminal
    out = held_out if live else session.out
    err = Recording(held_err if live else session.err)
    if local:
        progress = FileProgress(session.out) if live else None
        with progress.progress if progress is not None else nullcontext():
            code = collect_local_command(
                layout,
                overwrite=overwrite,
                as_json=session.json,
                out=out,
                err=err,
                progress=progress,  # None: the collector's own lines on stderr, as in the job's log
            )
    else:
        with job_spinner(session.out, "collecting in a Slurm job") if live else nullcontext():
            code = collect_job_command(
                layout, session.slurm, overwrite=overwrite, as_json=session.json, out=out, err=err
            )
    session.err.write(held_err.getvalue())
    session.out.write(held_out.getvalue())
    if code != ExitCode.OK and session.json:
        raise CommandFailed(collect_report(code, err.getvalue()), said=True)
    return code


@app.command("report")
@_guarded
def cmd_report(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="PATH",
            help="Where to write the HTML page. Default: RUN/report.html, next to the dataset.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> int:
    """Write a self-contained HTML report of the run (opens offline): every attempt's timeline, records/s,
    requests and tokens per model alias, GPU-hours allocated and spent generating, failures by reason, and the
    dataset's column statistics. With --json, also print its numbers."""
    session = _session(ctx, as_json)
    layout = _run(session, run, profile)
    report = run_report(layout, session.slurm)
    target = save_report(layout, render_html(report), output)
    if session.json:
        write_json({"report": str(target), **report_json(report)}, session.out)
        return ExitCode.OK
    gpu = report.gpu
    rate = f"{report.records_per_second:.2f}" if report.records_per_second is not None else "-"
    lines = [
        f"report of run {report.run_id}: {target}",
        f"  {report.records_done}/{report.records_requested} records, {report.shards_done}/{report.shards} shards, "
        f"{report.attempts} attempt(s), {rate} records/s",
    ]
    if gpu is not None and gpu.allocated_gpu_hours > 0:
        lines.append(f"  GPU-hours: {gpu.allocated_gpu_hours:.3f} allocated, {gpu.generating_gpu_hours:.3f} generating")
    lines += [
        f"  {m.alias} ({'local' if m.local else 'hosted'}): {m.requests} requests, {m.failed} failed, "
        f"{m.total_tokens} tokens"
        for m in report.models
    ]
    lines += [f"  failed: {f.reason} x{f.count} (shards {compact_ranges(f.shards)})" for f in report.failures]
    session.out.write("\n".join(lines) + "\n")
    return ExitCode.OK


@app.command("init")
@_guarded
def cmd_init(
    ctx: typer.Context,
    directory: Annotated[
        Path,
        typer.Option("--dir", help="Where to write run.yaml and profile.yaml (created if missing).", show_default=True),
    ] = Path(),
    force: Annotated[bool, typer.Option("--force", help="Replace run.yaml and profile.yaml if they exist.")] = False,
    as_json: JsonOpt = False,
) -> int:
    """Write a run file and a cluster profile filled from this cluster (one sinfo), every field explained."""
    session = _session(ctx, as_json)
    result = init_command(directory, slurm=session.slurm, force=force)
    if session.json:
        write_json(result.as_dict(), session.out)
    else:
        _write_lines(session.out, result.lines())
    return ExitCode.OK


@app.command("list")
@_guarded
def cmd_list(ctx: typer.Context, profile: ProfileOpt = None, as_json: JsonOpt = False) -> int:
    """List the runs in the workspace, newest first: state, rows produced of those requested, age."""
    session = _session(ctx, as_json)
    workspace = workspace_of(profile, session.env)
    if workspace is None:
        raise UsageError("list needs --profile (or DDSLURM_PROFILE) to find the workspace")
    runs = list_runs(workspace, session.slurm)
    if session.json:
        write_json(runs, session.out)
    else:
        show(session.out, run_table(runs, datetime.now(UTC), boxed=session.out.isatty()))
    return ExitCode.OK


# --- the entry point ---


def _wants_json(args: list[str]) -> bool:
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def _quiet_exit(out: TextIO) -> int:
    """stdout was closed by its reader: point it at /dev/null so that nothing fails again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError):
        pass
    return ExitCode.CLOSED_PIPE


def _report(exc: BaseException, session: Session) -> int:
    """Print an error as ``error: ...`` (and, with --json, as a JSON object on stdout); its exit code."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # ``ddslurm`` alone: the help was printed
        return ExitCode.USAGE
    report = error_report(exc, session.command)
    usage = getattr(exc, "ctx", None)
    if isinstance(exc, typer.TyperException) and usage is not None:
        session.err.write(f"{usage.get_usage()}\nTry '{usage.command_path} --help' for help.\n")
    said = isinstance(exc, CommandFailed) and exc.said
    emit_error(report, out=session.out, err=session.err, as_json=session.json, said=said)
    return report.exit_code


def main(
    argv: list[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    slurm: Slurm | None = None,
    sleep: Callable[[float], None] = time.sleep,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """``ddslurm ARGV``; returns the exit code. ``env``, ``slurm``, ``sleep`` and the streams default to this
    process's (tests pass fakes)."""
    args = sys.argv[1:] if argv is None else list(argv)
    environ = os.environ if env is None else env
    session = Session(
        env=environ,
        slurm=slurm if slurm is not None else Slurm(env=environ),
        out=stdout if stdout is not None else sys.stdout,
        err=stderr if stderr is not None else sys.stderr,
        sleep=sleep,
        json=_wants_json(args),
    )
    command = get_command(app)
    try:
        try:
            code = command.main(args=args, prog_name="ddslurm", standalone_mode=False, obj=session)
            session.out.flush()
        except REPORTED as exc:
            code = _report(exc, session)
        except OSError as exc:  # a full disk or quota wherever a command writes: an error, not a traceback
            if exc.errno not in DISK_FULL:
                raise
            code = _report(WriteError(f"what {session.command or 'the command'} writes", exc), session)
    except (PipeClosed, BrokenPipeError):
        return _quiet_exit(session.out)
    except SystemExit as exc:  # shell completion (--show-completion, --install-completion) exits by itself
        return exc.code if isinstance(exc.code, int) else ExitCode.OK
    return int(code) if isinstance(code, int) else ExitCode.OK
