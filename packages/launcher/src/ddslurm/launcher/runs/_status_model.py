"""What ``status`` answers: the states of a run and of a shard, and the records of a run, a shard, a stage and a
hosted key that :func:`~ddslurm.launcher.runs._status.run_status` fills."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from ddslurm.config import RunLayout

RunState = Literal["pending", "running", "succeeded", "failed", "cancelled", "incomplete"]
"""``incomplete``: the submission stopped part-way (arrays of its plan were never submitted) and the run has not
succeeded: ``ddslurm submit --continue`` submits the rest, ``ddslurm cancel`` cancels what was submitted."""
TERMINAL: frozenset[RunState] = frozenset({"succeeded", "failed", "cancelled", "incomplete"})
"""The run states that change only when someone acts (``retry``, ``submit --continue``, ``accept-partial``):
``wait`` and ``status --watch`` stop at them."""
ShardState = Literal[
    "pending",
    "waiting",
    "running",
    "draining",
    "succeeded",
    "partial",
    "failed",
    "cancelled",
    "corrupt",
    "unknown",
    "unsubmitted",
]
"""``waiting``: a running pulling allocation began the shard's attempt for a spare client, which waits for one of
the allocation's worker slots (``client_workers``) and generates nothing until then.
``draining``: the shard's last records are in flight in a pulling allocation, which gave its worker slot to a spare
(the spare sets up meanwhile); it still generates, outside the allocation's ``client_workers``.
``corrupt``: the shard has a winner whose files no longer verify; it counts as failed, never as succeeded.
``unsubmitted``: no array of the run covers the shard (its submission stopped before it)."""
StageName = Literal["gpu", "cpu"]
STAGE_NAMES: tuple[StageName, StageName] = ("gpu", "cpu")
"""A two-stage run's stages by index: 0 the GPU stage, 1 the CPU stage."""


class ShardStatus(msgspec.Struct, kw_only=True):
    shard: int
    state: ShardState
    records: int
    rows: int | None = None
    rate: float | None = None
    """Records per second of the running attempt, from its progress file."""
    job_id: str | None = None
    """The array task (``<array job>_<task>``) that ran the attempt shown, or that runs or will run the shard."""
    slurm_state: str | None = None
    pending_reason: str | None = None
    """Why Slurm keeps a pending task waiting (squeue's reason: ``Resources``, ``Priority``, ``Dependency``,
    ``JobArrayTaskLimit``, ...)."""
    attempt: str | None = None
    """The id of the attempt shown (``attempt-<Slurm job id>``): the winner, else the latest."""
    attempts: int = 0
    """How many attempts the shard has had (in a two-stage run: in the stage shown)."""
    attempt_number: int | None = None
    """Which attempt :attr:`attempt` is, counted from 1 in the order the shard's attempts (of that stage) began."""
    reason: str | None = None
    message: str | None = None
    stage: StageName | None = None
    """A two-stage run's shard: the stage its state comes from (``gpu`` until its GPU stage has a result, then
    ``cpu``); None for a single-stage run."""
    stage_rows: list[int] | None = None
    """A two-stage run's shard: the rows done in each stage, GPU stage first (a stage's result, or its running
    attempt's progress); a GPU-stage result stays counted while the CPU stage waits. None for a single-stage run."""


class StageProgress(msgspec.Struct, kw_only=True):
    """One stage of a two-stage run over all its shards."""

    stage: StageName
    rows_done: int
    """The rows of every shard's result of this stage and of the stage's running attempts."""
    records: int
    """The rows the stage makes when every shard has its result: the run's records."""
    shards_done: int
    """Shards with a result of this stage."""


class KeyStatus(msgspec.Struct, kw_only=True):
    """One hosted key of the run so far: what its clients' gates sent and were answered (every attempt), what
    that cost by the run's price file, and the limits the clients learned of it together."""

    provider: str
    key_env: str | None
    requests: int
    limited: int
    """Answered 429."""
    failed: int
    unanswered: int
    input_tokens: int
    output_tokens: int
    unreached: int = 0
    """Could not be delivered (refused, or closed before an answer): not among ``requests``."""
    cost: float | None
    """In ``currency``; None without a price file, or with no price for any of its models."""
    currency: str | None
    requests_per_minute: int | None
    """What the provider's headers say the key admits a minute (or the run file's cap), None: not known yet."""
    in_flight: float | None
    """The requests at once the clients' shared budget grants the key now."""


class RunStatus(msgspec.Struct, kw_only=True):
    run_id: str
    run_dir: str
    state: RunState
    shards: list[ShardStatus]
    records_requested: int
    records_done: int
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    cancelled_at: str | None = None
    """When ``ddslurm cancel`` cancelled the whole run (its cancel record); ``retry --resume-cancelled`` clears it."""
    submission_incomplete: bool = False
    """Arrays of the run's submission plan were never submitted (and the run was not cancelled since)."""
    unsubmitted_arrays: int = 0
    """How many planned arrays were never submitted (automatic retry arrays included)."""
    name: str = ""
    """The run's name (the run file's ``name``)."""
    submitted_at: str | None = None
    """When the run's first array was submitted (None before any was)."""
    stages: list[StageProgress] = msgspec.field(default_factory=list)
    """A two-stage run's stages, GPU stage first (empty for a single-stage run)."""
    progress: float = 0.0
    """The fraction of the run's work done, 0 to 1: ``records_done`` over ``records_requested``, or in a two-stage
    run the rows done of both stages over the rows of both (twice the records)."""
    hosted: list[KeyStatus] = msgspec.field(default_factory=list)
    """The run's hosted keys (:func:`~ddslurm.launcher.runs._status.key_statuses`); empty for a run without hosted
    models."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A run directory whose records cannot be read (written by another ddslurm version, or damaged)."""

    layout: RunLayout
    error: str
