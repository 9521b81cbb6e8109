"""The commands that start work: ``submit`` (and its dry run and ``--continue``), ``providers``, ``doctor``, ``init``,
``list``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddslurm.config import compact_ranges
from ddslurm.launcher.commands._output import ExitCode, array_json, limits_json, write_json
from ddslurm.launcher.commands._session import (
    JsonOpt,
    ProfileOpt,
    Session,
    command_session,
    guarded,
    run_layout,
    session_client,
    write_lines,
)
from ddslurm.launcher.errors import UsageError
from ddslurm.launcher.init._example import Example
from ddslurm.launcher.runs._find import list_runs, required_profile, resolve_profile, workspace_of

if TYPE_CHECKING:
    from ddslurm.launcher.submission._dry_run import DryRun

# --- submit ---


@guarded
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
    check: Annotated[
        bool,
        typer.Option(
            "--check-endpoints",
            help="First ask each hosted endpoint with the key (as providers --check): refuse the run, nothing written "
            "or submitted, when one refuses the key or does not list the model.",
        ),
    ] = False,
    accept_overrun: Annotated[
        bool,
        typer.Option(
            "--accept-overrun",
            help="Submit the run even where its prediction says it will not fit submission.time_limit (the dry "
            "run's warning: lines), which is otherwise refused.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Capture the inputs, compile the plan and submit the run's job arrays.

    Examples:
        # The plan, the arrays, the bill, the first batch script; nothing submitted
        ddslurm submit run.yaml --profile profile.yaml --dry-run

        # Submit the run, once each hosted endpoint has accepted the key
        ddslurm submit run.yaml --profile profile.yaml --check-endpoints

        # Submit the arrays that a submission stopped part-way did not submit
        ddslurm submit --continue ddslurm-work/runs/my-run-20260102-030405-a1b2c3
    """
    session = command_session(ctx, as_json)
    if continue_run:
        return _continue(session, str(run_file), profile)
    if dry_run:  # shown whole (the plan, the arrays and their limits, the bill): more than the API's Planned
        from ddslurm.launcher.submission._dry_run import dry_run as plan_dry_run
        from ddslurm.providers import check_endpoints

        profile_path = required_profile(profile, session.env, "submit")
        endpoints = check_endpoints if check else None
        done_dry = plan_dry_run(run_file, profile_path, slurm=session.slurm, env=session.env, check_endpoints=endpoints)
        return _show_dry_run(session, done_dry)
    done = session_client(session, profile).submit(run_file, check_endpoints=check, accept_overrun=accept_overrun)
    run, out = done.run, session.out
    if session.json:
        write_json(
            {
                "run_id": run.run_id,
                "run_dir": str(run.run_dir),
                "job_id": done.job_ids[0],
                "job_ids": list(done.job_ids),
                "shards": done.shards,
                "secret_env_unscanned": list(done.secret_env_unscanned),
                "warnings": list(done.warnings),
            },
            out,
        )
        return ExitCode.OK
    jobs = f"array job {done.job_ids[0]}" if len(done.job_ids) <= 1 else f"array jobs {', '.join(done.job_ids)}"
    out.write(
        f"submitted run {run.run_id}: {jobs}, {done.shards} shard(s), {done.records} records\n"
        f"  run dir: {run.run_dir}\n  next: ddslurm wait {run.run_dir}\n"
    )
    write_lines(out, (f"  note: {note}" for note in done.notes))
    write_lines(out, (f"  warning: {warning}" for warning in done.warnings))
    return ExitCode.OK


def _continue(session: Session, run: str, profile: Path | None) -> int:
    """``submit --continue RUN``: the arrays of the run's submission plan that were never submitted."""
    from ddslurm.launcher.runs._steer import continue_submission

    layout = run_layout(session, run, profile)
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
    from ddslurm.launcher.commands._console import dry_run_text
    from ddslurm.launcher.submission._bill import bill_lines

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
        write_lines(session.out, (f"warning: {warning}" for warning in done.warnings))
    return ExitCode.OK


# --- providers ---


