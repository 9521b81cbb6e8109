"""Records written by compute nodes and the launcher: submissions, attempts and winners."""

from __future__ import annotations

from typing import Literal

from ddslurm.config._base import Frozen

AttemptState = Literal["running", "succeeded", "failed", "partial", "superseded", "cancelled"]
"""``cancelled``: the attempt began after the whole run was cancelled and generated nothing."""


class FileEntry(Frozen, frozen=True, kw_only=True):
    path: str
    size: int
    sha256: str


SubmissionKind = Literal["initial", "retry", "auto-retry"]


class SubmissionRecord(Frozen, frozen=True, kw_only=True):
    """One ``sbatch`` of an array: task i of ``array_job_id`` runs ``shards[i]``."""

    array_job_id: str
    shards: tuple[int, ...]
    submitted_at: str
    script: str
    kind: SubmissionKind = "initial"
    after: str | None = None
    """For automatic retries: the array whose failure starts this one."""


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


class Progress(Frozen, frozen=True, kw_only=True):
    """Written by the generation step after every completed batch."""

    rows: int
    batches: int
    updated_at: str


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


class FreshRecord(Frozen, frozen=True, kw_only=True):
    """Written by ``ddslurm retry --fresh``: later attempts of the shard start from nothing, never resuming
    from these attempts' batches (which stay on disk)."""

    excluded: tuple[str, ...]
    at: str
