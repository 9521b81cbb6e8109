"""The arrays a submission makes (``plan_arrays``): chunks under MaxArraySize, pulling pools split evenly,
automatic retry levels, and a two-stage run's CPU-stage arrays with their dependencies."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import Plan, RunLayout, StagePlan
from ddslurm.config.testing import make_plan
from ddslurm.planner import plan_arrays, pulling_tasks

STAGES = (StagePlan(kind="gpu", columns=("topic", "draft")), StagePlan(kind="cpu", columns=("q",)))


@pytest.mark.parametrize(
    ("shards", "allocations", "max_array", "tasks", "pools"),
    [
        (11, 5, 2, [2, 2, 1], [4, 4, 3]),
        (7, 3, 1001, [3], [7]),
        (4, 4, 1, [1, 1, 1, 1], [1, 1, 1, 1]),
    ],
)
def test_pulling_arrays_stay_under_max_array_size_and_split_the_pool_evenly(
    tmp_path: Path, shards: int, allocations: int, max_array: int, tasks: list[int], pools: list[int]
) -> None:
    plan = make_plan("run-1", (1,) * shards, allocations=allocations, client_workers=1)
    arrays = plan_arrays(plan, RunLayout(tmp_path), list(range(shards)), max_array, kind="initial", stamp="s")
    assert [a.tasks for a in arrays] == tasks
    assert [len(a.shards) for a in arrays] == pools
    assert sorted(s for a in arrays for s in a.shards) == list(range(shards))
    assert all((a.tasks or 0) <= len(a.shards) for a in arrays)


def test_a_retry_asks_for_as_many_allocations_as_its_shards_need() -> None:
    plan = make_plan("run-1", (1,) * 20, allocations=6, client_workers=2)
    assert pulling_tasks(plan, 20, "initial") == 6
    assert pulling_tasks(plan, 3, "retry") == 2  # 3 shards, 2 workers each: 2 allocations
    assert pulling_tasks(plan, 1, "retry") == 1
    assert pulling_tasks(make_plan("run-1", (1,) * 3), 3, "retry") is None  # one task per shard


def _staged(tmp_path: Path, **overrides: object) -> tuple[Plan, RunLayout]:
    layout = RunLayout(tmp_path / "run-1")
    plan = make_plan("run-1", (2, 2, 2, 2), **{"stages": STAGES, **overrides})
    return plan, layout


def _shape(arrays: tuple[object, ...]) -> list[tuple[object, ...]]:
    return [(a.stage, a.kind, a.shards, a.tasks, a.after, a.after_any) for a in arrays]  # type: ignore[attr-defined]


def test_every_gpu_array_is_followed_by_a_cpu_array_after_it_and_after_the_previous_cpu_array(
    tmp_path: Path,
) -> None:
    plan, layout = _staged(tmp_path, retries=1)
    arrays = plan_arrays(plan, layout, [0, 1, 2, 3], 1000, kind="initial", stamp="s")
    assert _shape(arrays) == [
        (0, "initial", (0, 1, 2, 3), None, None, ()),
        (1, "initial", (0, 1, 2, 3), 4, None, (0,)),
        (0, "auto-retry", (0, 1, 2, 3), None, 0, ()),
        (1, "auto-retry", (0, 1, 2, 3), 4, None, (2, 1)),
    ]
    assert [a.index for a in arrays] == [0, 1, 2, 3]
    assert len({a.script for a in arrays}) == 4


def test_chunks_and_pulling_allocations_get_as_many_cpu_allocations_as_gpu_tasks(tmp_path: Path) -> None:
    plan, layout = _staged(tmp_path, allocations=2, client_workers=2)
    arrays = plan_arrays(plan, layout, [0, 1, 2, 3], 1, kind="initial", stamp="s")
    assert _shape(arrays) == [
        (0, "initial", (0, 1), 1, None, ()),
        (1, "initial", (0, 1), 1, None, (0,)),
        (0, "initial", (2, 3), 1, None, ()),
        (1, "initial", (2, 3), 1, None, (2,)),
    ]


def test_a_retry_gives_shards_whose_gpu_stage_is_done_only_a_cpu_array(tmp_path: Path) -> None:
    plan, layout = _staged(tmp_path)
    arrays = plan_arrays(plan, layout, [0, 1, 3], 1000, kind="retry", stamp="s", gpu_done={1})
    assert _shape(arrays) == [
        (1, "retry", (1,), 1, None, ()),
        (0, "retry", (0, 3), None, None, ()),
        (1, "retry", (0, 3), 2, None, (1,)),
    ]
    only_cpu = plan_arrays(plan, layout, [1, 2], 1000, kind="retry", stamp="s", gpu_done={1, 2})
    assert _shape(only_cpu) == [(1, "retry", (1, 2), 2, None, ())]


def test_single_stage_plans_are_planned_as_before(tmp_path: Path) -> None:
    plan, layout = _staged(tmp_path, stages=(), retries=1)
    arrays = plan_arrays(plan, layout, [0, 1], 1000, kind="initial", stamp="s", gpu_done={0})
    assert _shape(arrays) == [(None, "initial", (0, 1), None, None, ()), (None, "auto-retry", (0, 1), None, 0, ())]
