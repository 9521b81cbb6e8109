"""An attempt's record, from begin to end: an attempt begun (or recorded as not begun: the run cancelled, a winner
in place, the GPU stage missing, a failure every attempt would repeat), resumed by the client step that runs it,
and ended failed or cancelled, or made ready to run again; its exit codes, and the values it is run from."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ddslurm.config import (
    AttemptLayout,
    AttemptRecord,
    AttemptState,
    RunLayout,
    ShardLayout,
    SubmissionRecord,
    WinnerRecord,
    atomic_write,
    attempt_id_for,
    encode,
    make_private_dir,
    read_json,
)
from ddslurm.runtime._inputs import Inputs
from ddslurm.runtime.errors import PERMANENT_REASONS, InputsError, RuntimeFailure

if TYPE_CHECKING:
    import pyarrow as pa

Clock = Callable[[], datetime]
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PARTIAL = 3
EXIT_USAGE = 64
"""A command line the step cannot run (a missing shard or job id, a stage the run does not have)."""


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Began:
    """An attempt that has its directory and a ``running`` record."""

    shard: int
    num_records: int
    layout: AttemptLayout
    record: AttemptRecord


@dataclass(frozen=True, slots=True)
class StageRun:
    """What one attempt's Data Designer runs: the stage's recipe for the shard, and where a fill finds the shard's
    seed rows (None: the recipe has no seed dataset)."""

    recipe: Mapping[str, Any]
    seed_block: Callable[[], pa.Table] | None
    sampling: Literal["ordered", "shuffle"] = "ordered"
    numbered: bool = False
    """The seed rows carry their numbers (:data:`STAGE_ROW`, the CPU stage): Data Designer preserves them for
    the rows it keeps, and a fill regenerates exactly the numbers that are missing."""
    partial_input: bool = False
    """The rows this stage reads are an accepted partial result (``ddslurm accept-partial`` of the GPU stage), so
    the shard's result is partial however complete this stage is."""


def exit_code_for(record: AttemptRecord) -> int:
    return {"succeeded": EXIT_OK, "superseded": EXIT_OK, "partial": EXIT_PARTIAL}.get(record.state, EXIT_FAILED)


