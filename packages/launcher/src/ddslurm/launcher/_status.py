"""Run and shard states from the run directory plus one squeue and one sacct call, whatever the shard count."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import msgspec

from ddslurm.config import (
    AttemptRecord,
    ConfigError,
    Plan,
    Progress,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    read_json,
    read_plan,
    read_tail,
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
    rate: float | None = None
    """Records per second of the running attempt, from its progress file."""
    job_id: str | None = None
    slurm_state: str | None = None
    attempt: str | None = None
    attempts: int = 0
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
class Scheduler:
    """One squeue and one sacct answer, keyed by (array job id, task id)."""

    live: dict[tuple[str, int | None], TaskState] = field(default_factory=dict)
    final: dict[tuple[str, int | None], TaskState] = field(default_factory=dict)

    def state_of(self, job: str, task: int) -> TaskState | None:
        return (
            self.live.get((job, task))
            or self.live.get((job, None))
            or self.final.get((job, task))
            or self.final.get((job, None))
        )


def submissions(layout: RunLayout) -> list[SubmissionRecord]:
    records = [read_json(p, SubmissionRecord) for p in sorted(layout.submissions.glob("*.json"))]
    return sorted(records, key=lambda r: int(r.array_job_id))


def attempt_records(layout: RunLayout, shard: int) -> list[AttemptRecord]:
    records: list[AttemptRecord] = []
    for path in layout.shard(shard).attempts.glob("attempt-*/attempt.json"):
        try:
            records.append(read_json(path, AttemptRecord))
        except (ConfigError, OSError):
            continue
    return sorted(records, key=lambda r: r.started_at)


def query(slurm: Slurm, subs: list[SubmissionRecord]) -> Scheduler:
    job_ids = sorted({s.array_job_id for s in subs}, key=int)
    sched = Scheduler()
    for t in slurm.squeue(job_ids):
        sched.live[(t.job_id, t.task)] = t
    for t in slurm.sacct(job_ids):
        sched.final.setdefault((t.job_id, t.task), t)
    return sched


def _progress(layout: RunLayout, shard: int, attempt: AttemptRecord, now: datetime) -> tuple[int | None, float | None]:
    try:
        progress = read_json(layout.shard(shard).attempt(attempt.attempt).progress, Progress)
    except (FileNotFoundError, ConfigError):
        return None, None
    elapsed = (now - datetime.fromisoformat(attempt.started_at)).total_seconds()
    new_rows = progress.rows - attempt.resumed_rows
    return progress.rows, round(new_rows / elapsed, 2) if elapsed > 0 else None


def _scheduler_view(
    covering: list[tuple[SubmissionRecord, int]], sched: Scheduler
) -> tuple[str | None, TaskState | None]:
    """The job that speaks for a shard now: a live task first, else the newest with a final state; an
    automatic retry still waiting for its dependency counts only once every earlier array has ended."""
    newest: tuple[str | None, TaskState | None] = (None, None)
    for sub, task in reversed(covering):
        state = sched.state_of(sub.array_job_id, task)
        job = f"{sub.array_job_id}_{task}"
        if state is None:
            if newest == (None, None):
                newest = (job, None)
            continue
        if state.state in _RUNNING:
            return job, state
        waiting_on_dependency = state.state in _PENDING and "Dependency" in state.reason
        if state.state in _PENDING and not waiting_on_dependency:
            return job, state
        if sub.kind == "auto-retry" and state.state == "CANCELLED" and newest[1] is None:
            continue  # Slurm cancelled a retry whose dependency can never be met: nothing failed before it
        if newest[1] is None:
            newest = (job, state)
    return newest


def shard_status(
    layout: RunLayout,
    plan: Plan,
    index: int,
    covering: list[tuple[SubmissionRecord, int]],
    sched: Scheduler,
    now: datetime,
) -> ShardStatus:
    spec = plan.shards[index]
    status = ShardStatus(shard=index, state="pending", records=spec.num_records)
    attempts = attempt_records(layout, index)
    status.attempts = len(attempts)
    try:
        winner = read_json(layout.shard(index).winner, WinnerRecord)
    except FileNotFoundError:
        winner = None
    latest = attempts[-1] if attempts else None
    if latest is not None:
        status.attempt, status.reason, status.message, status.rows = (
            latest.attempt,
            latest.reason,
            latest.message,
            latest.rows,
        )
    if winner is not None:
        status.state, status.rows, status.attempt = "succeeded", winner.rows, winner.attempt
        status.job_id = next((a.job_id for a in attempts if a.attempt == winner.attempt), None)
        status.reason = status.message = None
        return status
    job, state = _scheduler_view(covering, sched)
    status.job_id = job
    if job is None:
        return status
    if state is None:
        status.state = "unknown"  # neither squeue nor sacct knows it yet (accounting lag): not lost
        return status
    status.slurm_state = state.state
    if state.state in _RUNNING:
        status.state = "running"
        if latest is not None and latest.state == "running":
            status.rows, status.rate = _progress(layout, index, latest, now)
    elif state.state in _PENDING:
        status.state = "pending"
    elif latest is not None and latest.state == "partial":
        status.state = "partial"
    elif state.state == "CANCELLED":
        status.state = "cancelled"
        status.reason = status.reason or "cancelled"
    else:
        status.state = "failed"
        if status.reason is None or (latest is not None and latest.state == "running"):
            status.reason = state.state.lower() if state.state in _FAILED else "no_result"
            status.message = _tail(layout.logs / f"slurm-{job}.out") or status.message
    return status


def _tail(path: Path, lines: int = 8) -> str | None:
    """The end of a batch output file: why a task failed before it could write an attempt record."""
    tail = read_tail(path, lines, 16384).strip()
    return f"last lines of {path}:\n{tail}" if tail else None


def run_state(shards: list[ShardStatus]) -> RunState:
    states = {s.state for s in shards}
    if states == {"succeeded"}:
        return "succeeded"
    if "running" in states:
        return "running"
    if states & {"pending", "unknown"}:
        return "running" if states & {"succeeded", "failed", "partial", "cancelled"} else "pending"
    if states & {"failed", "partial"}:
        return "failed"
    return "cancelled"


def covering_tasks(subs: list[SubmissionRecord]) -> dict[int, list[tuple[SubmissionRecord, int]]]:
    """For each shard, every (submission, task id) that ran or will run it, oldest first."""
    out: dict[int, list[tuple[SubmissionRecord, int]]] = {}
    for sub in subs:
        for task, shard in enumerate(sub.shards):
            out.setdefault(shard, []).append((sub, task))
    return out


def run_status(layout: RunLayout, slurm: Slurm, *, now: datetime | None = None) -> RunStatus:
    plan = read_plan(layout.plan)
    subs = submissions(layout)
    covering = covering_tasks(subs)
    sched = query(slurm, subs)
    moment = now or datetime.now(UTC)
    shards = [shard_status(layout, plan, s.index, covering.get(s.index, []), sched, moment) for s in plan.shards]
    counts: dict[str, int] = {}
    for s in shards:
        counts[s.state] = counts.get(s.state, 0) + 1
    done = sum(s.rows or 0 for s in shards if s.state in {"succeeded", "running"})
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
