"""Records written by compute nodes and the launcher: submissions, attempts and winners."""

from __future__ import annotations

from typing import Literal

from ddslurm.config._base import Frozen
from ddslurm.config._files import sha256_bytes

AttemptState = Literal["running", "succeeded", "failed", "partial", "superseded", "cancelled"]
"""``cancelled``: the attempt began after the whole run was cancelled and generated nothing."""


class FileEntry(Frozen, frozen=True, kw_only=True):
    path: str
    size: int
    sha256: str

    def holds(self, data: bytes) -> bool:
        """``data`` is this file as it was recorded: its size and sha256."""
        return len(data) == self.size and sha256_bytes(data) == self.sha256


SubmissionKind = Literal["initial", "retry", "auto-retry"]


class SubmissionRecord(Frozen, frozen=True, kw_only=True):
    """One ``sbatch`` of an array: task i of ``array_job_id`` runs ``shards[i]``, or, for a pulling array
    (``tasks`` set), each of its ``tasks`` allocations claims shards of ``shards`` until none is left."""

    array_job_id: str
    shards: tuple[int, ...]
    tasks: int | None = None
    """Allocations of a pulling array (servers kept warm across the shards each claims); None: one task per
    shard."""
    submitted_at: str
    script: str
    kind: SubmissionKind = "initial"
    after: str | None = None
    """For automatic retries: the array whose failure starts this one."""
    plan_index: int | None = None
    """The array of the run's submission plan (``submit-plan.json``) this sbatch made; None for ``ddslurm retry``."""
    stage: int | None = None
    """For a two-stage run: 0 for a GPU-stage array, 1 for a CPU-stage array; None for a single-stage run."""
    after_any: tuple[str, ...] = ()
    """A CPU-stage array: the arrays it starts after, whatever they ended (``--dependency=afterany``)."""


class PlannedArray(Frozen, frozen=True, kw_only=True):
    """One sbatch of a submission plan: an array whose task i runs ``shards[i]``, or whose ``tasks`` allocations
    pull shards of ``shards``."""

    index: int
    kind: SubmissionKind
    shards: tuple[int, ...]
    tasks: int | None = None
    """Allocations of a pulling array; None: one task per shard."""
    array: str
    """The ``--array=`` spec (``0-1000%8``)."""
    after: int | None = None
    """For automatic retries: the planned array whose failure starts this one (``--dependency=afternotok``)."""
    script: str
    """The batch script this array is submitted from (written just before its sbatch)."""
    stage: int | None = None
    """For a two-stage run: 0 for a GPU-stage array, 1 for a CPU-stage array (a pulling array of CPU-only
    allocations); None for a single-stage run."""
    after_any: tuple[int, ...] = ()
    """A CPU-stage array: the planned arrays it starts after, however they ended (``--dependency=afterany``):
    its GPU array and the previous CPU array over the same shards."""


class LimitCheck(Frozen, frozen=True, kw_only=True):
    """One scheduler limit a submission was checked against."""

    name: str
    """As Slurm names it: ``MaxJobCount``, ``MaxSubmitJobs``, ``MaxSubmitJobsPerUser``, ``GrpSubmitJobs``, ..."""
    scope: str
    """Where it is set: ``cluster``, ``association root/root``, ``QOS normal (per user)``, ..."""
    limit: int
    used: int
    """Jobs (array tasks each count) that counted against it when the submission was checked."""
    usable: int
    """What the headroom rule left for this submission: a fraction of ``limit - used``."""


class SubmitPlanRecord(Frozen, frozen=True, kw_only=True):
    """``submit-plan.json``: every array the run's submission makes, written once before the first sbatch.

    Each array submitted has a submission record naming its ``plan_index``; the planned arrays without one
    were not submitted (``ddslurm submit --continue`` submits them)."""

    created_at: str
    arrays: tuple[PlannedArray, ...]
    tasks: int
    """Array tasks of all arrays together: each counts as a job against the scheduler's limits."""
    max_array_size: int
    headroom: float
    """The fraction of what is left under each limit that a submission may use."""
    limits: tuple[LimitCheck, ...] = ()
    notes: tuple[str, ...] = ()
    """What was not checked, and why (``association and QOS limits are not enforced ...``)."""


