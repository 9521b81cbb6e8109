"""Run and shard states from the run directory (``_run_records``) plus one squeue and one sacct call, whatever the
shard count."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import msgspec

from ddslurm.config import (
    ArrayTask,
    AttemptRecord,
    ConfigError,
    Plan,
    Progress,
    ProviderSnapshot,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    attempt_job,
    attempt_restart,
    batch_output_task,
    parse_array_task,
    read_json,
    read_plan,
    read_tail,
)
from ddslurm.launcher._hosted_spend import Tally, hosted_spend
from ddslurm.launcher._run_records import (
    attempt_records,
    cancel_record,
    claimed_by,
    shard_stage,
    submission_progress,
    submissions,
)
from ddslurm.launcher._slurm import Slurm, TaskState

RunState = Literal["pending", "running", "succeeded", "failed", "cancelled", "incomplete"]
"""``incomplete``: the submission stopped part-way (arrays of its plan were never submitted) and the run has not
succeeded: ``ddslurm submit --continue`` submits the rest, ``ddslurm cancel`` cancels what was submitted."""
TERMINAL: frozenset[RunState] = frozenset({"succeeded", "failed", "cancelled", "incomplete"})
"""The run states that change only when someone acts (``retry``, ``submit --continue``, ``accept-partial``):
``wait`` and ``status --watch`` stop at them."""
ShardState = Literal[
    "pending", "running", "succeeded", "partial", "failed", "cancelled", "corrupt", "unknown", "unsubmitted"
]
"""``corrupt``: the shard has a winner whose files no longer verify; it counts as failed, never as succeeded.
``unsubmitted``: no array of the run covers the shard (its submission stopped before it)."""

PENDING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"})
"""Slurm states of a task that has not started (or waits to run again)."""
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
_FAILED = {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
_REQUEUED = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
_LEFT_THE_QUEUE = "requeued, then left the queue before it ran again"
_SLURM_REASONS = {"TIMEOUT": "timeout", "NODE_FAIL": "node_fail", "OUT_OF_MEMORY": "out_of_memory"}
_DISK_FULL = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")
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
    """The run's hosted keys (:func:`key_statuses`); empty for a run without hosted models."""


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
        if t.state in _REQUEUED and key not in sched.live and (key[0], None) not in sched.live:
            # Requeued, then gone from the queue before it ran again: cancelled while pending, which Slurm 22.05
            # records nowhere (sacct keeps the REQUEUED row of the run before as the task's latest).
            sched.earlier.setdefault(key, []).append(t)
            sched.final[key] = TaskState(
                job_id=t.job_id, task=t.task, state="CANCELLED", reason=_LEFT_THE_QUEUE, exit_code=t.exit_code
            )
    return sched


def _read_progress(layout: RunLayout, shard: int, attempt: AttemptRecord, stage: int | None = None) -> Progress | None:
    try:
        return read_json(layout.stage_shard(shard, stage).attempt(attempt.attempt).progress, Progress)
    except (FileNotFoundError, ConfigError):
        return None


def _progress(
    layout: RunLayout, shard: int, attempt: AttemptRecord, now: datetime, stage: int | None = None
) -> tuple[int | None, float | None]:
    progress = _read_progress(layout, shard, attempt, stage)
    if progress is None:
        return None, None
    elapsed = (now - datetime.fromisoformat(attempt.started_at)).total_seconds()
    rows = progress.rows + progress.in_batch  # the batch being generated moves too, record by record
    new_rows = rows - attempt.resumed_rows
    return rows, round(new_rows / elapsed, 2) if elapsed > 0 else None


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
    live = [s for s in known if s.state in _RUNNING | PENDING]
    if live:
        running = sum(s.state in _RUNNING for s in live)
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


