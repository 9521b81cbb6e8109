"""A Data Designer workflow (``DataDesigner.compose_workflow``) run as a chain of ddslurm runs, one a stage.

A builder function may return Data Designer's ``CompositeWorkflow`` instead of a config: each of its stages is then
a run of its own, planned when the stage before it is collected (its records, the seed it reads and their count
are known only then), seeded from that run's dataset exactly as Data Designer seeds a stage from the one before
(``LocalFileSeedSource`` of its Parquet files, the stage's sampling and selection strategies). Each stage's plan
records its place (:class:`WorkflowPlace`); the run of stage ``k`` records which run took stage ``k + 1``
(:class:`WorkflowNext`, ``RunLayout.workflow_next``), written once.
"""

from __future__ import annotations

from ddslurm.config._base import Frozen

DD_DEFAULT_NUM_RECORDS = 10
"""The records of a workflow stage that sets none and follows no stage (Data Designer's ``DEFAULT_NUM_RECORDS``)."""


class WorkflowStage(Frozen, frozen=True, kw_only=True):
    """One stage of the workflow as its builder added it (what the chain needs to know before running it)."""

    name: str
    num_records: int | None = None
    """The stage's own ``num_records``; None: the records of the stage before it (Data Designer's rule), or
    :data:`DD_DEFAULT_NUM_RECORDS` for the first."""
    allow_empty: bool = False
    """Data Designer's ``allow_empty``: an empty output ends the workflow (the later stages are skipped) instead of
    failing it."""


class WorkflowPlace(Frozen, frozen=True, kw_only=True):
    """Where a run stands in its workflow (``Plan.workflow``)."""

    name: str
    """The workflow's name (``compose_workflow(name=...)``)."""
    stages: tuple[WorkflowStage, ...]
    index: int
    """This run's stage, from 0."""
    run_file: str
    """The run file the first stage was submitted with (absolute): every later stage is submitted from it."""
    profile: str
    """The cluster profile it was submitted with (absolute)."""
    previous_run: str | None = None
    """The run directory of the stage before (its dataset is this run's seed); None for the first."""

    @property
    def stage(self) -> WorkflowStage:
        return self.stages[self.index]

    @property
    def last(self) -> bool:
        return self.index == len(self.stages) - 1

    def label(self) -> str:
        """``stage 2/3 'answer' of workflow 'qa'``."""
        return f"stage {self.index + 1}/{len(self.stages)} {self.stage.name!r} of workflow {self.name!r}"


class WorkflowNext(Frozen, frozen=True, kw_only=True):
    """The run that took the workflow's next stage (written once into the run of the stage before)."""

    run_dir: str
    submitted_at: str