class AttemptRecords:
    """The records of one shard's attempts (of one stage: ``stage``, see :attr:`stage`), in the run's ``layout``;
    ``env`` is the job's environment, ``clock`` when things happen."""

    def __init__(
        self, layout: RunLayout, *, env: Mapping[str, str], clock: Clock = utc_now, stage: int | None = None
    ) -> None:
        self._layout = layout
        self._stage = stage
        self._env = env
        self._clock = clock

    def _now(self) -> str:
        return self._clock().isoformat()

    @property
    def stage(self) -> int | None:
        """The stage of a two-stage run this runner generates (0: the GPU stage, 1: the CPU stage); None: the
        run has one stage."""
        return self._stage

    def _shard(self, index: int) -> ShardLayout:
        """Where this runner's attempts, claims and winner of shard ``index`` live: the GPU stage's in the shard's
        ``stage-0/``, the last (or only) stage's in the shard's own directory."""
        return self._layout.stage_shard(index, self._stage)

    def _write(self, attempt: AttemptLayout, record: AttemptRecord) -> None:
        atomic_write(attempt.record, encode(record))

    def begin(
        self,
        inputs: Inputs,
        shard_index: int,
        job_id: str,
        node: str,
        restart: int = 0,
        slurm_log: str | None = None,
        allocation: str | None = None,
        *,
        spare: bool = False,
    ) -> Began | None:
        """Create the attempt directory and its ``running`` record; None if the attempt must not generate:
        recorded ``cancelled`` (reason ``run_cancelled``) when the whole run was cancelled, ``superseded`` when
        the shard already has a winner. ``spare``: begun for a pulling allocation's spare client, which waits for a
        worker's slot (the record says so until its client begins generating)."""
        plan = inputs.plan
        if not 0 <= shard_index < len(plan.shards):
            raise InputsError(f"shard {shard_index} does not exist; the plan has {len(plan.shards)} shard(s)")
        spec = plan.shards[shard_index]
        shard = self._shard(shard_index)
        attempt_id = attempt_id_for(job_id, restart)
        make_private_dir(shard.attempts, exist_ok=True)
        attempt = shard.attempt(attempt_id)
        make_private_dir(attempt.dir)
        record = AttemptRecord(
            shard=shard_index,
            attempt=attempt_id,
            job_id=job_id,
            node=node,
            state="running",
            started_at=self._now(),
            requested_rows=spec.num_records,
            slurm_log=slurm_log,
            allocation=allocation,
            spare=spare,
        )
        first: WinnerRecord | None = None
        if self._stage == 1:
            first = self._stage_winner(shard_index)
            if first is not None:
                record = msgspec.structs.replace(record, requested_rows=first.rows)
        if os.path.lexists(self._layout.cancelled):
            # `ddslurm cancel` writes this before it asks Slurm to cancel the run's arrays: an array that starts
            # anyway (a dependency met by the cancelled tasks, a race with scancel) does no work.
            message = f"the run was cancelled (ddslurm cancel; {self._layout.cancelled}); nothing generated"
            return self._not_begun(attempt, record, "cancelled", reason="run_cancelled", message=message)
        if shard.winner.exists() or (self._stage == 0 and self._layout.shard(shard_index).winner.exists()):
            return self._not_begun(attempt, record, "superseded", reason="winner_exists")
        if self._stage == 1 and first is None:
            message = "the shard's GPU stage has no result (shards/shard-N/stage-0/winner.json); nothing generated"
            return self._not_begun(attempt, record, "failed", reason="stage_missing", message=message)
        repeated = self._repeated_failure(shard_index, attempt_id)
        if repeated is not None:
            message = (
                f"{repeated.attempt} failed with {repeated.reason}, which every attempt of this run "
                f"would repeat; nothing generated ({repeated.message or ''})"
            )
            return self._not_begun(attempt, record, "failed", reason="not_retried", message=message)
        self._write(attempt, record)
        return Began(shard_index, record.requested_rows or spec.num_records, attempt, record)

    def _not_begun(
        self,
        attempt: AttemptLayout,
        record: AttemptRecord,
        state: AttemptState,
        *,
        reason: str,
        message: str | None = None,
    ) -> Began | None:
        """Record an attempt that ends before it generates anything (None: nothing to run)."""
        ended = msgspec.structs.replace(record, state=state, ended_at=self._now(), reason=reason, message=message)
        self._write(attempt, ended)
        return None

    def _stage_winner(self, shard_index: int) -> WinnerRecord | None:
        """The shard's GPU-stage winner (``stage-0/winner.json``), or None while it has none."""
        path = self._layout.shard(shard_index).stage(0).winner
        if not path.is_file():
            return None
        return read_json(path, WinnerRecord)

    def _repeated_failure(self, shard_index: int, attempt_id: str) -> AttemptRecord | None:
        """For a task of an automatic retry array: the shard's latest ended attempt, when it failed in a way
        that a new attempt of the same run repeats (the recipe refused, the run's inputs modified)."""
        array = self._env.get("SLURM_ARRAY_JOB_ID")
        submission = self._layout.submissions / f"{array}.json"
        if not array or not submission.is_file():
            return None
        try:
            if read_json(submission, SubmissionRecord).kind != "auto-retry":
                return None
        except Exception:
            return None
        ended: list[AttemptRecord] = []
        for path in self._shard(shard_index).attempts.glob("attempt-*/attempt.json"):
            if path.parent.name == attempt_id:
                continue
            try:
                earlier = read_json(path, AttemptRecord)
            except Exception:
                continue
            if earlier.ended_at is not None:
                ended.append(earlier)
        if not ended:
            return None
        latest = max(ended, key=lambda r: r.ended_at or "")
        return latest if latest.state == "failed" and latest.reason in PERMANENT_REASONS else None

    def resume(self, shard_index: int, attempt_id: str) -> Began:
        """The attempt a controller began, for the client step that runs the engine."""
        attempt = self._shard(shard_index).attempt(attempt_id)
        record = read_json(attempt.record, AttemptRecord)
        return Began(shard_index, record.requested_rows or 0, attempt, record)

    def fail(self, began: Began, failure: RuntimeFailure) -> int:
        current = read_json(began.layout.record, AttemptRecord)
        if current.state != "running":
            return exit_code_for(current)
        self._write(
            began.layout,
            msgspec.structs.replace(
                current,
                state="failed",
                ended_at=self._now(),
                reason=failure.reason,
                message=failure.message,
                retryable=failure.retryable,
            ),
        )
        return EXIT_FAILED

    def fail_ended(self, record: AttemptRecord, failure: RuntimeFailure) -> AttemptRecord:
        """Fail an attempt whose generation ended (a tune run whose calibration sweep then failed: the run is its
        measurement, not its records); the winner it may have published stays. Returns the record written."""
        layout = self._shard(record.shard).attempt(record.attempt)
        failed = msgspec.structs.replace(
            read_json(layout.record, AttemptRecord),
            state="failed",
            reason=failure.reason,
            message=failure.message,
            retryable=False,
        )
        self._write(layout, failed)
        return failed

    def cancel(self, began: Began, message: str) -> AttemptRecord:
        """End a running attempt as ``cancelled`` (``ddslurm cancel --shards`` of a pulling allocation's shard)."""
        current = read_json(began.layout.record, AttemptRecord)
        if current.state == "running":
            current = msgspec.structs.replace(
                current, state="cancelled", ended_at=self._now(), reason="shard_cancelled", message=message
            )
            self._write(began.layout, current)
        return current

    def rerun(self, began: Began) -> AttemptRecord:
        """Mark a failed attempt running again for another generation step inside the same allocation."""
        current = read_json(began.layout.record, AttemptRecord)
        again = msgspec.structs.replace(
            current, state="running", ended_at=None, reason=None, message=None, retryable=False
        )
        self._write(began.layout, again)
        return again
