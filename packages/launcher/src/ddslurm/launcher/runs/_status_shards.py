"""One shard's status: its winner (checked), its attempts' records and progress, and what Slurm says of the task
that ran it (why it ended, whether it was requeued, whether a retry is to come)."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from pathlib import Path

from ddslurm.config import (
    ArrayTask,
    AttemptRecord,
    ConfigError,
    Plan,
    Progress,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    attempt_job,
    attempt_restart,
    batch_output_task,
    parse_array_task,
    read_json,
    read_tail,
)
from ddslurm.launcher.cluster._slurm import TaskState
from ddslurm.launcher.runs._records import attempt_records
from ddslurm.launcher.runs._status_model import STAGE_NAMES, ShardState, ShardStatus
from ddslurm.launcher.runs._status_scheduler import (
    FAILED,
    PENDING,
    POOL,
    REQUEUED,
    RUNNING,
    Scheduler,
    retry_to_come,
    scheduler_view,
)

_SLURM_REASONS = {"TIMEOUT": "timeout", "NODE_FAIL": "node_fail", "OUT_OF_MEMORY": "out_of_memory"}
_DISK_FULL = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")


def _read_progress(layout: RunLayout, shard: int, attempt: AttemptRecord, stage: int | None = None) -> Progress | None:
    try:
        return read_json(layout.stage_shard(shard, stage).attempt(attempt.attempt).progress, Progress)
    except (FileNotFoundError, ConfigError):
        return None


def _progress(
    layout: RunLayout, shard: int, attempt: AttemptRecord, now: datetime, stage: int | None = None
) -> tuple[int | None, float | None]:
    progress = _read_progress(layout, shard, attempt, stage)
    if progress is None:  # no record finished yet: the rows it resumed (none for a fresh attempt), not "-"
        return attempt.resumed_rows, None
    # from when its client began generating (a spare's wait and a client's start-up make no rows); older
    # records say only when the attempt began
    elapsed = (now - datetime.fromisoformat(attempt.generating_at or attempt.started_at)).total_seconds()
    rows = progress.rows + progress.in_batch  # the batch being generated moves too, record by record
    new_rows = rows - attempt.resumed_rows
    return rows, round(new_rows / elapsed, 2) if elapsed > 0 else None


def waiting_spare(attempt: AttemptRecord) -> bool:
    """Whether ``attempt`` is a pulling allocation's spare that waits for a worker's slot: begun for a spare client
    (``spare``), still running, and its client has not begun generating (no ``generating_at``)."""
    return attempt.spare and attempt.state == "running" and attempt.generating_at is None


def draining(layout: RunLayout, shard: int, attempt: AttemptRecord, stage: int | None = None) -> bool:
    """Whether ``attempt`` (of ``stage``'s shard, two-stage runs) drains: still running, and its allocation's
    controller has marked it (``AttemptLayout.draining``: its last records in flight, its worker slot a spare's)."""
    if attempt.state != "running":
        return False
    return os.path.lexists(layout.stage_shard(shard, stage).attempt(attempt.attempt).draining)


def stopping(layout: RunLayout, status: ShardStatus) -> bool:
    """Whether a shard shown ``cancelled`` (its cancel record, ``cancel --shards``) is still being stopped: its
    allocation runs and its attempt's record still says ``running`` (the allocation records ``cancelled`` within a
    round). ``retry`` leaves it alone until then: clearing the cancel record first, the allocation would never see it
    and the attempt would go on beside the retry's."""
    if status.state != "cancelled" or status.slurm_state not in RUNNING or status.attempt is None:
        return False
    stage = 0 if status.stage == "gpu" else None
    try:
        record = read_json(layout.stage_shard(status.shard, stage).attempt(status.attempt).record, AttemptRecord)
    except (OSError, ConfigError):
        return False
    return record.state == "running"


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
    if state.state in FAILED - {"FAILED"}:
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
    if (before is not None and before.state in REQUEUED) or live.state in REQUEUED or _ran_as(latest, job):
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
    if state.state not in RUNNING or latest is None or latest.state not in _ENDED or not _ran_as(latest, job):
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


def read_winner(path: Path) -> tuple[WinnerRecord | None, str | None]:
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
    """``stage`` (two-stage runs): the stage the shard is in (:func:`~ddslurm.launcher.runs._records.shard_stage`);
    ``covering`` holds that stage's arrays only, and the attempts shown are that stage's."""
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
    winner, unreadable = read_winner(layout.shard(index).winner)
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
    job, state = scheduler_view(covering, sched)
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
    coming = retry_to_come(covering, job, sched) if ended in {"failed", "partial"} else None
    if coming is not None and latest is not None:
        status.state = "pending"  # not failed: an automatic retry will run it without the user
        status.message = (
            f"attempt {latest.attempt} ended {latest.state} ({latest.reason}); automatic retry array "
            f"{coming.array_job_id} runs the shard once allocation {job} has ended"
        )
    elif ended is not None:
        status.state = ended  # the allocation runs other shards: this one's own record says it is over
    elif state.state in RUNNING and os.path.lexists(layout.shard(index).cancelled):
        # cancel --shards of a shard a running allocation pulls: it stops the client within a second, or never
        # claims the shard; a spare waiting for a worker's slot is never shown running meanwhile
        status.state = "cancelled"
        if latest is None or latest.state == "running":
            status.reason = "shard_cancelled"
            status.message = "cancelled by ddslurm cancel --shards; its allocation stops it and takes it no more"
    elif state.state in RUNNING and latest is not None and waiting_spare(latest):
        status.state = "waiting"  # its client waits for a worker's slot: it generates nothing yet
    elif state.state in RUNNING:
        # its last records in flight, its worker slot a spare's: it still makes rows, outside client_workers
        drains = latest is not None and draining(layout, index, latest, stage)
        status.state = "draining" if drains else "running"
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
        if not own or (status.reason == "cancelled" and state.state in FAILED - {"FAILED"}):
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
