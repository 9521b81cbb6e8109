"""``ddslurm workflow``: carry a Data Designer workflow on from the run of one of its stages (:mod:`._workflow`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddslurm.config import RunLayout
from ddslurm.launcher.commands._output import ExitCode, write_json
from ddslurm.launcher.commands._session import JsonOpt, ProfileOpt, RunArg, command_session, guarded, session_client

if TYPE_CHECKING:
    from ddslurm.launcher.runs._workflow import StageDone


def _stage_json(stage: StageDone) -> dict[str, Any]:
    return {
        "stage": stage.place.index + 1,
        "name": stage.place.stage.name,
        "run_dir": str(stage.layout.root),
        "state": stage.state,
        "rows": stage.rows,
    }


@guarded
def cmd_workflow(
    ctx: typer.Context,
    run: RunArg,
    profile: ProfileOpt = None,
    local: Annotated[
        bool, typer.Option("--local", help="Collect each stage in this process instead of a CPU Slurm job.")
    ] = False,
    accept_overrun: Annotated[
        bool,
        typer.Option(
            "--accept-overrun",
            help="Submit a later stage even where its bill predicts it will not fit its time limit (as submit's).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Carry a Data Designer workflow on from the run of one of its stages: wait for each stage's run, collect its
    dataset, submit the next stage seeded from it; exit 0 with the last stage's dataset.

    Each step is taken once (a collected dataset is kept, the next stage's run is recorded in the run before), so
    the command can be run again after a failed stage is retried; it goes on from where the workflow stands.

    Examples:
        # Carry the workflow on from its first stage's run
        ddslurm workflow ddslurm-work/runs/my-run-20260102-030405-a1b2c3

        # Collect each stage in this process
        ddslurm workflow ddslurm-work/runs/my-run-20260102-030405-a1b2c3 --local
    """
    from ddslurm.launcher.runs._workflow import carry_on

    session = command_session(ctx, as_json)
    client = session_client(session, profile)
    layout = RunLayout(client.open(run).run_dir)

    def said(stage: StageDone) -> None:
        if session.json:
            return
        rows = "" if stage.rows is None else f", {stage.rows} rows"
        session.out.write(f"{stage.place.label()}: run {stage.layout.run_id} {stage.state}{rows}\n")
        session.out.flush()

    result = carry_on(
        layout,
        session.slurm,
        session.env,
        wait=lambda stage: client.wait(stage.root),
        local=local,
        on_stage=said,
        accept_overrun=accept_overrun,
    )
    if session.json:
        write_json(
            {
                "workflow": result.stages[0].place.name if result.stages else None,
                "stages": [_stage_json(s) for s in result.stages],
                "dataset": None if result.dataset is None else str(result.dataset),
                "message": result.message,
            },
            session.out,
        )
    else:
        (session.out if result.complete else session.err).write(f"{result.message}\n")
    return ExitCode.OK if result.complete else ExitCode.FAILED
