"""Issue 39: the one reader of an array task's names (``<array>_<task>``, ``logs/slurm-<array>_<task>.out``), beside
their one maker. ``slurm-123.out`` is job 123's output, not an array task's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import (
    BATCH_OUTPUT_PATTERN,
    ArrayTask,
    AttemptRecord,
    RunLayout,
    attempt_job,
    batch_output_task,
    parse_array_task,
)

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

RUN = RunLayout(Path("/ws/runs/run-1"))


@pytest.mark.parametrize(
    ("path", "want"),
    [
        pytest.param("/ws/runs/run-1/logs/slurm-123_4.out", ArrayTask("123", 4), id="task"),
        pytest.param("slurm-123_0.out", ArrayTask("123", 0), id="task-0-bare-name"),
        pytest.param(Path("logs/slurm-9_10.out"), ArrayTask("9", 10), id="a-path"),
        pytest.param("/ws/runs/run-1/logs/slurm-123.out", None, id="job-no-array"),
        pytest.param("slurm-123_[0-3].out", None, id="range"),
        pytest.param("slurm-123_4%2.out", None, id="throttle"),
        pytest.param("slurm-123_04.out", None, id="leading-zero-task"),
        pytest.param("slurm-0123_4.out", None, id="leading-zero-array"),
        pytest.param("slurm-123_4.out.1", None, id="suffix-after"),
        pytest.param("old-slurm-123_4.out", None, id="prefix-before"),
        pytest.param("slurm-123_4_5.out", None, id="two-tasks"),
        pytest.param("slurm-123_.out", None, id="no-task"),
        pytest.param("slurm-_4.out", None, id="no-array"),
        pytest.param("slurm-abc_4.out", None, id="not-a-number"),
        pytest.param("slurm-١٢_٣.out", None, id="other-digits"),
        pytest.param("collect-123.out", None, id="collect-job"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="none"),
    ],
)
def test_which_names_are_an_array_tasks_batch_output(path: str | Path | None, want: ArrayTask | None) -> None:
    assert batch_output_task(path) == want


@pytest.mark.parametrize(
    ("job", "want"),
    [
        pytest.param("4242_3", ArrayTask("4242", 3), id="task"),
        pytest.param("4242", None, id="job"),
        pytest.param("4242_[0-3]", None, id="range"),
        pytest.param("4242_3.0", None, id="step"),
        pytest.param(" 4242_3", None, id="space"),
        pytest.param("4242_3\n", None, id="newline"),
    ],
)
def test_which_job_ids_are_an_array_task(job: str, want: ArrayTask | None) -> None:
    assert parse_array_task(job) == want


@pytest.mark.parametrize("task", [ArrayTask("4242", 0), ArrayTask("1", 17), ArrayTask("98765", 1000)])
def test_a_name_made_reads_back_as_the_task_it_was_made_of(task: ArrayTask) -> None:
    assert parse_array_task(str(task)) == task
    assert batch_output_task(RUN.batch_output(task)) == task
    assert RUN.batch_output(task) == RUN.logs / f"slurm-{task.array_job_id}_{task.task}.out"
    # what sbatch writes for the --output pattern every generation array is submitted with
    expanded = BATCH_OUTPUT_PATTERN.replace("%A", task.array_job_id).replace("%a", str(task.task))
    assert expanded == task.batch_output and batch_output_task(expanded) == task


@pytest.mark.parametrize(
    ("slurm_log", "job"),
    [
        pytest.param("/r/logs/slurm-44_0.out", "44_0", id="array-task"),
        pytest.param("/r/logs/slurm-123.out", "45", id="job-no-array"),
        pytest.param("/r/logs/slurm-44_0.out.1", "45", id="odd-name"),
        pytest.param(None, "45", id="no-batch-output"),
    ],
)
def test_an_attempts_job_is_its_array_task_else_its_own_job_id(slurm_log: str | None, job: str) -> None:
    record = AttemptRecord(
        shard=0, attempt="attempt-45", job_id="45", node="n1", state="succeeded", started_at="t", slurm_log=slurm_log
    )
    assert attempt_job(record) == job
