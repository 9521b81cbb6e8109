"""A submission within the scheduler's limits (``plan_submission``): what fits is planned, what does not is a
``LimitError`` with the numbers and what would fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import Limit, RunLayout, SchedulerLimits
from ddslurm.config.testing import make_plan
from ddslurm.planner import HEADROOM, LimitError, PlanError, limit_checks, plan_submission


def test_a_submission_over_a_limit_is_refused_with_what_would_fit(tmp_path: Path) -> None:
    plan = make_plan("run-1", (1,) * 10_000, retries=1)
    limits = SchedulerLimits(1001, (Limit("MaxJobCount", "cluster", 10_000, 120),))
    with pytest.raises(LimitError) as refused:
        plan_submission(plan, RunLayout(tmp_path), range(10_000), limits, stamp="s")
    usable = int(HEADROOM * (10_000 - 120))
    assert str(refused.value) == (
        f"10,000 shards \u00d7 (1 + retries 1) = 20,000 array tasks, but MaxJobCount is 10,000 with 120 already "
        f"queued (90 % headroom rule: {usable:,} usable); use fewer shards or fewer retries (at most "
        f"{usable // 2:,} shards fit with retries 1), or keep the shards and set allocations: {usable // 2:,} "
        "(each allocation pulls several shards)"
    )


def test_what_fits_is_planned_and_checked_against_every_limit(tmp_path: Path) -> None:
    plan = make_plan("run-1", (1,) * 30, retries=1)
    limits = SchedulerLimits(8, (Limit("MaxJobCount", "cluster", 1000, 10), Limit("MaxSubmitJobs", "QOS q", 80, 5)))
    planned = plan_submission(plan, RunLayout(tmp_path), range(30), limits, stamp="s")
    assert planned.tasks == 60 == sum(len(a.shards) for a in planned.arrays)
    assert all(len(a.shards) <= 8 for a in planned.arrays)
    assert [c.usable for c in planned.checks] == [int(0.9 * 990), int(0.9 * 75)]
    assert limit_checks(planned.tasks, limits)[1] == []


def test_a_cluster_without_job_arrays_is_refused(tmp_path: Path) -> None:
    plan = make_plan("run-1", (1,) * 2)
    with pytest.raises(LimitError, match="MaxArraySize is 0: this cluster accepts no job arrays"):
        plan_submission(plan, RunLayout(tmp_path), range(2), SchedulerLimits(0), stamp="s")
    assert issubclass(LimitError, PlanError)
