"""Records written by compute nodes and the launcher: submissions, attempts and winners."""

from __future__ import annotations

from typing import Literal

from ddslurm.config._base import Frozen

AttemptState = Literal["running", "succeeded", "failed", "partial", "superseded"]


class FileEntry(Frozen, frozen=True, kw_only=True):
    path: str
    size: int
    sha256: str


class SubmissionRecord(Frozen, frozen=True, kw_only=True):
    """One ``sbatch`` of an array: which array job runs which shards."""

    array_job_id: str
    shards: tuple[int, ...]
    submitted_at: str
    script: str


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


class WinnerRecord(Frozen, frozen=True, kw_only=True):
    """The one published result of a shard. Written once, never replaced."""

    shard: int
    attempt: str
    rows: int
    dataset_dir: str
    files: tuple[FileEntry, ...]
    plan_sha256: str
    published_at: str
