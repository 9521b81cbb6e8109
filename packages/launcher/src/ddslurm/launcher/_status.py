"""Run and shard states from the run directory plus one squeue and one sacct call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from ddslurm.config import (
    AttemptRecord,
    ConfigError,
    Plan,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    read_json,
)
from ddslurm.launcher._slurm import Slurm, TaskState
from ddslurm.launcher.errors import RunNotFoundError

RunState = Literal["pending", "running", "succeeded", "failed", "cancelled"]
ShardState = Literal["pending", "running", "succeeded", "partial", "failed", "cancelled", "unknown"]

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
_FAILED = {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


class ShardStatus(msgspec.Struct, kw_only=True):
    shard: int
    state: ShardState
    records: int
    rows: int | None = None
    job_id: str | None = None
    slurm_state: str | None = None
    attempt: str | None = None
    reason: str | None = None
    message: str | None = None


class RunStatus(msgspec.Struct, kw_only=True):
    run_id: str
    run_dir: str
    state: RunState
    shards: list[ShardStatus]
    records_requested: int
    records_done: int
    counts: dict[str, int] = msgspec.field(default_factory=dict)


@dataclass(slots=True)
class _Scheduler:
    live: dict[tuple[str, int | None], TaskState] = field(default_factory=dict)
    final: dict[tuple[str, int | None], TaskState] = field(default_factory=dict)


def submissions(layout: RunLayout) -> list[SubmissionRecord]:
    records = [read_json(p, SubmissionRecord) for p in sorted(layout.submissions.glob("*.json"))]
    return sorted(records, key=lambda r: int(r.array_job_id))


def _latest_attempt(layout: RunLayout, shard: int) -> AttemptRecord | None:
    best: AttemptRecord | None = None
    for path in layout.shard(shard).attempts.glob("attempt-*/attempt.json"):
        try:
            rec = read_json(path, AttemptRecord)
        except (ConfigError, OSError):
            continue
        if best is None or rec.started_at > best.started_at:
            best = rec
    return best


def _query(slurm: Slurm, job_ids: list[str]) -> _Scheduler:
    sched = _Scheduler()
    for t in slurm.squeue(job_ids):
        sched.live[(t.job_id, t.task)] = t
    for t in slurm.sacct(job_ids):
        sched.final[(t.job_id, t.task)] = t
    return sched


def shard_status(layout: RunLayout, plan: Plan, index: int, job: str | None, sched: _Scheduler) -> ShardStatus:
    spec = plan.shards[index]
    status = ShardStatus(shard=index, state="pending", records=spec.num_records, job_id=job)
    try:
        winner = read_json(layout.shard(index).winner, WinnerRecord)
    except FileNotFoundError:
        winner = None
    attempt = _latest_attempt(layout, index)
    if attempt is not None:
        status.attempt, status.reason, status.message = attempt.attempt, attempt.reason, attempt.message
        status.rows = attempt.rows
    if winner is not None:
        status.state, status.rows, status.attempt = "succeeded", winner.rows, winner.attempt
        status.reason = status.message = None
        return status
    if job is None:
        return status
    key = (job, index)
    live = sched.live.get(key) or sched.live.get((job, None))
    final = sched.final.get(key) or sched.final.get((job, None))
    if live is not None:
        status.slurm_state = live.state
        status.state = "running" if live.state in _RUNNING else "pending"
        return status
    if final is not None:
        status.slurm_state = final.state
        if final.state in _PENDING:
            status.state = "pending"
        elif final.state in _RUNNING:
            status.state = "running"
        elif final.state == "CANCELLED":
            status.state = "cancelled"
        elif attempt is not None and attempt.state == "partial":
            status.state = "partial"
        elif final.state in _FAILED or final.state == "COMPLETED":
            status.state = "failed"
            if status.reason is None:
                status.reason = final.state.lower() if final.state != "COMPLETED" else "no_result"
        return status
    # Neither squeue nor sacct knows the task yet (accounting lag): not lost, just not visible.
    status.state = "unknown"
    return status


def run_state(shards: list[ShardStatus]) -> RunState:
    states = {s.state for s in shards}
    if states == {"succeeded"}:
        return "succeeded"
    if "running" in states:
        return "running"
    if states & {"pending", "unknown"}:
        return "running" if "succeeded" in states or "failed" in states else "pending"
    if states & {"failed", "partial"}:
        return "failed"
    return "cancelled"


def run_status(layout: RunLayout, slurm: Slurm) -> RunStatus:
    plan = read_json(layout.plan, Plan)
    subs = submissions(layout)
    job_for: dict[int, str] = {}
    for sub in subs:
        for shard in sub.shards:
            job_for[shard] = sub.array_job_id
    sched = _query(slurm, sorted({s.array_job_id for s in subs}, key=int))
    shards = [shard_status(layout, plan, s.index, job_for.get(s.index), sched) for s in plan.shards]
    counts: dict[str, int] = {}
    for s in shards:
        counts[s.state] = counts.get(s.state, 0) + 1
    done = sum(s.rows or 0 for s in shards if s.state == "succeeded")
    return RunStatus(
        run_id=plan.run_id,
        run_dir=str(layout.root),
        state=run_state(shards),
        shards=shards,
        records_requested=plan.num_records,
        records_done=done,
        counts=counts,
    )


def find_run(ref: str, workspace: Path | None) -> RunLayout:
    """A run directory given as a path, or a run id inside the workspace."""
    candidate = Path(ref)
    if (candidate / "run.json").is_file():
        return RunLayout(candidate.resolve())
    if workspace is not None:
        layout = RunLayout.in_workspace(workspace, ref)
        if layout.plan.is_file():
            return layout
    where = f" or in {workspace / 'runs'}" if workspace else " (pass a run directory, or --profile to look up ids)"
    raise RunNotFoundError(f"no run {ref!r} found as a directory{where}")
