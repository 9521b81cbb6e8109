"""Steering a run: retry shards without a winner, cancel shards, accept short shards, find step logs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ddslurm.config import (
    AttemptRecord,
    Plan,
    RunLayout,
    WinnerRecord,
    publish_once,
    read_json,
    read_plan,
    read_regular,
)
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher._status import RunStatus, attempt_records, run_status
from ddslurm.launcher._submit import submit_shards
from ddslurm.launcher.errors import LauncherError

ACTIVE = {"running", "pending", "unknown"}


@dataclass(frozen=True, slots=True)
class Retried:
    shards: tuple[int, ...]
    job_ids: tuple[str, ...]


def _pick(status: RunStatus, wanted: list[int] | None, plan: Plan) -> list[int]:
    if wanted is not None:
        bad = [s for s in wanted if not 0 <= s < len(plan.shards)]
        if bad:
            raise LauncherError(f"no shard {bad[0]}: the run has shards 0-{len(plan.shards) - 1}")
    return sorted(wanted) if wanted is not None else [s.shard for s in status.shards]


def retry(
    layout: RunLayout,
    slurm: Slurm,
    env: Mapping[str, str],
    shards: list[int] | None = None,
    now: datetime | None = None,
) -> Retried:
    """Submit new attempts, as one array, for shards that have no winner and nothing running or queued.

    Every API-key variable the run needs is checked again in this shell first; the new attempts resume from
    the batches of earlier attempts when the run's resume mode allows it.
    """
    plan = read_plan(layout.plan)
    status = run_status(layout, slurm)
    by_index = {s.shard: s for s in status.shards}
    chosen = _pick(status, shards, plan)
    busy = [s for s in chosen if by_index[s].state in ACTIVE]
    if shards is not None and busy:
        raise LauncherError(f"shard(s) {', '.join(map(str, busy))} are still running or queued; cancel them first")
    todo = [s for s in chosen if by_index[s].state not in ACTIVE | {"succeeded"}]
    if not todo:
        return Retried((), ())
    job_ids = submit_shards(layout, plan, todo, slurm, env, now or datetime.now(UTC), kind="retry")
    return Retried(tuple(todo), tuple(job_ids))


def cancel(layout: RunLayout, slurm: Slurm, shards: list[int] | None = None) -> list[str]:
    """Cancel the run's queued and running tasks (only those of ``shards`` if given); returns the ids."""
    plan = read_plan(layout.plan)
    status = run_status(layout, slurm)
    chosen = set(_pick(status, shards, plan))
    ids = [s.job_id for s in status.shards if s.shard in chosen and s.job_id and s.state in ACTIVE]
    slurm.scancel(ids)
    return ids


def accept_partial(layout: RunLayout, shards: list[int]) -> list[tuple[int, int]]:
    """Publish the best short result of each shard as its winner, marked partial. Returns (shard, rows)."""
    accepted: list[tuple[int, int]] = []
    for shard in shards:
        best: WinnerRecord | None = None
        for record in attempt_records(layout, shard):
            path = layout.shard(shard).attempt(record.attempt).candidate
            if record.state == "partial" and path.is_file():
                candidate = read_json(path, WinnerRecord)
                if best is None or candidate.rows > best.rows:
                    best = candidate
        if best is None:
            raise LauncherError(f"shard {shard} has no partial result to accept")
        source = layout.shard(shard).attempt(best.attempt).candidate
        if not publish_once(layout.shard(shard).winner, read_regular(source)):
            raise LauncherError(f"shard {shard} already has a winner")
        accepted.append((shard, best.rows))
    return accepted


STEP_GLOBS = {
    "client": ("client.out", "client.log"),
    "server": ("server-*.log",),
    "proxy": ("proxy-*.log", "proxy-*.out"),
}


def log_files(layout: RunLayout, shard: int, step: str) -> list[Path]:
    """The log files of a shard's latest attempt for one step (``slurm``: the array task's batch output)."""
    records: list[AttemptRecord] = attempt_records(layout, shard)
    if not records:
        return []
    latest = records[-1]
    if step == "slurm":
        return [Path(latest.slurm_log)] if latest.slurm_log else []
    attempt_dir = layout.shard(shard).attempt(latest.attempt).dir
    return [p for pattern in STEP_GLOBS[step] for p in sorted(attempt_dir.glob(pattern))]
