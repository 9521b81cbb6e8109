"""Faults, with a fake Slurm: cancelling a run with automatic retries, a task that could not record why it
ended, a requeued task, a time limit too short to be useful, and a winner whose files changed."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import (
    AttemptRecord,
    CancelRecord,
    FileEntry,
    ProviderSnapshot,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    encode,
    make_private_dir,
    publish_once,
    read_json,
    sha256_file,
)
from ddslurm.config.testing import make_plan
from ddslurm.launcher import (
    LauncherError,
    Slurm,
    SubmitError,
    prepare,
    render_generation,
    run_status,
    submit,
)
from ddslurm.launcher.runs._steer import cancel, retry
from ddslurm.launcher.submission._render import warning_seconds
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, write_attempt, write_unit_run

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

KEY = "sk-faults-test-value-123"


def _files(tmp_path: Path, run_extra: str = "", *, shards: int = 3) -> tuple[Path, Path, dict[str, str]]:
    return write_unit_run(tmp_path, KEY, shards=shards, run_extra=run_extra)


def _run(tmp_path: Path, run_extra: str = "", *, shards: int = 3) -> tuple[RunLayout, dict[str, str]]:
    """A submitted run (3 shards by default; ``retries: N`` in ``run_extra`` adds retry arrays)."""
    run, profile, env = _files(tmp_path, run_extra, shards=shards)
    done = submit(run, profile, slurm=Slurm(FakeSlurm()), host=HOST, env=env)
    return RunLayout(done.layout.root), env


# --- 1. cancel: every array of the run, in one scancel call, and a record that stops later attempts ---


def test_cancelling_a_run_cancels_every_array_in_one_call_and_records_it(tmp_path: Path) -> None:
    layout, _ = _run(tmp_path, "retries: 2\n")
    arrays = sorted(read_json(p, SubmissionRecord).array_job_id for p in layout.submissions.glob("*.json"))
    assert arrays == ["4242", "4243", "4244"]  # the run and its two automatic retry arrays
    runner = FakeSlurm(squeue="4242_0|RUNNING|None\n4243_[0-2]|PENDING|Dependency\n4244_[0-2]|PENDING|Dependency\n")
    done = cancel(layout, Slurm(runner))
    assert done.run and done.ids == ("4244", "4243", "4242")  # newest first: no retry is released meanwhile
    assert runner.commands("scancel") == [["scancel", "4244", "4243", "4242"]]
    record = read_json(layout.cancelled, CancelRecord)
    assert record.array_job_ids == ("4244", "4243", "4242")
    cancel(layout, Slurm(FakeSlurm()))  # cancelling again keeps the first record
    assert read_json(layout.cancelled, CancelRecord) == record
    status = run_status(layout, Slurm(FakeSlurm(sacct="4242_[0-2]|CANCELLED|0:0|None\n")))
    assert status.state == "cancelled" and status.cancelled_at == record.cancelled_at


def test_cancelling_shards_also_cancels_their_tasks_in_pending_retry_arrays(tmp_path: Path) -> None:
    layout, _ = _run(tmp_path, "retries: 2\n")
    runner = FakeSlurm(
        squeue="4242_0|RUNNING|None\n4242_1|RUNNING|None\n4243_[0-2]|PENDING|Dependency\n"
        "4244_[0-2]|PENDING|Dependency\n",
        sacct="4242_2|COMPLETED|0:0|None\n",
    )
    done = cancel(layout, Slurm(runner), [1, 2])
    assert not done.run and not layout.cancelled.exists()
    assert done.ids == ("4244_1", "4244_2", "4243_1", "4243_2", "4242_1")
    assert runner.commands("scancel") == [["scancel", *done.ids]]


def test_an_attempt_that_begins_after_the_run_was_cancelled_generates_nothing(tmp_path: Path) -> None:
    from ddslurm.runtime import EXIT_OK, AttemptRunner, Inputs
    from ddslurm.runtime._log import new_logger

    layout = RunLayout(tmp_path / "run")
    make_private_dir(layout.root)
    plan = make_plan("run", (2, 2))
    inputs = Inputs(plan=plan, plan_sha256="-", recipe={}, snapshot=ProviderSnapshot())
    calls: list[object] = []

    def engine(request: object) -> object:
        calls.append(request)
        raise AssertionError("the engine must not run")

    runner = AttemptRunner(layout, engine=engine, env={}, make_logger=new_logger)  # type: ignore[arg-type]
    assert publish_once(layout.cancelled, encode(CancelRecord(cancelled_at="t", array_job_ids=("7",))))
    assert runner.begin(inputs, 1, "9", "n1", slurm_log=str(layout.logs / "slurm-7_1.out")) is None
    assert runner.run(inputs, 0, "10", "n1") == EXIT_OK
    assert calls == []
    for shard, job in ((1, "9"), (0, "10")):
        record = read_json(layout.shard(shard).attempt(f"attempt-{job}").record, AttemptRecord)
        assert (record.state, record.reason) == ("cancelled", "run_cancelled") and record.ended_at


def test_status_of_a_shard_whose_attempt_saw_the_cancel_record(tmp_path: Path) -> None:
    layout, _ = _run(tmp_path, "retries: 1\n", shards=1)
    write_attempt(layout, 0, "4242", "failed", reason="cancelled", task="4242_0")
    write_attempt(layout, 0, "4243", "cancelled", reason="run_cancelled", task="4243_0")
    publish_once(layout.cancelled, encode(CancelRecord(cancelled_at="t", array_job_ids=("4243", "4242"))))
    sacct = "4242_0|CANCELLED|0:0|None\n4243_0|COMPLETED|0:0|None\n"
    status = run_status(layout, Slurm(FakeSlurm(sacct=sacct)))
    shard = status.shards[0]
    assert (status.state, shard.state, shard.reason) == ("cancelled", "cancelled", "run_cancelled")


def test_retry_of_a_cancelled_run_needs_the_explicit_flag(tmp_path: Path) -> None:
    layout, env = _run(tmp_path)
    cancel(layout, Slurm(FakeSlurm()))
    runner = FakeSlurm(sacct="4242_[0-2]|CANCELLED|0:0|None\n")
    runner.next_id = 5000
    with pytest.raises(LauncherError, match=r"was cancelled .*--resume-cancelled"):
        retry(layout, Slurm(runner), env)
    assert runner.commands("sbatch") == [] and layout.cancelled.exists()
    done = retry(layout, Slurm(runner), env, resume_cancelled=True)
    assert done.shards == (0, 1, 2) and done.job_ids == ("5000",)
    assert not layout.cancelled.exists()
    assert [p.name for p in layout.root.glob("cancelled-cleared-*.json")]  # the record is kept, aside


# --- 2. a task that could not record why it ended: Slurm's record says ---


@pytest.mark.parametrize(
    ("sacct", "log", "reason"),
    [
        pytest.param("FAILED|0:9", "", "killed (signal 9)", id="sigkill-of-the-controller"),
        pytest.param("FAILED|1:0", "OSError: [Errno 28] No space left on device", "disk_full", id="disk-full"),
        pytest.param("FAILED|2:0", "", "exited (code 2)", id="exit-code"),
        pytest.param("NODE_FAIL|0:0", "", "node_fail", id="node-failure"),
        pytest.param("OUT_OF_MEMORY|0:125", "", "out_of_memory", id="oom"),
        pytest.param("TIMEOUT|0:0", "", "timeout", id="timeout"),
        pytest.param("COMPLETED|0:0", "", "no_result", id="exited-0-without-a-record"),
    ],
)
def test_attempt_stuck_running_gets_its_end_from_slurm(tmp_path: Path, sacct: str, log: str, reason: str) -> None:
    layout, _ = _run(tmp_path, shards=1)
    write_attempt(layout, 0, "4242", "running", task="4242_0")
    (layout.logs / "slurm-4242_0.out").write_text(f"Traceback (most recent call last):\n{log}\n")
    status = run_status(layout, Slurm(FakeSlurm(sacct=f"4242_0|{sacct}|None\n")))
    shard = status.shards[0]
    assert (status.state, shard.state, shard.reason) == ("failed", "failed", reason)
    assert shard.message is not None and f"Slurm: {sacct.split('|')[0]}" in shard.message
    assert "attempt-4242 still says running" in shard.message


def test_a_sigterm_the_attempt_recorded_is_explained_by_slurm(tmp_path: Path) -> None:
    """The node went away: the attempt saw only a SIGTERM; Slurm knows it was a node failure."""
    layout, _ = _run(tmp_path, shards=1)
    write_attempt(layout, 0, "4242", "failed", reason="cancelled", task="4242_0")
    status = run_status(layout, Slurm(FakeSlurm(sacct="4242_0|NODE_FAIL|0:0|None\n")))
    assert (status.shards[0].state, status.shards[0].reason) == ("failed", "node_fail")


# --- 3. a requeued task is pending again: say so, not what stopped its attempt ---


@pytest.mark.parametrize(
    ("sacct", "reason"),
    [
        pytest.param("4242_0|NODE_FAIL|0:0|None\n", "requeued (node failure)", id="node-failure"),
        pytest.param("4242_0|REQUEUED|0:0|None\n", "requeued", id="scontrol-requeue"),
        pytest.param("", "requeued", id="accounting-lag"),
    ],
)
def test_requeued_task_is_shown_requeued(tmp_path: Path, sacct: str, reason: str) -> None:
    layout, _ = _run(tmp_path, shards=1)
    write_attempt(layout, 0, "4242", "failed", reason="cancelled", task="4242_0")
    status = run_status(layout, Slurm(FakeSlurm(squeue="4242_0|PENDING|BeginTime\n", sacct=sacct)))
    shard = status.shards[0]
    assert (shard.state, shard.reason) == ("pending", reason)
    assert shard.message is not None and "requeued task 4242_0" in shard.message


def test_a_requeued_task_cancelled_before_it_ran_again_ends_cancelled(tmp_path: Path) -> None:
    """Slurm 22.05 records no end for a requeued task cancelled while pending: sacct's latest row stays REQUEUED
    and squeue no longer lists it. The shard is cancelled (and the cancelled run ends), not pending for ever."""
    layout, _ = _run(tmp_path, shards=1)
    write_attempt(layout, 0, "4242", "failed", reason="cancelled", task="4242_0")
    sacct = "4242_0|REQUEUED|0:0|None\n"
    status = run_status(layout, Slurm(FakeSlurm(squeue="", sacct=sacct)))
    shard = status.shards[0]
    assert (status.state, shard.state, shard.slurm_state) == ("cancelled", "cancelled", "CANCELLED")
    still_queued = run_status(layout, Slurm(FakeSlurm(squeue="4242_0|PENDING|BeginTime\n", sacct=sacct)))
    # Queued again: the shard waits, the run that ran is running (never back to pending).
    assert (still_queued.state, still_queued.shards[0].state) == ("running", "pending")


def test_a_retry_pending_after_a_failure_is_not_called_requeued(tmp_path: Path) -> None:
    layout, _ = _run(tmp_path, "retries: 1\n", shards=1)
    write_attempt(layout, 0, "4242", "failed", reason="client_failed", task="4242_0")
    status = run_status(layout, Slurm(FakeSlurm(squeue="4243_0|PENDING|Priority\n", sacct="4242_0|FAILED|1:0|None\n")))
    assert (status.shards[0].state, status.shards[0].reason) == ("pending", "client_failed")


# --- 4. a time limit too short for Slurm's early warning ---


def test_time_limit_below_the_minimum_is_refused_at_submit(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, "submission:\n  time_limit: 1\n")
    with pytest.raises(SubmitError, match=r"submission\.time_limit: 1 is 1 minute\(s\); at least 2 .* 60 s early"):
        prepare(run, profile, env, datetime.now(UTC), host=HOST)
    run.write_text(run.read_text().replace("time_limit: 1", "time_limit: 2"))
    prepared = prepare(run, profile, env, datetime.now(UTC), host=HOST)
    assert "#SBATCH --signal=B:USR1@15" in render_generation(prepared.plan, prepared.layout, [0])


@pytest.mark.parametrize("minutes", [2, 3, 4, 5, 7, 10, 60, 1440])
def test_warning_window_leaves_useful_time_even_when_slurm_warns_a_minute_early(minutes: int) -> None:
    warning = warning_seconds(minutes)
    earliest = minutes * 60 - warning - 60  # Slurm may send the warning up to 60 s early
    assert 10 <= warning <= 90
    assert earliest >= minutes * 60 * 3 // 8, (minutes, warning, earliest)


# --- 5. a winner whose files no longer verify ---


def _winner(layout: RunLayout, shard: int) -> Path:
    dataset = layout.shard(shard).attempt("attempt-77").output / f"shard-{shard:05d}"
    (dataset / "parquet-files").mkdir(parents=True)
    batch = dataset / "parquet-files" / "batch_00000.parquet"
    pq.write_table(pa.table({"q": ["alpha", "bravo", "charl", "delta"]}), batch, compression="none")
    entry = FileEntry(path="parquet-files/batch_00000.parquet", size=batch.stat().st_size, sha256=sha256_file(batch))
    winner = WinnerRecord(
        shard=shard,
        attempt="attempt-77",
        rows=4,
        dataset_dir=str(dataset),
        files=(entry,),
        plan_sha256="-",
        published_at="-",
    )
    assert publish_once(layout.shard(shard).winner, encode(winner))
    old = layout.shard(shard).winner.stat().st_mtime_ns - 10**9  # published a second ago
    os.utime(layout.shard(shard).winner, ns=(old, old), follow_symlinks=False)
    return batch


def test_winner_changed_in_place_with_its_size_kept_is_corrupt(tmp_path: Path) -> None:
    layout, env = _run(tmp_path, shards=1)
    batch = _winner(layout, 0)
    assert run_status(layout, Slurm(FakeSlurm())).state == "succeeded"
    data = batch.read_bytes()
    assert data.count(b"bravo") == 1
    batch.write_bytes(data.replace(b"bravo", b"BRAVO"))  # same size, still a readable Parquet file
    assert pq.read_table(batch).column("q").to_pylist()[1] == "BRAVO"
    status = run_status(layout, Slurm(FakeSlurm()))
    shard = status.shards[0]
    assert (status.state, shard.state, shard.reason) == ("failed", "corrupt", "winner_corrupt")
    assert shard.message is not None and str(batch) in shard.message and "sha256" in shard.message
    assert status.records_done == 0
    with pytest.raises(LauncherError, match=r"shard 0 has a winner that no longer verifies .* move .*winner\.json"):
        retry(layout, Slurm(FakeSlurm()), env, [0])
    assert retry(layout, Slurm(FakeSlurm()), env).shards == ()  # never a retry that would be superseded


def test_winner_with_a_missing_file_or_an_unreadable_record_is_corrupt(tmp_path: Path) -> None:
    layout, _ = _run(tmp_path, shards=2)
    _winner(layout, 0).unlink()
    (layout.shard(1).winner).write_text('{"shard": 1, "attem')
    shards = run_status(layout, Slurm(FakeSlurm())).shards
    assert [(s.state, s.reason) for s in shards] == [("corrupt", "winner_corrupt"), ("corrupt", "winner_unreadable")]
    assert shards[0].message is not None and "batch_00000.parquet is missing" in shards[0].message


def test_wait_treats_a_corrupt_winner_as_a_failed_run(tmp_path: Path) -> None:
    import io

    from ddslurm.launcher.cli import main
    from ddslurm.launcher.commands._output import ExitCode

    layout, env = _run(tmp_path, shards=1)
    batch = _winner(layout, 0)
    batch.write_bytes(batch.read_bytes().replace(b"alpha", b"ALPHA"))
    out = io.StringIO()
    argv = ["wait", str(layout.root), "--timeout", "5"]
    assert main(argv, env=env, slurm=Slurm(FakeSlurm()), sleep=lambda _: None, stdout=out) == ExitCode.FAILED
    assert "corrupt" in out.getvalue() and "batch_00000.parquet" in out.getvalue()
