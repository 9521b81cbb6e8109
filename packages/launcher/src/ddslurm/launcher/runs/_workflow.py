"""``ddslurm workflow RUN``: carry a Data Designer workflow on, one run a stage (docs/recipes.md#workflows).

From the run of any of its stages: wait for the stage's run, collect its dataset, submit the next stage seeded from
it (:func:`next_stage`), and so on to the last stage's dataset. Every step is one a user can also take by hand
(``wait``, ``collect``, ``retry``), and each is done once: a collected dataset is kept, and the run that took the
next stage is written once into the run before (``workflow-next.json``, under its lock), so running the command
again, or from another shell, follows the same runs. A stage's run that fails stops the command, which says how
to retry it and go on.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from ddslurm.collector import CollectResult
from ddslurm.config import (
    RunLayout,
    WorkflowNext,
    WorkflowPlace,
    encode,
    exclusive_lock,
    publish_once,
    read_json,
    read_plan,
)
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import LauncherError
from ddslurm.launcher.runs._collect import collect_run, collected
from ddslurm.launcher.runs._status_model import RunStatus
from ddslurm.launcher.submission._recipe import StageRequest
from ddslurm.launcher.submission._submit import submit


@dataclass(frozen=True, slots=True)
class StageDone:
    """One stage's run, as the command left it."""

    place: WorkflowPlace
    layout: RunLayout
    state: str
    """The run's state (``succeeded`` ...); ``skipped``: an earlier stage was empty and allowed to be."""
    rows: int | None = None
    """The rows of its collected dataset; None: not collected."""


@dataclass(frozen=True, slots=True)
class WorkflowResult:
    stages: tuple[StageDone, ...]
    dataset: Path | None
    """The last stage's dataset; None when the workflow did not get there."""
    message: str

    @property
    def complete(self) -> bool:
        """The workflow ended as Data Designer's would: at its last stage's dataset, or at an empty stage that
        allows it (the later stages skipped)."""
        return self.dataset is not None or (bool(self.stages) and self.stages[-1].state == "skipped")


def workflow_place(layout: RunLayout) -> WorkflowPlace:
    """The run's place in its workflow; :class:`LauncherError` for a run that is no workflow's stage."""
    place = read_plan(layout.plan).workflow
    if place is None:
        raise LauncherError(
            f"run {layout.run_id} is not a stage of a Data Designer workflow (its recipe's builder returns a config, "
            f"not compose_workflow(...)): `ddslurm wait {layout.root}` follows it"
        )
    return place


def next_stage(
    layout: RunLayout,
    place: WorkflowPlace,
    rows: int,
    submit_stage: Callable[[Path, Path, StageRequest], RunLayout],
) -> RunLayout:
    """The run of the stage after ``layout``'s (whose dataset holds ``rows``): the one already recorded, or one
    ``submit_stage`` submits now and that is recorded once, under the run's workflow lock."""
    with exclusive_lock(layout.workflow_lock):
        if layout.workflow_next.exists():
            return RunLayout(Path(read_json(layout.workflow_next, WorkflowNext).run_dir))
        request = StageRequest(
            index=place.index + 1, previous=layout, rows=rows, stages=tuple(s.name for s in place.stages)
        )
        submitted = submit_stage(Path(place.run_file), Path(place.profile), request)
        record = WorkflowNext(run_dir=str(submitted.root), submitted_at=datetime.now(UTC).isoformat())
        publish_once(layout.workflow_next, encode(record))
        return submitted


def _dataset(layout: RunLayout, slurm: Slurm, local: bool) -> CollectResult:
    done = collected(layout)
    if done is not None:
        return done
    # what the collection says on the way is not the command's output; its error (CollectFailedError) is
    return collect_run(layout, slurm, local=local, err=io.StringIO())


def stage_submitter(
    slurm: Slurm, env: Mapping[str, str], *, accept_overrun: bool = False
) -> Callable[[Path, Path, StageRequest], RunLayout]:
    """How ``carry_on`` submits a later stage: ``submit`` of the workflow's run file with the stage's request;
    ``accept_overrun`` as ``submit --accept-overrun``."""

    def submitted(run_file: Path, profile: Path, request: StageRequest) -> RunLayout:
        done = submit(run_file, profile, slurm=slurm, env=env, stage=request, accept_overrun=accept_overrun)
        return RunLayout(done.layout.root)

    return submitted


def carry_on(
    layout: RunLayout,
    slurm: Slurm,
    env: Mapping[str, str],
    *,
    wait: Callable[[RunLayout], RunStatus],
    local: bool = False,
    on_stage: Callable[[StageDone], None] | None = None,
    submit_stage: Callable[[Path, Path, StageRequest], RunLayout] | None = None,
    accept_overrun: bool = False,
) -> WorkflowResult:
    """Follow the workflow from ``layout``'s stage to its end (module docstring): ``wait`` follows one run to its
    end (``ddslurm wait``'s), ``local`` collects in this process rather than in a Slurm job; ``on_stage`` is told
    of each stage as it is done; ``accept_overrun``: a later stage predicted not to fit its time limit is submitted
    all the same (``submit --accept-overrun``), else refused as ``submit`` refuses it."""

    stages: list[StageDone] = []

    def done(stage: StageDone) -> None:
        stages.append(stage)
        if on_stage is not None:
            on_stage(stage)

    while True:
        place = workflow_place(layout)
        status = wait(layout)
        if status.state != "succeeded":
            done(StageDone(place, layout, status.state))
            message = (
                f"{place.label()} (run {layout.run_id}) {status.state}: `ddslurm status {layout.root}` says why, "
                f"`ddslurm retry {layout.root}` makes new attempts (resuming their saved batches); then run "
                f"`ddslurm workflow {layout.root}` again"
            )
            return WorkflowResult(tuple(stages), None, message)
        result = _dataset(layout, slurm, local)
        done(StageDone(place, layout, status.state, result.rows))
        if place.last:
            return WorkflowResult(tuple(stages), result.dataset, f"workflow {place.name!r} done: {result.dataset}")
        if result.rows == 0:
            if not place.stage.allow_empty:
                message = f"{place.label()} produced an empty output (add_stage(..., allow_empty=True) allows it)"
                return WorkflowResult(tuple(stages), None, message)
            for index in range(place.index + 1, len(place.stages)):
                skipped = msgspec.structs.replace(place, index=index)
                done(StageDone(skipped, layout, "skipped"))
            message = f"{place.label()} is empty (allow_empty): the later stages are skipped, as Data Designer does"
            return WorkflowResult(tuple(stages), None, message)
        submitted = submit_stage or stage_submitter(slurm, env, accept_overrun=accept_overrun)
        layout = next_stage(layout, place, result.rows, submitted)
