"""The commands that steer a run: ``cancel``, ``retry``, ``accept-partial``, ``collect``.

The collector (and its pyarrow), the planner and the text rendering are imported where a command uses them:
``cancel`` loads none of them (``cancel --shards`` words its text with the planner's ``plural``)."""

from __future__ import annotations

import dataclasses
import io
from contextlib import nullcontext
from typing import Annotated

import typer

from ddslurm.config import RunLayout, compact_ranges
from ddslurm.launcher.commands._output import (
    CommandFailed,
    ExitCode,
    array_json,
    collect_report,
    limits_json,
    write_json,
)
from ddslurm.launcher.commands._session import (
    JsonOpt,
    ProfileOpt,
    RunArg,
    ShardsHelp,
    command_session,
    guarded,
    parse_shards,
    session_client,
    write_lines,
)
from ddslurm.launcher.errors import CollectFailedError
from ddslurm.launcher.runs._records import shards_named
from ddslurm.launcher.runs._steer import Cancelled

# --- steering: cancel, retry, accept-partial ---


@guarded
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
    """Cancel the whole run (every array, pending retries included) or the queued and running tasks of shards.

    Examples:
        # Cancel the whole run
        ddslurm cancel ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # Cancel shards 3 and 5 to 7 only
        ddslurm cancel ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --shards 3,5-7
    """
    session = command_session(ctx, as_json)
    client = session_client(session, profile)
    found = client.open(run)
    done = client.cancel(found, parse_shards(shards, RunLayout(found.run_dir)))
    out = session.out
    adopted = (
        f" (found in the queue by its batch script, its sbatch having been stopped, and recorded: "
        f"{', '.join(done.adopted)})"
        if done.adopted
        else ""
    )
    if session.json:
        which = {"shards": list(done.shards), "finished": list(done.finished)} if not done.run else {}
        write_json(
            {"cancelled": list(done.ids), "run_cancelled": done.run, "adopted": list(done.adopted), **which}, out
        )
    elif done.run:
        out.write(
            f"cancelled run {found.run_id}: array job(s) {', '.join(done.ids) or '(none)'}, pending retries "
            f"included{adopted}; no later attempt will generate and no unsubmitted array will be submitted "
            "(ddslurm retry --resume-cancelled to continue it)\n"
        )
    else:
        write_lines(out, _shards_cancelled(done, found.run_id, adopted))
    return ExitCode.OK


def _shards_cancelled(done: Cancelled, run_id: str, found: str) -> list[str]:
    """What ``cancel --shards`` says it did: the shards cancelled, how (their tasks, or the pulling allocations that
    stop them themselves), and those that had their result already (kept)."""
    from ddslurm.planner import plural

    how = [f"{plural(len(done.ids), 'task')} {', '.join(done.ids)} cancelled"] if done.ids else []
    if done.pulled:
        how.append("the allocations that pull shards stop their generation and take them no more")
    if not how:
        how.append("no task of theirs was queued or running")
    lines = [
        f"cancelled {shards_named(done.shards)} of run {run_id}: {'; '.join(how)}{found} "
        "(ddslurm retry --shards runs them again)"
    ]
    if done.finished:
        lines.append(f"{shards_named(done.finished)} already had a result, which is kept")
    return lines


