"""What an incarnation of a requeued job says of the one before it.

Slurm stops a job it requeues (``scontrol requeue``, a node failure) with the same SIGTERM as a cancel, so the
attempts that incarnation was running record ``cancelled``. The next incarnation of the job (``SLURM_RESTART_COUNT``
one higher) is the proof that it was a requeue: it rewrites those records' reason to ``requeued`` before it begins
anything, so that status, the report and the facts never count a requeue as a cancel."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ddslurm.config import AttemptRecord, RunLayout, atomic_write, attempt_id_for, encode, read_json
from ddslurm.runtime._stop import InterruptedFailure

REQUEUED = "requeued"


def mark_requeued(layout: RunLayout, job_id: str, restart: int) -> list[Path]:
    """Records of the attempts the incarnation before ``restart`` of job ``job_id`` began (in any shard, either
    stage) that ended because the job was stopped: their reason becomes ``requeued``. Returns the records changed;
    none for a first incarnation."""
    if restart < 1:
        return []
    earlier = attempt_id_for(job_id, restart - 1)
    changed = []
    for pattern in (f"shard-*/attempts/{earlier}/attempt.json", f"shard-*/stage-0/attempts/{earlier}/attempt.json"):
        for path in sorted(layout.shards.glob(pattern)):
            record = read_json(path, AttemptRecord)
            if record.state != "failed" or record.reason != InterruptedFailure.reason:
                continue
            message = (
                f"Slurm requeued job {job_id} (scontrol requeue or a node failure): incarnation {restart} runs again"
            )
            atomic_write(path, encode(msgspec.structs.replace(record, reason=REQUEUED, message=message)))
            changed.append(path)
    return changed
