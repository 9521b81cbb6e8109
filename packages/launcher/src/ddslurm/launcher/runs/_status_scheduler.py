"""What Slurm says about a run's arrays: one squeue and one sacct answer (:class:`Scheduler`), the Slurm states
ddslurm tells apart, the tasks that ran or will run each shard and the job that speaks for a shard now."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddslurm.config import ArrayTask, RunLayout, SubmissionRecord
from ddslurm.launcher.cluster._slurm import Slurm, TaskState
from ddslurm.launcher.runs._records import claimed_by

PENDING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"})
"""Slurm states of a task that has not started (or waits to run again)."""
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
"""Slurm states of a task that runs."""
FAILED = {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
"""Slurm states of a task that ended failed."""
REQUEUED = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
"""Slurm states of a task that Slurm requeued."""
_LEFT_THE_QUEUE = "requeued, then left the queue before it ran again"


@dataclass(slots=True)
class Scheduler:
    """One squeue and one sacct answer, keyed by (array job id, task id)."""

    live: dict[tuple[str, int | None], TaskState] = field(default_factory=dict)
    final: dict[tuple[str, int | None], TaskState] = field(default_factory=dict)
    earlier: dict[tuple[str, int | None], list[TaskState]] = field(default_factory=dict)
    """Earlier runs of a task that Slurm requeued (``sacct --duplicates``), oldest first."""

    def ran_before(self, job: str, task: int) -> list[TaskState]:
        return self.earlier.get((job, task), [])

    def state_of(self, job: str, task: int) -> TaskState | None:
        return (
            self.live.get((job, task))
            or self.live.get((job, None))
            or self.final.get((job, task))
            or self.final.get((job, None))
        )

    def accounting_of(self, job: str, task: int) -> TaskState | None:
        """What sacct says about a task; for a task pending again after a requeue, why it was requeued."""
        return self.final.get((job, task)) or self.final.get((job, None))


def query(slurm: Slurm, subs: list[SubmissionRecord]) -> Scheduler:
    job_ids = sorted({s.array_job_id for s in subs}, key=int)
    sched = Scheduler()
    for t in slurm.squeue(job_ids):
        sched.live[(t.job_id, t.task)] = t
    for t in slurm.sacct(job_ids):  # every run of a task, oldest first: the last one is the latest
        key = (t.job_id, t.task)
        if key in sched.final:
            sched.earlier.setdefault(key, []).append(sched.final[key])
        sched.final[key] = t
    for key, t in list(sched.final.items()):
        if t.state in REQUEUED and key not in sched.live and (key[0], None) not in sched.live:
            # Requeued, then gone from the queue before it ran again: cancelled while pending, which Slurm 22.05
            # records nowhere (sacct keeps the REQUEUED row of the run before as the task's latest).
            sched.earlier.setdefault(key, []).append(t)
            sched.final[key] = TaskState(
                job_id=t.job_id, task=t.task, state="CANCELLED", reason=_LEFT_THE_QUEUE, exit_code=t.exit_code
            )
    return sched


POOL = -1
"""The task of a shard no allocation of a pulling array has claimed (yet): the array as a whole speaks for it."""

_SEVERITY = ("COMPLETED", "CANCELLED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL")


def pool_state(sub: SubmissionRecord, sched: Scheduler) -> TaskState | None:
    """A pulling array seen from a shard none of its allocations claimed: pending while any allocation runs or
    waits (it may still pull the shard), else the most telling end of its allocations (None: Slurm knows none)."""
    states = [sched.state_of(sub.array_job_id, t) for t in range(sub.tasks or 0)]
    known = [s for s in states if s is not None]
    if not known:
        return None
    live = [s for s in known if s.state in RUNNING | PENDING]
    if live:
        running = sum(s.state in RUNNING for s in live)
        reason = (
            f"waiting for one of {running} running allocation(s) of array {sub.array_job_id} to pull it"
            if running
            else next((s.reason for s in live if s.reason), "")
        )
        return TaskState(job_id=sub.array_job_id, task=None, state="PENDING", reason=reason)
    if len(known) < len(states):
        return None
    worst = max(known, key=lambda s: _SEVERITY.index(s.state) if s.state in _SEVERITY else len(_SEVERITY))
    return TaskState(job_id=sub.array_job_id, task=None, state=worst.state, reason="not_claimed")


def scheduler_view(
    covering: list[tuple[SubmissionRecord, int]], sched: Scheduler
) -> tuple[str | None, TaskState | None]:
    """The job that speaks for a shard now: a live task first, else the newest with a final state; an
    automatic retry still waiting for its dependency counts only once every earlier array has ended."""
    newest: tuple[str | None, TaskState | None] = (None, None)
    for sub, task in reversed(covering):
        if task == POOL:
            state = pool_state(sub, sched)
            job = f"{sub.array_job_id}_[0-{(sub.tasks or 1) - 1}]"
        else:
            state = sched.state_of(sub.array_job_id, task)
            job = str(ArrayTask(sub.array_job_id, task))
        if state is None:
            if newest == (None, None):
                newest = (job, None)
            continue
        if state.state in RUNNING:
            return job, state
        waiting_on_dependency = state.state in PENDING and "Dependency" in state.reason
        if state.state in PENDING and not waiting_on_dependency:
            return job, state
        if sub.kind == "auto-retry" and state.state == "CANCELLED" and newest[1] is None:
            continue  # Slurm cancelled a retry whose dependency can never be met: nothing failed before it
        if newest[1] is None:
            newest = (job, state)
    return newest


def retry_to_come(covering: list[tuple[SubmissionRecord, int]], job: str, sched: Scheduler) -> SubmissionRecord | None:
    """The automatic retry array after the one whose task ``job`` ran the shard that can still run it: queued (a
    task of it, or for a pulling array any of its allocations, pending; most wait for the failure of the arrays
    before them, ``--dependency=afternotok``). None when no such array is left."""
    later = False
    for sub, task in covering:
        if later and sub.kind == "auto-retry":
            state = pool_state(sub, sched) if task == POOL else sched.state_of(sub.array_job_id, task)
            if state is not None and state.state in PENDING:
                return sub
        later = later or (task != POOL and str(ArrayTask(sub.array_job_id, task)) == job)
    return None


def covering_tasks(
    subs: list[SubmissionRecord], layout: RunLayout | None = None
) -> dict[int, list[tuple[SubmissionRecord, int]]]:
    """For each shard, every (submission, task id) that ran or will run it, oldest first. For a pulling array
    the task is the allocation that claimed the shard (its claim record), :data:`POOL` while none has."""
    out: dict[int, list[tuple[SubmissionRecord, int]]] = {}
    for sub in subs:
        if sub.tasks is None:
            for task, shard in enumerate(sub.shards):
                out.setdefault(shard, []).append((sub, task))
            continue
        for shard in sub.shards:
            claimant = claimed_by(layout, shard, sub.array_job_id, sub.stage) if layout is not None else None
            out.setdefault(shard, []).append((sub, POOL if claimant is None else claimant))
    return out