@guarded
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
        typer.Option(
            "--dry-run",
            help="Show each shard's attempt, the rows it would resume and how, and the arrays a retry would submit; "
            "change nothing.",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Retry shards whose failure the run's frozen plan would repeat (server_start_failed, ...) anyway.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Submit new attempts, as one array, for shards without a winner (resuming their batches).

    After key_refused the provider is asked with this shell's key first, and nothing is submitted while it still
    refuses it; a retry of only shards whose failure the frozen plan would repeat is refused without --force.

    Examples:
        # What a retry would submit and the rows each shard resumes; nothing changed
        ddslurm retry ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --dry-run

        # Retry every shard without a result
        ddslurm retry ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # Shards 2 and 4 from nothing, not resuming their batches
        ddslurm retry ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --shards 2,4 --fresh

        # Go on with a run cancelled as a whole
        ddslurm retry ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --resume-cancelled
    """
    session = command_session(ctx, as_json)
    client = session_client(session, profile)
    found = client.open(run)
    done = client.retry(
        found,
        parse_shards(shards, RunLayout(found.run_dir)),
        resume_cancelled=resume_cancelled,
        fresh=fresh,
        dry_run=dry_run,
        force=force,
    )
    out = session.out
    if done.planned is not None:
        if session.json:
            write_json(
                {
                    "shards": list(done.shards),
                    "preview": [dataclasses.asdict(p) for p in done.preview],
                    "arrays": [array_json(a, plan=done.planned.arrays) for a in done.planned.arrays],
                    "tasks": done.planned.tasks,
                    "limits": limits_json(done.planned),
                    "warnings": list(done.warnings),
                },
                out,
            )
        else:
            from ddslurm.launcher.commands._console import plan_lines
            from ddslurm.launcher.runs._retry_why import preview_lines

            head = f"dry run: a retry would submit {len(done.shards)} shard(s): {compact_ranges(done.shards)}"
            write_lines(out, [head, *preview_lines(done.preview), *plan_lines(done.planned)])
            write_lines(out, (f"warning: {warning}" for warning in done.warnings))
        return ExitCode.OK
    if session.json:
        write_json(
            {
                "shards": list(done.shards),
                "job_ids": list(done.job_ids),
                "kept": list(done.kept),
                "warnings": list(done.warnings),
            },
            out,
        )
        return ExitCode.OK
    if not done.shards:
        out.write(
            f"nothing to retry: every shard of {found.run_id} has a winner, is still running, or waits for an "
            "automatic retry (ddslurm status says which)\n"
        )
    else:
        out.write(f"retrying {len(done.shards)} shard(s) as array job(s) {', '.join(done.job_ids)}\n")
    write_lines(out, (f"warning: {warning}" for warning in done.warnings))
    if done.kept:
        out.write(f"not retried: {shards_named(done.kept)} already had a result, which is never replaced\n")
    return ExitCode.OK


@guarded
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
    stage ended short: as its GPU-stage result, then its CPU stage is submitted (as retry does).

    Examples:
        # Keep the rows shards 3 and 8 produced as their results
        ddslurm accept-partial ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --shards 3,8
    """
    session = command_session(ctx, as_json)
    client = session_client(session, profile)
    found = client.open(run)
    done = client.accept_partial(found, parse_shards(shards, RunLayout(found.run_dir)) or [])
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
    write_lines(session.out, lines)
    return ExitCode.OK


# --- collect, list ---


@guarded
def cmd_collect(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    local: Annotated[bool, typer.Option("--local", help="Collect in this process instead of a CPU Slurm job.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing dataset.")] = False,
    as_json: JsonOpt = False,
) -> int:
    """Merge the shards' results into one Parquet dataset (RUN/dataset); the collector's exit codes.

    Progress on a terminal: a bar over the batch files with --local, the job's elapsed time otherwise.

    Examples:
        # Merge the shards' results in a CPU Slurm job
        ddslurm collect ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # In this process, replacing an existing dataset
        ddslurm collect ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --local --overwrite
    """
    from ddslurm.collector import print_result
    from ddslurm.launcher.commands._console import FileProgress, job_spinner

    session = command_session(ctx, as_json)
    live = not session.json and session.out.isatty()
    held_err = io.StringIO()  # printed once the live display lets go of the terminal
    client = session_client(session, profile, notes=held_err if live else None)
    found = client.open(run)  # before the live display takes the terminal
    try:
        if local:
            progress = FileProgress(session.out) if live else None
            with progress.progress if progress is not None else nullcontext():
                # no progress: the collector's own lines on stderr, as in the job's log
                result = client.collect(found, local=True, overwrite=overwrite, progress=progress)
        else:
            with job_spinner(session.out, "collecting in a Slurm job") if live else nullcontext():
                result = client.collect(found, overwrite=overwrite)
    except CollectFailedError as exc:  # its error lines are said already; the exit code is the collection's
        session.err.write(held_err.getvalue())
        raise CommandFailed(collect_report(exc), said=True) from None
    session.err.write(held_err.getvalue())
    print_result(result, as_json=session.json, out=session.out)
    return ExitCode.OK
