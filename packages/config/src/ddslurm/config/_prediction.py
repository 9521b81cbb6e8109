"""The planner's choice of layout and what its cost model predicts for it (``Plan.prediction``): the dry-run bill
shows it, the report puts the measurement beside it."""

from __future__ import annotations

from typing import Literal

from ddslurm.config._base import Frozen

FactOrigin = Literal["default", "run", "tune", "run file"]
"""Where a number of the cost model came from: a stated default (nothing measured), an earlier run of this
workspace, a ``ddslurm tune`` calibration, or the run file itself."""


class FactUse(Frozen, frozen=True, kw_only=True):
    """One input of the cost model, with where it came from."""

    name: str
    """``load_s``, ``requests_per_s``, ``requests_per_record``, ``client_cpu_s_per_request``,
    ``allocation_overhead_s``, ``cpu_stage_records_per_s``."""
    subject: str
    """What it is of: a model alias (its model shape's key after a colon), or ``recipe``."""
    value: float
    origin: FactOrigin
    run_id: str | None = None
    """The run or calibration that measured it (None for a default); the latest of them when it is a median."""
    runs: int = 0
    """How many runs (or calibrations) its value rests on: their median; 0: a default."""
    note: str = ""
    """How the measurement was made to fit this run, or why it was not used (a fact measured at another capacity:
    read off its calibration's sweep, or ignored for the default); empty: used as measured."""


class LayoutChoice(Frozen, frozen=True, kw_only=True):
    """One candidate layout and its prediction."""

    allocations: int
    """GPU allocations (each pulls shards; equal to the shard count: one task per shard)."""
    replicas: tuple[int, ...]
    """Replicas per allocation of each deployment, in run-file order."""
    client_workers: int
    """Client steps per allocation."""
    two_stage: bool
    """Whether the hosted-only columns run in a CPU stage after the GPU stage."""
    gpus_at_once: int
    """The most GPUs the run holds at once (allocations running together x GPUs of one)."""
    wall_s: float
    """Predicted seconds from the first allocation's start to the last shard's result (queue waits excluded)."""
    gpu_hours: float
    """Predicted GPU-hours allocated."""
    gpu_busy: float
    """Predicted share of the GPU-hours in which the replicas had work (at their capacity)."""
    allocation_s: float = 0.0
    """Predicted seconds the longest-running GPU allocation runs (it must end within ``submission.time_limit``)."""
    shard_record_s: float = 0.0
    """Predicted seconds one shard's client takes per record (the allocation's rate shared among its client
    workers): what the planner sizes a shard's batches by (:class:`ddslurm.config.Batching`); 0: older plans."""


class Prediction(Frozen, frozen=True, kw_only=True):
    chosen: LayoutChoice
    runners_up: tuple[LayoutChoice, ...] = ()
    """The next best layouts, at most two, best first."""
    facts: tuple[FactUse, ...] = ()
    budget_gpus: int | None = None
    """The run file's ``gpus``; None: the run's own layout fields bound it."""
    deadline_s: int | None = None
    """The run file's ``deadline`` in seconds; None: none."""
    meets_deadline: bool = True
    """False: no layout within the budget was predicted to meet the deadline; the fastest was chosen."""
    rule: str = ""
    """How the chosen layout was picked, in words (the bill prints it)."""