class AttemptRecord(Frozen, frozen=True, kw_only=True):
    shard: int
    attempt: str
    job_id: str
    node: str
    state: AttemptState
    started_at: str
    ended_at: str | None = None
    reason: str | None = None
    message: str | None = None
    rows: int | None = None
    requested_rows: int | None = None
    resumed_from: str | None = None
    """The earlier attempt whose completed batches this attempt continued from."""
    resumed_rows: int = 0
    client_runs: int = 0
    retryable: bool = False
    """Whether running the generation step again (servers kept) may succeed."""
    slurm_log: str | None = None
    """The array task's batch output file (``logs/slurm-<array>_<task>.out``)."""
    allocation: str | None = None
    """For an attempt of a pulling allocation: the allocation's directory (``allocations/<job_id>``), which holds
    the model servers' and proxies' logs shared by every shard the allocation ran."""
    spare: bool = False
    """Begun for a pulling allocation's spare client: its client waited for its endpoints (a worker's slot, when a
    worker's shard drained or ended) without generating, until :attr:`generating_at`."""
    generating_at: str | None = None
    """When the attempt's client began generating (its endpoints there, its first client run counted); None
    before. A spare without it is still waiting: ``status`` shows its shard ``waiting``, the report its wait."""


class BusySpan(Frozen, frozen=True, kw_only=True):
    """One span in which one model server (a replica) had at least one request in flight through its proxy: a line
    of the replica's ``busy-<alias>-<i>.jsonl`` (:func:`~ddslurm.config.busy_log`), in seconds since the epoch (the
    node's clock)."""

    start: float
    end: float


class Progress(Frozen, frozen=True, kw_only=True):
    """Written by the generation step after every completed batch, and while a batch is generated."""

    rows: int
    """Rows of the completed batches on disk."""
    batches: int
    updated_at: str
    in_batch: int = 0
    """Records of the batch being generated, estimated from Data Designer's per-cell progress (completed cells of
    its LLM columns since the last batch, over the number of those columns); never a whole batch, 0 between
    batches. ``rows + in_batch`` is what status shows while the attempt runs."""


class WinnerRecord(Frozen, frozen=True, kw_only=True):
    """The one published result of a shard. Written once, never replaced."""

    shard: int
    attempt: str
    rows: int
    dataset_dir: str
    files: tuple[FileEntry, ...]
    plan_sha256: str
    published_at: str
    partial: bool = False
    """A short shard the user accepted explicitly (``ddslurm accept-partial``)."""


class CancelRecord(Frozen, frozen=True, kw_only=True):
    """``ddslurm cancel`` of a whole run (written once, before the scheduler is asked to cancel anything)."""

    cancelled_at: str
    array_job_ids: tuple[str, ...]
    """Every array of the run when it was cancelled, pending automatic retries included."""


class ClaimRecord(Frozen, frozen=True, kw_only=True):
    """``shards/shard-N/claims/<array_job_id>.json``: the allocation of a pulling array that took the shard.

    Published without replacing (like a winner), so each shard is claimed by exactly one allocation per array,
    whatever the races and kills; a requeued allocation (same job id) takes its own claims again."""

    shard: int
    array_job_id: str
    task: int
    job_id: str
    node: str
    claimed_at: str


class SlotsRecord(Frozen, frozen=True, kw_only=True):
    """``slots/<array_job_id>/task-<task>.json``: the free worker slots of one allocation of a pulling
    array while it waits for a shard, so that a sibling's spare client leaves the next shard to it. Rewritten
    (atomically) at least every heartbeat while ``free`` is above 0, removed when it has none or exits; an entry
    whose ``updated_at`` is older than a few seconds (a crashed allocation's) counts as gone."""

    array_job_id: str
    task: int
    job_id: str
    node: str
    pid: int
    free: int
    """Worker slots that have no shard and no spare to take one: each would claim the next shard."""
    updated_at: float
    """Seconds since the epoch (the allocation's clock) of the last rewrite: its heartbeat."""


class ShardCancelRecord(Frozen, frozen=True, kw_only=True):
    """``shards/shard-N/cancelled.json``: ``ddslurm cancel --shards`` of a shard run by pulling allocations, which
    keep running their other shards: the allocation stops this shard's generation step and claims it no more."""

    cancelled_at: str


class FreshRecord(Frozen, frozen=True, kw_only=True):
    """Written by ``ddslurm retry --fresh``: later attempts of the shard start from nothing, never resuming
    from these attempts' batches (which stay on disk)."""

    excluded: tuple[str, ...]
    at: str
