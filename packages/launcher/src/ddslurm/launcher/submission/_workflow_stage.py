"""The run of one stage of a Data Designer workflow: its records and name, and its place in the workflow.

Data Designer's ``CompositeWorkflow.run`` gives a stage its own ``num_records``, or else the records of the stage
before's output, or else 10 (the first stage). The first stage is what ``ddslurm submit`` submits, so the run
file's ``num_records`` must be that stage's (a run file that says another number is refused at its field, rather
than generating other rows than Data Designer would); each later stage is submitted by ``ddslurm workflow`` from
the same run file, its records by that rule.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from ddslurm.config import DD_DEFAULT_NUM_RECORDS, RunFile, WorkflowPlace
from ddslurm.launcher.cluster._doctor_checks import field_place
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.submission._recipe import LoadedWorkflow, StageRequest

NAME_MAX = 64
"""A run name's longest (the run file's ``name``)."""


def stage_run(
    run: RunFile, run_path: Path, profile_path: Path, workflow: LoadedWorkflow, stage: StageRequest | None
) -> tuple[RunFile, WorkflowPlace]:
    """The run file of the workflow's stage ``workflow.index`` (its records, its name: ``<name>-<stage number>``
    after the first) and the plan's record of its place; :class:`SubmitError` at the run file's ``num_records``
    when the first stage would make other records than the run file says."""
    index = workflow.index
    own = workflow.stages[index]
    if stage is None:  # the first stage: what `ddslurm submit` submits
        records = own.num_records or DD_DEFAULT_NUM_RECORDS
        if run.num_records != records:
            where, _ = field_place("num_records", run_path, profile_path)
            why = "its num_records" if own.num_records else "it sets no num_records: Data Designer's default"
            raise SubmitError(
                f"{where}: num_records: {run.num_records}, but the recipe is a Data Designer workflow whose first "
                f"stage {own.name!r} makes {records} records ({why}); set num_records: {records} (each later "
                "stage makes its own num_records, or the records of the stage before it)"
            )
        name = run.name
    else:
        records = own.num_records or stage.rows
        suffix = f"-{index + 1}"
        name = run.name[: NAME_MAX - len(suffix)] + suffix
    place = WorkflowPlace(
        name=workflow.name,
        stages=workflow.stages,
        index=index,
        run_file=str(run_path.resolve()),
        profile=str(profile_path.resolve()),
        previous_run=None if stage is None else str(stage.previous.root),
    )
    return msgspec.structs.replace(run, num_records=records, name=name), place