@guarded
def cmd_providers(
    ctx: typer.Context,
    run_file: Annotated[
        Path, typer.Argument(metavar="RUN_FILE", help="The run file whose recipe names the models.", show_default=False)
    ],
    check: Annotated[
        bool, typer.Option("--check", help="Ask each hosted endpoint whether it lists the model and accepts the key.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per endpoint for --check.")] = 10.0,
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            metavar="PROFILE.yaml",
            help="The cluster profile whose python_env runs a builder-script recipe, as submit runs it. Default: the "
            "file DDSLURM_PROFILE names.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> int:
    """Show how the run's model aliases resolve, and what would stop a submit (never a key's value).

    Exit 0 when submit would accept the providers (and every --check passed), 1 when the table shows problems.

    Examples:
        # How each model alias of the run resolves, and whether its key is set
        ddslurm providers run.yaml

        # Also ask each hosted endpoint: does it list the model, take the key?
        ddslurm providers run.yaml --check --timeout 5
    """
    from ddslurm.launcher.submission._aliases import describe_aliases
    from ddslurm.providers import check_endpoints
    from ddslurm.providers.cli import print_resolution

    session = command_session(ctx, as_json)
    resolution = describe_aliases(run_file, session.env, resolve_profile(profile, session.env))
    if check:
        resolution = check_endpoints(resolution, session.env, timeout=timeout)
    return print_resolution(resolution, checked=check, as_json=session.json, out=session.out, err=session.err)


@guarded
def cmd_doctor(
    ctx: typer.Context,
    run_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="[RUN_FILE]",
            help="A run file: its jobs are checked too (compiled as submit --dry-run compiles them).",
            show_default=False,
        ),
    ] = None,
    profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> int:
    """Check the cluster profile against this cluster: partitions, GPUs, memory, account, python_env, vLLM.

    Every check is shown (ok, problem at the profile's file:line:col, or skipped and why); exit 1 when any found a
    problem. submit and submit --dry-run refuse the same problems.

    Examples:
        # Check the cluster profile against this cluster
        ddslurm doctor --profile profile.yaml

        # Also the jobs of a run file, as submit --dry-run compiles them
        ddslurm doctor --profile profile.yaml run.yaml
    """
    from ddslurm.launcher.cluster._doctor import doctor
    from ddslurm.launcher.commands._console import check_table, show

    session = command_session(ctx, as_json)
    profile_path = required_profile(profile, session.env, "doctor")
    report = doctor(profile_path, run_file, slurm=session.slurm, env=session.env)
    if session.json:
        write_json(report.as_dict(), session.out)
    else:
        show(session.out, check_table(report.checks, boxed=session.out.isatty()))
        found = len(report.problems)
        verdict = f"{found} problem(s): submit would refuse them" if found else "no problem: submit would accept it"
        write_lines(session.out, [verdict])
    return ExitCode.FAILED if report.problems else ExitCode.OK


@guarded
def cmd_init(
    ctx: typer.Context,
    directory: Annotated[
        Path,
        typer.Option("--dir", help="Where to write run.yaml and profile.yaml (created if missing).", show_default=True),
    ] = Path(),
    example: Annotated[
        Example | None,
        typer.Option(
            "--example",
            help="Also write a runnable starter recipe (build.py) and its Data Designer home: hosted (one hosted "
            "model) or mixed (a model the run serves on GPUs + a hosted judge).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            help="With --example on the embedded cluster: the port the starter's stand-in (its hosted provider) "
            "listens on, for a host that allows only some; a free one by default. Refused if taken or out of range.",
            show_default=False,
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the files init writes if they exist.")] = False,
    as_json: JsonOpt = False,
) -> int:
    """Write a run file and a cluster profile filled from this cluster (one sinfo), every field explained, and
    print the commands to run next.

    Examples:
        # A run file and a cluster profile here, filled from this cluster
        ddslurm init

        # Also a starter recipe with one hosted model, in a new directory
        ddslurm init --dir first-run --example hosted

        # A model on the run's GPUs and a hosted judge, its stand-in on port 8123
        ddslurm init --example mixed --port 8123
    """
    from ddslurm.launcher.init._command import init_command

    session = command_session(ctx, as_json)
    program = "uv run ddslurm" if session.env.get("UV") else "ddslurm"  # `uv run` sets UV for what it runs
    result = init_command(directory, slurm=session.slurm, force=force, example=example, port=port, program=program)
    if session.json:
        write_json(result.as_dict(), session.out)
    else:
        write_lines(session.out, result.lines())
    return ExitCode.OK


@guarded
def cmd_list(ctx: typer.Context, profile: ProfileOpt = None, as_json: JsonOpt = False) -> int:
    """List the runs in the workspace, newest first: state, rows produced of those requested, age.

    Examples:
        # The runs of the profile's workspace, newest first
        ddslurm list --profile profile.yaml

        # For a script
        ddslurm list --profile profile.yaml --json
    """
    from ddslurm.launcher.commands._console import run_table, show

    session = command_session(ctx, as_json)
    workspace = workspace_of(profile, session.env)
    if workspace is None:
        raise UsageError("list needs --profile (or DDSLURM_PROFILE) to find the workspace")
    runs = list_runs(workspace, session.slurm)
    if session.json:
        write_json(runs, session.out)
    else:
        show(session.out, run_table(runs, datetime.now(UTC), boxed=session.out.isatty()))
    return ExitCode.OK
