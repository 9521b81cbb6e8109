"""The commands that follow a run: ``status`` (``--watch``), ``wait``, ``logs``, ``report``.

What only some of them need (the text rendering and its rich, the report and its pyarrow, the workspace's facts)
is imported where it is used: ``status --json`` loads no Rich, ``status`` no report."""

from __future__ import annotations

from contextlib import nullcontext
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from ddslurm.config import RunLayout, compact_ranges, read_plan
from ddslurm.launcher.commands._output import (
    ExitCode,
    write_json,
)
from ddslurm.launcher.commands._session import (
    JsonOpt,
    ProfileOpt,
    RunArg,
    Session,
    command_session,
    guarded,
    run_layout,
    session_client,
)
from ddslurm.launcher.runs._money import money
from ddslurm.launcher.runs._status_model import RunStatus

if TYPE_CHECKING:
    from ddslurm.launcher.commands._console import RunDisplay

# --- status, wait ---


class Step(StrEnum):
    """The step whose log ``logs`` shows."""

    client = "client"
    server = "server"
    proxy = "proxy"
    slurm = "slurm"


def _summary_line(st: RunStatus) -> str:
    """One line of the run's progress (``status --watch`` off a terminal)."""
    from ddslurm.launcher.commands._console import summary_line

    return summary_line(st)


def _display(session: Session, *, table: bool) -> RunDisplay | None:
    """The live view, on a terminal only (and never with --json)."""
    if session.json or not session.out.isatty():
        return None
    from ddslurm.launcher.commands._console import RunDisplay

    return RunDisplay(session.out, table=table)


def _show_status(out: TextIO, st: RunStatus) -> None:
    """The run's status as text (``_console``, which loads rich, is imported for it only)."""
    from ddslurm.launcher.commands._console import show_status

    show_status(out, st)


@guarded
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
    """Show the run and every shard: its stage (two-stage runs), state, rows, rate, attempt number, array task,
    Slurm's state and why it failed.

    Examples:
        # The run and every shard, by its directory
        ddslurm status ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # By its run id in the profile's workspace, refreshed until it ends
        ddslurm status my-run-20260102-030405-a1b2c3 --profile profile.yaml --watch

        # For a script
        ddslurm status ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --json
    """
    session = command_session(ctx, as_json)
    client = session_client(session, profile)
    if not watch:
        st = client.status(run)
        if session.json:
            write_json(st, session.out)
        else:
            _show_status(session.out, st)
        return ExitCode.OK
    found = client.open(run)  # before the live view takes the terminal
    display = _display(session, table=True)
    last = ""
    with display if display is not None else nullcontext():
        for st in client.follow(found):  # a busy scheduler is said on stderr
            if session.json:
                write_json(st, session.out)
            elif display is not None:
                display.update(st)
            elif (line := _summary_line(st)) != last:
                session.out.write(line + "\n")
                session.out.flush()
                last = line
    if not session.json:
        _show_status(session.out, st)
    return ExitCode.OK


@guarded
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
    """Wait until the run ends, then show it; exit 0 only if it succeeded (progress on a terminal).

    Examples:
        # Wait for the run (exit 0 only if it succeeded)
        ddslurm wait ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # Give up after an hour (exit 3)
        ddslurm wait ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --timeout 3600
    """
    session = command_session(ctx, as_json)
    client = session_client(session, profile)
    found = client.open(run)  # before the live view takes the terminal
    display = _display(session, table=False)
    with display if display is not None else nullcontext():
        st = client.wait(found, timeout, on_update=None if display is None else display.update)
    place = read_plan(RunLayout(found.run_dir).plan).workflow
    if place is not None and not place.last:
        session.err.write(
            f"note: run {found.run_id} is {place.label()}: `ddslurm workflow {found.run_dir}` carries the workflow on\n"
        )
    if session.json:
        write_json(st, session.out)
    else:
        _show_status(session.out, st)
    return ExitCode.OK if st.state == "succeeded" else ExitCode.FAILED


# --- logs ---


@guarded
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
            help="The attempt (its id, such as 4243: status --json's shards[].attempt). Default: the shard's latest.",
            show_default=False,
        ),
    ] = None,
    step: Annotated[
        Step | None,
        typer.Option(
            "--step",
            help="Which log: client (the generation step), server, proxy, or slurm (the array task's batch output). "
            "Default: server for an attempt that failed with a server_* reason, proxy for proxy_died, else client.",
            show_default=False,
        ),
    ] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many of the last lines to show.")] = 50,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing until the run ends; waits for a log that does not exist yet."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Print a step's log of a shard's attempt; structured log lines as time, level, event and key=value.

    Examples:
        # The log of the first shard that failed (its server's if that failed)
        ddslurm logs ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # The last 200 lines of shard 3's vLLM server
        ddslurm logs ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --shard 3 --step server -n 200

        # Follow shard 0's generation until the run ends
        ddslurm logs ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --shard 0 -f
    """
    from ddslurm.launcher.runs._logs import LogFollower

    session = command_session(ctx, as_json)
    follower = LogFollower(run_layout(session, run, profile), session.slurm, session.out, session.err, session.sleep)
    index = follower.pick_shard(shard)
    shown = follower.pick_step(index, step.value if step is not None else None, attempt)
    follower.show(index, shown, attempt, lines=lines, follow=follow, as_json=session.json)
    return ExitCode.OK


@guarded
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
    dataset's column statistics. With --json, also print its numbers.

    Examples:
        # The HTML report, written to RUN/report.html
        ddslurm report ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # Written elsewhere, its numbers printed as JSON
        ddslurm report ddslurm-work/runs/my-run-20260102-030405-a1b2c3 -o demo-report.html --json
    """
    from ddslurm.launcher.commands._console import hosted_lines
    from ddslurm.launcher.facts._fact_check import fact_line
    from ddslurm.launcher.report import report_json

    session = command_session(ctx, as_json)
    done = session_client(session, profile).report(run, output)  # a succeeded run's facts recorded too
    report, target = done.report, done.page
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
    if gpu is not None and ((gpu.allocated_gpu_hours or 0) > 0 or gpu.generating_gpu_hours > 0):
        allocated = f"{gpu.allocated_gpu_hours:.3f}" if gpu.allocated_gpu_hours is not None else "unknown (no sacct)"
        cost = f" ({money(gpu.allocated_cost, str(gpu.currency), 2)})" if gpu.allocated_cost is not None else ""
        lines.append(f"  GPU-hours: {allocated} allocated{cost}, {gpu.generating_gpu_hours:.3f} generating")
    lines += [
        f"  {m.alias} ({'local' if m.local else 'hosted'}): {m.requests} requests, {m.failed} failed, "
        f"{m.total_tokens} tokens"
        for m in report.models
    ]
    if report.predicted is not None:
        lines.append("  predicted / measured (ratio):")
        lines += [
            f"    {c.what}: {c.predicted:g} / {c.measured:g} ({c.ratio:g})"
            if c.measured is not None and c.ratio is not None
            else f"    {c.what}: {c.predicted:g} / {'unknown' if c.measured is None else f'{c.measured:g}'}"
            for c in report.predicted.rows
        ]
    if report.facts:
        lines.append("  facts (planned with / this run measured (ratio), runs the planned value rests on):")
        lines += [f"    {fact_line(f)}" for f in report.facts]
    if report.hosted is not None:
        lines += hosted_lines(report.hosted)
    lines += [f"  failed: {f.reason} x{f.count} (shards {compact_ranges(f.shards)})" for f in report.failures]
    session.out.write("\n".join(lines) + "\n")
    return ExitCode.OK
