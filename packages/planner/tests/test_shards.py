"""plan_shards: every shard's records and seed block reproduce what an unsharded Data Designer run uses.

The model of Data Designer here is the one its seed generator implements (checked against the real engine in
tests/test_seed_sharding.py): record j of a run reading the selection [start, start + M) uses row
start + j % M (ORDERED), and a shard given IndexRange(s, e) reads s, s+1, ..., e, s, ... from its first record.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from ddslurm.config import SeedRows, ShardSpec
from ddslurm.planner import PlanError, plan_shards


def _ordered_unsharded(records: int, pool: SeedRows) -> list[int]:
    return [pool.start + j % pool.rows for j in range(records)]


def _ordered_sharded(specs: tuple[ShardSpec, ...]) -> list[int]:
    rows: list[int] = []
    for spec in specs:
        assert spec.seed_start is not None and spec.seed_end is not None
        width = spec.seed_end - spec.seed_start + 1
        rows += [spec.seed_start + k % width for k in range(spec.num_records)]
    return rows


def _check_contiguous(specs: tuple[ShardSpec, ...], records: int, shards: int) -> None:
    assert len(specs) == shards
    assert [s.index for s in specs] == list(range(shards))
    assert specs[0].first_record == 0
    for prev, nxt in itertools.pairwise(specs):
        assert nxt.first_record == prev.first_record + prev.num_records
    assert specs[-1].first_record + specs[-1].num_records == records
    assert all(s.num_records >= 1 for s in specs)


# 60 seed rows, 60 records, 7 shards and 20 over 3 are the cases the issue reported (rows used twice / never).
CASES = [(60, 60, 7), (20, 20, 3), (10, 25, 4), (7, 30, 4), (10, 100, 3), (3, 10, 10), (50, 20, 6), (13, 13, 13)]
GRID = [
    (rows, records, shards)
    for rows in (1, 2, 3, 5, 7, 10, 16)
    for records in (1, 2, 5, 9, 16, 17, 31, 60)
    for shards in (1, 2, 3, 4, 7, 9, 16)
    if shards <= records
]


@pytest.mark.parametrize(("rows", "records", "shards"), CASES + GRID)
@pytest.mark.parametrize("start", [0, 3])
def test_ordered_shards_use_exactly_the_rows_of_an_unsharded_run(
    rows: int, records: int, shards: int, start: int
) -> None:
    pool = SeedRows.of(start, rows)
    specs = plan_shards(records, shards, pool)
    _check_contiguous(specs, records, shards)
    assert _ordered_sharded(specs) == _ordered_unsharded(records, pool)
    for spec in specs:  # every block lies inside the selection
        assert spec.seed_start is not None and spec.seed_end is not None
        assert start <= spec.seed_start <= spec.seed_end < start + rows


@pytest.mark.parametrize(("rows", "records", "shards"), CASES + GRID)
def test_shuffled_shards_use_every_row_as_often_as_an_unsharded_run(rows: int, records: int, shards: int) -> None:
    """SHUFFLE reads a fresh permutation of a shard's block per cycle: the rows every shard surely uses (its
    whole cycles) plus at most one random remainder must give each row floor or ceil of records/rows uses."""
    specs = plan_shards(records, shards, SeedRows.of(0, rows))
    certain: Counter[int] = Counter()
    random_parts = 0
    for spec in specs:
        assert spec.seed_start is not None and spec.seed_end is not None
        width = spec.seed_end - spec.seed_start + 1
        full, rest = divmod(spec.num_records, width)
        for row in range(spec.seed_start, spec.seed_end + 1):
            certain[row] += full
        if rest:
            random_parts += 1
            assert width == rows, "a random remainder is drawn from the whole selection, as DD draws it"
    assert random_parts <= 1
    low = records // rows
    assert all(certain[row] in (low, low + 1) for row in range(rows))
    if random_parts:  # the remainder may pick any row once more: every row must still be at the lower count
        assert all(certain[row] == low for row in range(rows))


@pytest.mark.parametrize(("records", "shards"), [(60, 7), (20, 3), (10, 10), (1000, 7)])
def test_records_within_one_cycle_split_evenly(records: int, shards: int) -> None:
    sizes = [s.num_records for s in plan_shards(records, shards, SeedRows.of(0, records))]
    assert max(sizes) - min(sizes) <= 1
    assert [s.num_records for s in plan_shards(records, shards)] == sizes


def test_the_reported_cases_now_match_data_designers_blocks() -> None:
    specs = plan_shards(60, 7, SeedRows.of(0, 60))
    assert [(s.first_record, s.num_records, s.seed_start, s.seed_end) for s in specs][:2] == [
        (0, 9, 0, 8),
        (9, 9, 9, 17),
    ]
    specs = plan_shards(20, 3, SeedRows.of(0, 20))
    assert [(s.seed_start, s.seed_end) for s in specs] == [(0, 6), (7, 13), (14, 19)]


def test_no_seed_means_no_block() -> None:
    assert all(s.seed_start is None and s.seed_end is None for s in plan_shards(10, 3))


@pytest.mark.parametrize(
    ("records", "shards", "pool", "message"),
    [(5, 0, None, "at least 1"), (3, 4, None, "exceeds num_records"), (5, 2, SeedRows.of(0, 0), "at least one")],
)
def test_plan_shards_refuses(records: int, shards: int, pool: SeedRows | None, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_shards(records, shards, pool)