def _scheduler_view(
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
        if state.state in _RUNNING:
            return job, state
        waiting_on_dependency = state.state in PENDING and "Dependency" in state.reason
        if state.state in PENDING and not waiting_on_dependency:
            return job, state
        if sub.kind == "auto-retry" and state.state == "CANCELLED" and newest[1] is None:
            continue  # Slurm cancelled a retry whose dependency can never be met: nothing failed before it
        if newest[1] is None:
            newest = (job, state)
    return newest


def _changed_since_published(layout: RunLayout, index: int, winner: WinnerRecord) -> bool:
    """Whether any file of the winner changed after ``winner.json`` was written: its inode's ctime (which any
    write updates, even one that keeps the size, and which cannot be set back) is not older than the record."""
    try:
        published = layout.shard(index).winner.lstat().st_mtime_ns
        return any((Path(winner.dataset_dir) / entry.path).lstat().st_ctime_ns >= published for entry in winner.files)
    except OSError:
        return True


def winner_problem(layout: RunLayout, index: int, winner: WinnerRecord) -> str | None:
    """Why a published winner no longer verifies, or None (``ddslurm.collector.verify_winner``).

    Presence, type and size of every file are checked on every refresh; the sha256 of the winner's files is
    checked again when one of them changed after publication, so a refresh reads no data in the usual case. The
    collector (which loads pyarrow) is imported here, where a run has a winner to check, not with this module."""
    from ddslurm.collector import verify_winner

    problems = verify_winner(winner, hashes=_changed_since_published(layout, index, winner))
    if not problems:
        return None
    return problems[0] + (f" (and {len(problems) - 1} more file(s))" if len(problems) > 1 else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def slurm_reason(state: TaskState, tail: str = "") -> tuple[str, str]:
    """Why a task ended, from Slurm's own record (state and ``exit:signal`` code) and the end of its batch
    output: for an attempt that could not record it (killed, out of memory, node lost, disk full).
    Returns (reason, what Slurm says)."""
    code, _, sig = state.exit_code.partition(":")
    said = f"Slurm: {state.state}" + (f", exit code {state.exit_code}" if state.exit_code else "")
    signum = int(sig) if sig.isdigit() else 0
    exit_status = int(code) if code.isdigit() else 0
    if signum:
        said += f" ({_signal_name(signum)})"
    if state.state in _SLURM_REASONS:
        return _SLURM_REASONS[state.state], said
    if state.state in _FAILED - {"FAILED"}:
        return state.state.lower(), said
    if state.state == "CANCELLED":
        return "cancelled", said
    if any(marker in tail for marker in _DISK_FULL):
        return "disk_full", said
    if signum:
        return f"killed (signal {signum})", said
    if exit_status:
        return f"exited (code {exit_status})", said
    return "no_result", said


def _ran_as(attempt: AttemptRecord | None, job: str) -> bool:
    """Whether ``attempt`` was begun by array task ``job`` (``<array>_<task>``), per its batch output path
    (:func:`~ddslurm.config.batch_output_task`: an attempt that ran outside a Slurm array was begun by none)."""
    task = None if attempt is None else batch_output_task(attempt.slurm_log)
    return task is not None and str(task) == job


def _requeued(job: str, live: TaskState, sched: Scheduler, latest: AttemptRecord | None) -> str | None:
    """Why a pending task is pending again (Slurm requeued it), or None if it has not run yet."""
    ran = parse_array_task(job)
    before = sched.accounting_of(ran.array_job_id, ran.task) if ran is not None else None
    runs = [*sched.ran_before(ran.array_job_id, ran.task), *([before] if before else [])] if ran is not None else []
    if runs and any(r.state == "NODE_FAIL" for r in runs):
        return "requeued (node failure)"
    if (before is not None and before.state in _REQUEUED) or live.state in _REQUEUED or _ran_as(latest, job):
        return "requeued"
    return None


_ENDED: dict[str, ShardState] = {"failed": "failed", "partial": "partial", "cancelled": "cancelled"}
_ALLOCATION_STOPPED = frozenset({"cancelled", "requeued", "time_limit"})
"""Reasons an attempt records when its whole allocation was stopped (SIGTERM of a cancel or a requeue, the time-limit
warning): an allocation running after that is a later incarnation of the job."""


def _ended_in_allocation(
    plan: Plan,
    covering: list[tuple[SubmissionRecord, int]],
    job: str,
    state: TaskState,
    latest: AttemptRecord | None,
    sched: Scheduler,
) -> ShardState | None:
    """The state of a shard whose pulling allocation (``job``, the task that claimed it) is still running: its own
    attempt's, when that attempt was begun by this allocation and has ended (failed, partial, cancelled), so that
    ``retry`` takes it without waiting for the allocation's other shards. None while Slurm's state speaks: the
    allocation is not running, the attempt is another allocation's (this one has not begun its own yet), it still
    runs, or it failed in a way the allocation reruns inside itself (retryable, with client runs left; its record
    then goes back to ``running``), or it was begun by an earlier incarnation of the allocation's job (Slurm
    requeued it: the running one claims its shards again and begins new attempts)."""
    if state.state not in _RUNNING or latest is None or latest.state not in _ENDED or not _ran_as(latest, job):
        return None
    if latest.reason in _ALLOCATION_STOPPED:
        return None  # the allocation itself was stopped: the one running now is its next incarnation
    ran = parse_array_task(job)
    if ran is not None and attempt_restart(latest.attempt) < len(sched.ran_before(ran.array_job_id, ran.task)):
        return None
    if not any(
        sub.tasks is not None and ArrayTask(sub.array_job_id, task) == ran for sub, task in covering if task != POOL
    ):
        return None  # a task of an ordinary array runs this shard alone: it is over when Slurm says so
    if latest.state == "failed" and latest.retryable and latest.client_runs <= plan.client_retries:
        return None  # the controller runs the generation step again (servers kept, same attempt)
    return _ENDED[latest.state]


def _retry_to_come(covering: list[tuple[SubmissionRecord, int]], job: str, sched: Scheduler) -> SubmissionRecord | None:
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


def _read_winner(path: Path) -> tuple[WinnerRecord | None, str | None]:
    """The winner record at ``path`` (None if there is none), or why an existing one cannot be read."""
    try:
        return read_json(path, WinnerRecord), None
    except FileNotFoundError:
        return None, None
    except (ConfigError, OSError, ValueError) as exc:
        return None, f"{path} cannot be read: {exc}"


def shard_status(
    layout: RunLayout,
    plan: Plan,
    index: int,
    covering: list[tuple[SubmissionRecord, int]],
    sched: Scheduler,
    now: datetime,
    stage: int | None = None,
) -> ShardStatus:
    """``stage`` (two-stage runs): the stage the shard is in (:func:`shard_stage`); ``covering`` holds that stage's
    arrays only, and the attempts shown are that stage's."""
    attempts = attempt_records(layout, index, stage)
    status = _shard_status(layout, plan, index, attempts, covering, sched, now, stage)
    shown = [a.attempt for a in attempts]
    status.attempt_number = shown.index(status.attempt) + 1 if status.attempt in shown else None
    return status


def _shard_status(
    layout: RunLayout,
    plan: Plan,
    index: int,
    attempts: list[AttemptRecord],
    covering: list[tuple[SubmissionRecord, int]],
    sched: Scheduler,
    now: datetime,
    stage: int | None,
) -> ShardStatus:
    spec = plan.shards[index]
    status = ShardStatus(shard=index, state="pending", records=spec.num_records)
    if stage is not None:
        status.stage = STAGE_NAMES[stage]
    status.attempts = len(attempts)
    winner, unreadable = _read_winner(layout.shard(index).winner)
    latest = attempts[-1] if attempts else None
    if latest is not None:
        status.attempt, status.reason, status.message, status.rows = (
            latest.attempt,
            latest.reason,
            latest.message,
            latest.rows,
        )
    if unreadable is not None:
        status.state, status.reason, status.message = "corrupt", "winner_unreadable", unreadable
        return status
    if winner is not None:
        status.state, status.rows, status.attempt = "succeeded", winner.rows, winner.attempt
        won = next((a for a in attempts if a.attempt == winner.attempt), None)
        status.job_id = None if won is None else attempt_job(won)
        status.reason = status.message = None
        if (problem := winner_problem(layout, index, winner)) is not None:
            status.state, status.reason, status.message = "corrupt", "winner_corrupt", problem
        return status
    job, state = _scheduler_view(covering, sched)
    status.job_id = job
    if job is None:
        return status
    if state is None and os.path.lexists(layout.shard(index).cancelled):
        status.state = "cancelled"  # cancel --shards of a pending task, which Slurm forgets once cancelled
        status.reason = status.reason or "shard_cancelled"
        return status
    if state is None:
        status.state = "unknown"  # neither squeue nor sacct knows it yet (accounting lag): not lost
        return status
    status.slurm_state = state.state
    ended = _ended_in_allocation(plan, covering, job, state, latest, sched)
    coming = _retry_to_come(covering, job, sched) if ended in {"failed", "partial"} else None
    if coming is not None and latest is not None:
        status.state = "pending"  # not failed: an automatic retry will run it without the user
        status.message = (
            f"attempt {latest.attempt} ended {latest.state} ({latest.reason}); automatic retry array "
            f"{coming.array_job_id} runs the shard once allocation {job} has ended"
        )
    elif ended is not None:
        status.state = ended  # the allocation runs other shards: this one's own record says it is over
    elif state.state in _RUNNING:
        status.state = "running"
        if latest is not None and latest.state == "running":
            status.rows, status.rate = _progress(layout, index, latest, now, stage)
    elif state.state in PENDING:
        status.state = "pending"
        status.pending_reason = state.reason if state.reason not in {"", "None"} else None
        if (requeued := _requeued(job, state, sched, latest)) is not None:
            status.reason = requeued
            stopped = f"; attempt {latest.attempt} ended: {latest.reason}" if _ran_as(latest, job) and latest else ""
            status.message = f"Slurm requeued task {job}; it will run again as a new attempt{stopped}"
    elif latest is not None and latest.state == "cancelled":
        status.state = "cancelled"
    elif os.path.lexists(layout.shard(index).cancelled):
        status.state = "cancelled"  # cancel --shards of a shard that had not started
        status.reason = status.reason or "shard_cancelled"
    elif state.reason == "not_claimed" and state.task is None:
        status.state = "failed"
        status.reason = "not_claimed"
        status.message = (
            f"no allocation of array {state.job_id} took this shard before they all ended ({state.state}); "
            "ddslurm retry runs it"
        )
    elif latest is not None and latest.state == "partial":
        status.state = "partial"
    elif state.state == "CANCELLED":
        status.state = "cancelled"
        status.reason = status.reason or "cancelled"
    else:
        status.state = "failed"
        own = latest is not None and latest.state != "running" and status.reason is not None
        if not own or (status.reason == "cancelled" and state.state in _FAILED - {"FAILED"}):
            # The attempt could not record why it ended (or saw only the SIGTERM): Slurm's record says.
            ran = parse_array_task(job)  # a task's own batch output; a pulling array's range has none
            log = layout.batch_output(ran) if ran is not None else None
            tail = read_tail(log, 8, 16384).strip() if log is not None else ""
            status.reason, said = slurm_reason(state, tail)
            stuck = f"; {latest.attempt} still says running" if latest is not None and latest.state == "running" else ""
            status.message = f"{said}{stuck}" + (f"\nlast lines of {log}:\n{tail}" if tail else "")
    if status.rows is None and latest is not None and status.state != "running":
        progress = _read_progress(layout, index, latest, stage)  # an attempt that ended without counting its rows
        status.rows = None if progress is None else progress.rows
    return status


def run_state(
    shards: list[ShardStatus], cancelled: bool = False, *, incomplete: bool = False, begun: bool = False
) -> RunState:
    """``begun``: some shard has had an attempt, or a result of an earlier stage (a two-stage run whose CPU stage
    waits), so a run whose shards all wait (for an automatic retry, a requeue, a CPU stage) is ``running``, not back
    to ``pending``."""
    states = {s.state for s in shards}
    if states == {"succeeded"}:
        return "succeeded"
    if incomplete and not cancelled:
        return "incomplete"
    if "running" in states:
        return "running"
    if states & {"pending", "unknown"}:
        ended = states & {"succeeded", "failed", "partial", "cancelled", "corrupt"}
        return "running" if begun or ended else "pending"
    if cancelled:
        return "cancelled"
    if states & {"failed", "partial", "corrupt"}:
        return "failed"
    return "cancelled"


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


def _rows_done(s: ShardStatus) -> int:
    """The rows a shard's status counts as done: its result's, or its running attempt's progress."""
    return (s.rows or 0) if s.state in {"succeeded", "running"} else 0


def _stage_rows(layout: RunLayout, s: ShardStatus, stage: int) -> list[int]:
    """The rows done in each stage of a two-stage run's shard in ``stage``: in the GPU stage its status's; in the
    CPU stage its GPU-stage result's (its final result's without one) and its status's."""
    if stage == 0:
        return [_rows_done(s), 0]
    first, _ = _read_winner(layout.stage_shard(s.shard, 0).winner)
    return [first.rows if first is not None else _rows_done(s), _rows_done(s)]


def _stages(plan: Plan, shards: list[ShardStatus]) -> list[StageProgress]:
    """Each stage of a two-stage run over its shards (none for a single-stage run)."""
    staged = [(s, s.stage_rows) for s in shards if s.stage_rows is not None]
    if not staged:
        return []
    done = (sum(s.stage == "cpu" for s, _ in staged), sum(s.state == "succeeded" for s, _ in staged))
    return [
        StageProgress(
            stage=name, rows_done=sum(rows[i] for _, rows in staged), records=plan.num_records, shards_done=done[i]
        )
        for i, name in enumerate(STAGE_NAMES)
    ]


def run_status(layout: RunLayout, slurm: Slurm, *, now: datetime | None = None) -> RunStatus:
    """The run and every shard, from its directory and one ``squeue`` and one ``sacct`` call."""
    plan, subs = read_plan(layout.plan), submissions(layout)
    return _run_status(layout, plan, subs, query(slurm, subs), now or datetime.now(UTC))


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A run directory whose records cannot be read (written by another ddslurm version, or damaged)."""

    layout: RunLayout
    error: str


def run_statuses(
    layouts: list[RunLayout], slurm: Slurm, *, now: datetime | None = None
) -> list[RunStatus | Unreadable]:
    """The status of every run of ``layouts`` (in that order) from one ``squeue`` and one ``sacct`` call for all
    of them together; a run whose plan or submission records cannot be read is :class:`Unreadable`."""
    read: list[tuple[RunLayout, Plan, list[SubmissionRecord]] | Unreadable] = []
    for layout in layouts:
        try:
            read.append((layout, read_plan(layout.plan), submissions(layout)))
        except (ConfigError, OSError) as exc:
            read.append(Unreadable(layout, str(exc)))
    sched = query(slurm, [sub for item in read if not isinstance(item, Unreadable) for sub in item[2]])
    moment = now or datetime.now(UTC)
    return [item if isinstance(item, Unreadable) else _run_status(*item, sched, moment) for item in read]


def _run_status(
    layout: RunLayout, plan: Plan, subs: list[SubmissionRecord], sched: Scheduler, moment: datetime
) -> RunStatus:
    covering = covering_tasks(subs, layout)
    progress = submission_progress(layout, subs)
    shards = []
    for spec in plan.shards:
        stage = shard_stage(layout, plan, spec.index)
        mine = [(sub, task) for sub, task in covering.get(spec.index, []) if stage is None or sub.stage == stage]
        status = shard_status(layout, plan, spec.index, mine, sched, moment, stage)
        if stage is not None:
            status.stage_rows = _stage_rows(layout, status, stage)
        shards.append(status)
    if progress is not None:
        for s in shards:
            if s.state == "pending" and not covering.get(s.shard):
                s.state = "unsubmitted"  # no array covers it: the submission stopped before it
    incomplete = progress is not None and progress.incomplete
    counts: dict[str, int] = {}
    for s in shards:
        counts[s.state] = counts.get(s.state, 0) + 1
    done = sum(_rows_done(s) for s in shards if s.stage != "gpu")  # the final stage's rows: the run's records
    stages = _stages(plan, shards)
    work = sum(s.records for s in stages) if stages else plan.num_records
    cancelled = cancel_record(layout)
    return RunStatus(
        run_id=plan.run_id,
        run_dir=str(layout.root),
        state=run_state(
            shards,
            cancelled is not None,
            incomplete=incomplete,
            begun=any(s.stage == "cpu" or s.attempts for s in shards),
        ),
        stages=stages,
        progress=round(min(1.0, (sum(s.rows_done for s in stages) if stages else done) / work), 4) if work else 0.0,
        shards=shards,
        records_requested=plan.num_records,
        records_done=done,
        counts=counts,
        cancelled_at=cancelled.cancelled_at if cancelled else None,
        submission_incomplete=incomplete,
        unsubmitted_arrays=len(progress.missing) if progress is not None and incomplete else 0,
        name=plan.run_name,
        submitted_at=min((s.submitted_at for s in subs), default=None),
        hosted=key_statuses(layout, plan),
    )


def key_statuses(layout: RunLayout, plan: Plan) -> list[KeyStatus]:
    """Per hosted key of the run, its requests, 429s, tokens and cost over every attempt so far
    (:func:`~ddslurm.launcher._hosted_spend.hosted_spend`); none when the snapshot cannot be read."""
    try:
        snapshot = read_json(layout.snapshot, ProviderSnapshot)
    except (ConfigError, OSError):
        return []
    spend = hosted_spend(layout, plan, snapshot)
    out = []
    for key in spend.keys:
        models = [m for m in spend.models if m.key == key.key]
        total = sum((m.spent for m in models), Tally())
        costs = [m.spent_cost for m in models if m.spent_cost is not None]
        out.append(
            KeyStatus(
                provider=key.provider,
                key_env=key.key_env,
                requests=total.requests,
                limited=total.limited,
                failed=total.failed,
                unanswered=total.unanswered,
                unreached=total.unreached,
                input_tokens=total.input_tokens,
                output_tokens=total.output_tokens,
                cost=sum(costs) if costs else None,
                currency=spend.currency,
                requests_per_minute=key.requests_per_minute,
                in_flight=key.in_flight,
            )
        )
    return out
