"""A submission within the scheduler's limits: every array it makes, checked against each limit Slurm reported
(the launcher reads them; :class:`ddslurm.config.SchedulerLimits`) with headroom left for other users."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from ddslurm.config import LimitCheck, Plan, PlannedArray, RunLayout, SchedulerLimits, SubmissionKind, SubmitPlanRecord
from ddslurm.planner._arrays import array_tasks, plan_arrays
from ddslurm.planner.errors import LimitError

HEADROOM = 0.9
"""A submission uses at most this fraction of what is left under each scheduler limit: the rest stays free for
other users (and for this run's own collection job)."""


def plural(value: int, word: str) -> str:
    return f"{value:,} {word}" + ("" if value == 1 else "s")


def limit_checks(tasks: int, limits: SchedulerLimits) -> tuple[tuple[LimitCheck, ...], list[LimitCheck]]:
    """Every limit with what the headroom rule leaves under it; and those ``tasks`` would exceed."""
    checks = tuple(
        LimitCheck(name=lim.name, scope=lim.scope, limit=lim.limit, used=lim.used, usable=lim.usable(HEADROOM))
        for lim in limits.limits
    )
    return checks, [c for c in checks if tasks > c.usable]


def describe_limit(check: LimitCheck) -> str:
    """``MaxJobCount is 10,000 with 120 already queued (90 % headroom rule: 8,892 usable)``."""
    where = "" if check.scope == "cluster" else f" of {check.scope}"
    return (
        f"{check.name}{where} is {check.limit:,} with {check.used:,} already queued "
        f"({round(HEADROOM * 100)} % headroom rule: {check.usable:,} usable)"
    )


def refuse_if_over(tasks: int, limits: SchedulerLimits, what: str, advice: str) -> tuple[LimitCheck, ...]:
    """Raise :class:`LimitError` with the numbers when ``tasks`` array tasks do not fit under every limit."""
    checks, over = limit_checks(tasks, limits)
    if over:
        worst = min(over, key=lambda c: c.usable)
        also = [describe_limit(c) for c in over if c is not worst]
        raise LimitError(
            f"{what}, but {describe_limit(worst)}; {advice}" + "".join(f"\n  also: {line}" for line in also)
        )
    return checks


@dataclass(frozen=True, slots=True)
class SubmissionPlan:
    """Every sbatch one submission makes, and the limits it was checked against. The dry run shows it; the real
    submission writes it (``submit-plan.json``) and then submits exactly these arrays."""

    arrays: tuple[PlannedArray, ...]
    tasks: int
    limits: SchedulerLimits
    checks: tuple[LimitCheck, ...]

    def record(self, now: datetime) -> SubmitPlanRecord:
        return SubmitPlanRecord(
            created_at=now.isoformat(),
            arrays=self.arrays,
            tasks=self.tasks,
            max_array_size=self.limits.max_array_size,
            headroom=HEADROOM,
            limits=self.checks,
            notes=self.limits.notes,
        )


def plan_submission(
    plan: Plan,
    layout: RunLayout,
    shards: Sequence[int],
    limits: SchedulerLimits,
    *,
    kind: SubmissionKind = "initial",
    stamp: str,
    gpu_done: Collection[int] = (),
) -> SubmissionPlan:
    """The arrays that submit ``shards`` and the limits they fit in; :class:`LimitError` with the numbers when
    they do not. The one function behind ``submit``, ``submit --dry-run`` and ``retry``."""
    arrays = plan_arrays(plan, layout, shards, limits.max_array_size, kind=kind, stamp=stamp, gpu_done=gpu_done)
    tasks = sum(array_tasks(a) for a in arrays)
    if kind == "initial":
        factor = (1 + plan.retries) * (2 if plan.stages else 1)
        unit = "shard" if plan.allocations is None else "allocation"
        jobs = len(shards) if plan.allocations is None else plan.allocations
        what = (
            f"{plural(jobs, unit)} \u00d7 (1 + retries {plan.retries}) = {plural(tasks, 'array task')}"
            if plan.retries
            else f"{plural(jobs, unit)} = {plural(tasks, 'array task')}"
        )
        if plan.stages:
            what += " (GPU and CPU stage)"
        _, over = limit_checks(tasks, limits)
        room = min((c.usable for c in over), default=0) // factor
        fit = f" (at most {room:,} {unit}s fit" + (f" with retries {plan.retries})" if plan.retries else ")")
        advice = (f"use fewer {unit}s or fewer retries" if plan.retries else f"use fewer {unit}s") + (
            fit if room else " (none fit now: wait until queued jobs have finished)"
        )
        if room and plan.allocations is None:
            advice += f", or keep the shards and set allocations: {room:,} (each allocation pulls several shards)"
    else:
        what = f"retrying {plural(len(shards), 'shard')} = {plural(tasks, 'array task')}"
        advice = "retry fewer shards (--shards) or wait until queued jobs have finished"
    checks = refuse_if_over(tasks, limits, what, advice)
    return SubmissionPlan(arrays, tasks, limits, checks)
