"""A requeued job's next incarnation records the attempts its earlier incarnation was running as requeued."""

from __future__ import annotations

from pathlib import Path

from ddslurm.config import AttemptRecord, read_json
from ddslurm.runtime import load_inputs
from ddslurm.runtime._requeue import mark_requeued
from ddslurm.runtime._stop import InterruptedFailure, TimeLimitFailure
from ddslurm.runtime.testing import attempt_runner, write_run


def test_the_next_incarnation_marks_the_stopped_attempts_of_the_one_before_requeued(tmp_path: Path) -> None:
    layout = write_run(tmp_path / "run-1", (4, 4, 4))
    runner = attempt_runner(layout, env={"T_KEY": "x"})
    inputs = load_inputs(layout)
    for shard, job, failure in (
        (0, "77_0", InterruptedFailure("the job was cancelled (SIGTERM)")),  # this job's, stopped: requeued
        (1, "77_0", TimeLimitFailure("the job reached its time-limit warning")),  # this job's, its time limit
        (2, "78_0", InterruptedFailure("the job was cancelled (SIGTERM)")),  # another job's
    ):
        began = runner.begin(inputs, shard, job, "n1")
        assert began is not None
        runner.fail(began, failure)
    assert mark_requeued(layout, "77_0", 0) == []  # a first incarnation has none before it
    assert mark_requeued(layout, "77_0", 1) == [layout.shard(0).attempt("attempt-77_0").record]
    record = read_json(layout.shard(0).attempt("attempt-77_0").record, AttemptRecord)
    assert (record.state, record.reason) == ("failed", "requeued")
    assert "incarnation 1 runs again" in (record.message or "")
    assert read_json(layout.shard(1).attempt("attempt-77_0").record, AttemptRecord).reason == "time_limit"
    assert read_json(layout.shard(2).attempt("attempt-78_0").record, AttemptRecord).reason == "cancelled"
    assert mark_requeued(layout, "77_0", 1) == []  # once
