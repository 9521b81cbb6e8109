"""The batch size (``buffer_size``) the planner chooses where the run file sets none: each shard saves its work
at least 5 times and at least every 5 minutes of its predicted generation (issue 34: checkpoints by default)."""

from __future__ import annotations

import pytest

from ddslurm.config import Plan, Resources
from ddslurm.config.testing import make_plan
from ddslurm.planner._batches import CHECKPOINT_S, CHECKPOINTS_PER_SHARD, batch_text, batch_warnings, plan_batches


def test_a_60_record_shard_cancelled_at_60_percent_asks_for_at_most_75_records_in_all() -> None:
    """The issue's case: with Data Designer's default batch a shard of 60 records cancelled after 36 had saved none
    of them and asked for 96 records in all. A cancel cuts the batch in progress, all of whose records Data Designer
    has asked for (max_parallel_requests at least the batch): the shard asks for what it saved, that whole batch,
    then the rest again."""
    size, batching = plan_batches(None, [60], None)
    assert (size, batching.batches) == (12, 5)
    saved = (36 // size) * size
    assert saved + size + (60 - saved) <= 75 - 2  # and one health check of each client run
    assert saved + size + (60 - saved) == 60 + size


def test_the_run_files_buffer_size_is_kept_and_capped_at_the_records() -> None:
    assert plan_batches(7, [20, 20], None)[0] == 7
    size, batching = plan_batches(1000, [20, 20], 2.0)
    assert size == 40 and batching.by == "run file" and batching.batches == 1
    assert batching.batch_s == pytest.approx(40.0)  # a shard's 20 records: its one batch (the 40 span two shards)
    assert batching.rule == "buffer_size 1000 from the run file"


@pytest.mark.parametrize("record_s", [0.5, 3.0, 30.0, 400.0])
def test_a_predicted_slow_shard_saves_at_least_every_five_minutes(record_s: float) -> None:
    size, batching = plan_batches(None, [2_000], record_s)
    assert batching.batch_s is not None and batching.batch_s == pytest.approx(size * record_s)
    assert size * record_s <= CHECKPOINT_S or size == 1
    assert size <= 2_000 // CHECKPOINTS_PER_SHARD
    if record_s * (2_000 // CHECKPOINTS_PER_SHARD) > CHECKPOINT_S:  # the time rule decided: the largest it allows
        assert (size + 1) * record_s > CHECKPOINT_S
        assert "5 min" in batching.rule


def _plan(buffer_size: int | None, shard_rows: tuple[int, ...], record_s: float | None, minutes: int = 10) -> Plan:
    size, batching = plan_batches(buffer_size, shard_rows, record_s)
    return make_plan(
        shard_rows=shard_rows, buffer_size=size, batching=batching, generation=Resources(time_minutes=minutes)
    )


def test_the_bill_says_how_much_work_a_cancel_can_lose_in_minutes_where_predicted() -> None:
    text = batch_text(_plan(None, (2_000,), 1.5))
    # 300 s / 1.5 s a record = 200 records: 10 saves of a 2,000-record shard, 5 minutes of work each
    assert text.startswith("200 records a batch (chosen by the planner: a batch at most every 5 min")
    assert "a shard of 2000 saves 10 times" in text
    assert text.endswith("loses at most a batch: about 5.0 min of work")
    assert batch_text(_plan(None, (60,), None)).endswith(
        "saves 5 times; a cancel or a time limit loses at most a batch"
    )


def test_the_planners_batches_warn_of_nothing() -> None:
    for rows, record_s in (((60,), None), ((2_000,), 900.0), ((5, 5), None)):
        assert batch_warnings(_plan(None, rows, record_s, minutes=1)) == ()


def test_a_run_files_batch_longer_than_the_time_limit_is_no_batch_advice() -> None:
    """A batch predicted to be saved after the time limit is an overrun (``_fit``, test_fit.py), not advice."""
    assert batch_warnings(_plan(50, (100,), 20.0, minutes=30)) == ()  # two batches of a shard: nothing to advise


def test_a_run_files_batch_holding_a_whole_shard_is_warned_of() -> None:
    (warning,) = batch_warnings(_plan(1000, (60,), None))
    assert warning.startswith("buffer_size 60: each shard (60 records) is one batch, so it saves nothing until")
    assert batch_warnings(_plan(1000, (5,), None)) == ()  # a shard too small to save more often anyway
    assert batch_warnings(_plan(10, (60,), None)) == ()


def test_a_batch_of_a_fraction_of_a_second_is_not_said_to_lose_0_s() -> None:
    """``ddslurm init``'s starter (10 records a shard at the default rate) printed "about 0 s of work"."""
    text = batch_text(_plan(None, (10,), 0.04))
    assert text.endswith("a cancel or a time limit loses at most a batch: under 1 s of work"), text
