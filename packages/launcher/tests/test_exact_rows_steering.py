"""Issue 17, launcher side ("exactly the rows, whatever the layout"): the automatic retry chain depends on every
earlier level, a pulling shard's own attempt record speaks once it ended, ``cancel`` finds arrays whose sbatch
timed out, and ``accept-partial`` of a two-stage shard whose GPU stage ended short."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    AttemptRecord,
    AttemptState,
    CancelRecord,
    ClaimRecord,
    Plan,
    RunLayout,
    SubmissionRecord,
    SubmitPlanRecord,
    WinnerRecord,
    atomic_write,
    encode,
    make_private_dir,
    read_json,
)
from ddslurm.launcher import Slurm
from ddslurm.launcher.cluster._slurm import Completed, SlurmTimeoutError
from ddslurm.launcher.commands._console import plan_lines
from ddslurm.launcher.commands._output import array_json
from ddslurm.launcher.errors import LauncherError
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.runs._status_model import TERMINAL
from ddslurm.launcher.runs._steer import accept_partial, cancel, continue_submission, retry
from ddslurm.launcher.submission._arrays import PartialSubmitError, read_limits, submit_shards
from ddslurm.launcher.submission._prepare import prepare
from ddslurm.launcher.submission._submit import write_run_dir
from ddslurm.launcher.testing import FakeSlurm, accept_recipe, write_attempt, write_unit_run
from ddslurm.planner import plan_submission

KEY = "sk-exact-rows-test-value-0123"


def _records(layout: RunLayout) -> list[SubmissionRecord]:
    return sorted(
        (read_json(p, SubmissionRecord) for p in layout.submissions.glob("*.json")), key=lambda r: int(r.array_job_id)
    )


def _dependency(script: str) -> str | None:
    found = re.search(r"^#SBATCH --dependency=(\S+)$", script, re.MULTILINE)
    return None if found is None else found.group(1)


def _run(tmp_path: Path, extra: str, shards: int = 3) -> tuple[RunLayout, dict[str, str], Plan]:
    run, profile, env = write_unit_run(tmp_path, KEY, num_records=4 * shards, shards=shards, run_extra=extra)
    now = datetime.now(UTC)
    prepared = prepare(run, profile, env, now, check_recipe=accept_recipe)
    write_run_dir(prepared)
    return prepared.layout, env, prepared.plan


class _FailsSecondSbatch(FakeSlurm):
    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        if argv[0] == "sbatch" and len(self.commands("sbatch")) == 1:
            self.calls.append(list(argv))
            return Completed(1, "", "sbatch: error: Batch job submission failed")
        return super().__call__(argv, env=env)


# --- item 7: retry level k follows afternotok of every earlier level of its chain ---


def test_each_automatic_retry_level_waits_for_the_failure_of_every_earlier_level(tmp_path: Path) -> None:
    layout, env, plan = _run(tmp_path, "retries: 3\n")
    submit_shards(layout, plan, [0, 1, 2], Slurm(FakeSlurm()), env, datetime.now(UTC))
    records = _records(layout)
    assert [r.kind for r in records] == ["initial", "auto-retry", "auto-retry", "auto-retry"]
    jobs = [r.array_job_id for r in records]
    deps = [_dependency(Path(r.script).read_text()) for r in records]
    # Level 0 succeeding makes Slurm cancel level 1; level 2 must not count that cancellation as a failure.
    assert deps == [
        None,
        f"afternotok:{jobs[0]}",
        f"afternotok:{jobs[1]}:{jobs[0]}",
        f"afternotok:{jobs[2]}:{jobs[1]}:{jobs[0]}",
    ]
    assert all("#SBATCH --kill-on-invalid-dep=yes" in Path(r.script).read_text() for r in records[1:])
    assert [r.after for r in records] == [None, jobs[0], jobs[1], jobs[2]]  # the array each level follows


def test_the_dry_run_and_its_json_show_the_whole_chain(tmp_path: Path) -> None:
    layout, _, plan = _run(tmp_path, "retries: 2\n")
    planned = plan_submission(plan, layout, [0, 1, 2], read_limits(Slurm(FakeSlurm()), plan), stamp="s")
    lines = plan_lines(planned)
    assert lines[1].endswith("(initial)")
    assert lines[2].endswith("(auto-retry)  --dependency=afternotok:<array 0>")
    assert lines[3].endswith("(auto-retry)  --dependency=afternotok:<array 1>:<array 0>")
    assert [array_json(a, plan=planned.arrays)["after_failure_of"] for a in planned.arrays] == [[], [0], [1, 0]]
    assert [array_json(a)["after"] for a in planned.arrays] == [None, 0, 1]


def test_submit_continue_gives_a_later_level_the_job_ids_of_every_earlier_level(tmp_path: Path) -> None:
    layout, env, plan = _run(tmp_path, "retries: 2\n")

    with pytest.raises(PartialSubmitError):  # the second sbatch fails: level 0 is queued, levels 1 and 2 are not
        submit_shards(layout, plan, [0, 1, 2], Slurm(_FailsSecondSbatch()), env, datetime.now(UTC))
    assert read_json(layout.submit_plan, SubmitPlanRecord).arrays[2].after == 1
    later = FakeSlurm()
    later.next_id = 5000
    done = continue_submission(layout, Slurm(later), env)
    records = _records(layout)
    assert len(records) == 3 and len(done.job_ids) == 2
    by_index = {r.plan_index: r for r in records}
    first, second = by_index[0].array_job_id, by_index[1].array_job_id
    assert _dependency(Path(by_index[1].script).read_text()) == f"afternotok:{first}"
    assert _dependency(Path(by_index[2].script).read_text()) == f"afternotok:{second}:{first}"


# --- item 8: a pulling shard's own attempt record speaks once it has ended ---


def _pulling(tmp_path: Path, shards: int = 4) -> tuple[RunLayout, dict[str, str]]:
    layout, env, plan = _run(tmp_path, "allocations: 2\n", shards=shards)
    submit_shards(layout, plan, list(range(shards)), Slurm(FakeSlurm()), env, datetime.now(UTC))
    assert read_json(layout.submissions / "4242.json", SubmissionRecord).tasks == 2  # two pulling allocations
    return layout, env


def _claimed_attempt(layout: RunLayout, shard: int, task: int, job: str, state: AttemptState, **fields: object) -> None:
    """Shard ``shard`` claimed by allocation ``task`` (job ``job``) of array 4242, with an attempt in ``state``."""
    make_private_dir(layout.shard(shard).claims, exist_ok=True)
    claim = ClaimRecord(shard=shard, array_job_id="4242", task=task, job_id=job, node="n1", claimed_at="-")
    atomic_write(layout.shard(shard).claim("4242"), encode(claim))
    record = write_attempt(layout, shard, job, state, task=f"4242_{task}", progress=2)
    if fields:
        record = msgspec.structs.replace(record, **fields)
        atomic_write(layout.shard(shard).attempt(record.attempt).record, encode(record))


BUSY = "4242_0|RUNNING|None\n4242_1|RUNNING|None\n"


def test_a_pulling_shard_whose_attempt_ended_is_not_running_while_its_allocation_still_is(tmp_path: Path) -> None:
    layout, _ = _pulling(tmp_path, shards=5)
    _claimed_attempt(layout, 0, 0, "5000", "failed", reason="generation_failed", message="boom", client_runs=1)
    _claimed_attempt(layout, 1, 0, "5000", "running")
    _claimed_attempt(layout, 2, 1, "5001", "partial", reason="rows_dropped", rows=3)
    _claimed_attempt(layout, 3, 1, "5001", "cancelled", reason="shard_cancelled")
    # failed but retryable with a client run left: the allocation reruns it inside itself (client_retries 1)
    _claimed_attempt(layout, 4, 1, "5001", "failed", reason="client_failed", retryable=True, client_runs=1)
    status = run_status(layout, Slurm(FakeSlurm(squeue=BUSY)))
    got = [(s.state, s.reason, s.job_id) for s in status.shards]
    assert got == [
        ("failed", "generation_failed", "4242_0"),
        ("running", None, "4242_0"),
        ("partial", "rows_dropped", "4242_1"),
        ("cancelled", "shard_cancelled", "4242_1"),
        ("running", "client_failed", "4242_1"),
    ]
    assert status.shards[0].message == "boom" and status.shards[0].slurm_state == "RUNNING"
    assert status.state == "running"


def test_a_pulling_shard_rerun_inside_its_allocation_shows_running_again(tmp_path: Path) -> None:
    layout, _ = _pulling(tmp_path, shards=3)
    _claimed_attempt(layout, 0, 0, "5000", "failed", reason="client_failed", retryable=True, client_runs=2)
    status = run_status(layout, Slurm(FakeSlurm(squeue=BUSY)))
    assert status.shards[0].state == "failed"  # its client runs are spent (1 + client_retries 1): it ended
    _claimed_attempt(layout, 0, 0, "5000", "running", client_runs=3)  # the record is back to running
    assert run_status(layout, Slurm(FakeSlurm(squeue=BUSY))).shards[0].state == "running"


def test_a_requeued_pulling_allocation_runs_its_shards_again_they_are_not_ended(tmp_path: Path) -> None:
    """Slurm requeued allocation 4242_0 (same job id): its first incarnation's attempts ended when it was stopped,
    and the running incarnation claims the shards again; until it begins their new attempts they are running,
    never failed or cancelled (``wait`` would return)."""
    layout, _ = _pulling(tmp_path, shards=3)
    _claimed_attempt(layout, 0, 0, "5000", "failed", reason="cancelled", message="the job was cancelled (SIGTERM)")
    _claimed_attempt(layout, 1, 0, "5000", "failed", reason="generation_failed", client_runs=2)
    requeued = FakeSlurm(squeue=BUSY, sacct="4242_0|REQUEUED|0:15|None\n4242_0|RUNNING|0:0|None\n")
    status = run_status(layout, Slurm(requeued))
    assert [(s.state, s.job_id) for s in status.shards[:2]] == [("running", "4242_0"), ("running", "4242_0")]
    assert status.state == "running"
    # the running incarnation's own attempt that ended speaks again
    _claimed_attempt(layout, 1, 0, "5000-r1", "failed", reason="generation_failed", client_runs=2)
    assert run_status(layout, Slurm(requeued)).shards[1].state == "failed"


def test_retry_takes_a_failed_pulling_shard_and_leaves_the_ones_its_allocation_still_runs(tmp_path: Path) -> None:
    layout, env = _pulling(tmp_path, shards=4)
    _claimed_attempt(layout, 0, 0, "5000", "failed", reason="generation_failed", client_runs=1)
    _claimed_attempt(layout, 1, 0, "5000", "running")
    _claimed_attempt(layout, 2, 1, "5001", "failed", reason="client_failed", retryable=True, client_runs=1)
    _claimed_attempt(layout, 3, 1, "5001", "running")
    runner = FakeSlurm(squeue=BUSY)
    runner.next_id = 7000
    done = retry(layout, Slurm(runner), env)
    assert done.shards == (0,) and done.job_ids == ("7000",)
    record = read_json(layout.submissions / "7000.json", SubmissionRecord)
    assert (record.kind, record.shards, record.tasks) == ("retry", (0,), 1)
    with pytest.raises(LauncherError, match=r"shard\(s\) 1, 2 are still running"):
        retry(layout, Slurm(runner), env, [1, 2])
    # The allocation of the first array took its claim once: it never runs shard 0 again, the retry's allocation
    # claims it in its own array (claims/7000.json), so only one attempt of shard 0 runs at a time.
    status = run_status(layout, Slurm(FakeSlurm(squeue=BUSY + "7000_0|PENDING|Priority\n")))
    assert (status.shards[0].state, status.shards[0].job_id) == ("pending", "7000_[0-0]")


# --- item 9: cancel finds the arrays whose sbatch was stopped after Slurm took them ---

QUEUE_FORMAT = "%F|%u|%a|%q|%T|%o"


class _SbatchHangsOnce(FakeSlurm):
    """The ``hang``-th sbatch reaches Slurm (the job is queued, from its batch script) but never answers: it is
    stopped by its timeout. ``squeue -t all -o %o`` lists every job taken, with its batch script."""

    def __init__(self, hang: int, **kwargs: str) -> None:
        super().__init__(**kwargs)
        self.hang = hang
        self.taken: list[tuple[str, str]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        if argv[0] == "squeue" and QUEUE_FORMAT in argv:
            self.calls.append(list(argv))
            lines = [f"{job}|root|root|normal|PENDING|{script}" for job, script in self.taken]
            return Completed(0, "".join(f"{line}\n" for line in lines), "")
        done = super().__call__(argv, env=env)
        if argv[0] == "sbatch":
            self.taken.append((done.stdout.strip(), argv[-1]))
            if len(self.commands("sbatch")) == self.hang:
                raise SlurmTimeoutError(list(argv), 5)
        return done


def _half_submitted(tmp_path: Path, shards: int = 3) -> tuple[RunLayout, _SbatchHangsOnce]:
    layout, env, plan = _run(tmp_path, "retries: 2\n", shards=shards)
    runner = _SbatchHangsOnce(hang=2)
    with pytest.raises(PartialSubmitError, match="may have reached Slurm"):
        submit_shards(layout, plan, list(range(shards)), Slurm(runner), env, datetime.now(UTC))
    assert [r.array_job_id for r in _records(layout)] == ["4242"]  # 4243 is queued, but not recorded
    return layout, runner


def test_cancel_of_the_run_cancels_and_records_an_array_whose_sbatch_timed_out(tmp_path: Path) -> None:
    layout, runner = _half_submitted(tmp_path)
    done = cancel(layout, Slurm(runner))
    assert done.run and done.ids == ("4243", "4242") and done.adopted == ("4243",)
    assert runner.commands("scancel")[-1] == ["scancel", "4243", "4242"]
    adopted = read_json(layout.submissions / "4243.json", SubmissionRecord)
    assert (adopted.plan_index, adopted.kind, adopted.after) == (1, "auto-retry", "4242")
    assert read_json(layout.cancelled, CancelRecord).array_job_ids == ("4243", "4242")
    ended = "".join(f"{job}_{task}|CANCELLED|0:0|None\n" for job in ("4242", "4243") for task in range(3))
    status = run_status(layout, Slurm(FakeSlurm(sacct=ended)))
    assert status.state == "cancelled" and not status.submission_incomplete


def test_cancel_of_shards_cancels_their_tasks_in_an_array_whose_sbatch_timed_out(tmp_path: Path) -> None:
    layout, runner = _half_submitted(tmp_path)
    runner.squeue_out = "4242_1|RUNNING|None\n4243_1|PENDING|Dependency\n"
    done = cancel(layout, Slurm(runner), [1])
    assert not done.run and done.ids == ("4243_1", "4242_1") and done.adopted == ("4243",)
    assert (layout.submissions / "4243.json").is_file() and not layout.cancelled.exists()


def test_the_lookup_is_the_one_submit_continue_uses(tmp_path: Path) -> None:
    layout, runner = _half_submitted(tmp_path)
    done = continue_submission(layout, Slurm(runner), {"HOSTED_KEY": KEY})
    assert done.adopted == ("4243",) and len(done.job_ids) == 1  # level 2 submitted, level 1 found and recorded
    lookups = len([c for c in runner.commands("squeue") if QUEUE_FORMAT in c])
    done_cancel = cancel(layout, Slurm(runner))
    assert done_cancel.adopted == () and sorted(done_cancel.ids) == ["4242", "4243", "4244"]
    assert len([c for c in runner.commands("squeue") if QUEUE_FORMAT in c]) == lookups  # nothing missing: no lookup


# --- item 6: accept-partial of a two-stage shard whose GPU stage ended short ---

STAGED_RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: draft, column_type: llm-text, model_alias: gen, prompt: "Say {{ topic }}"}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Improve {{ draft }}"}
  model_configs:
  - {alias: gen, model: m-2, provider: local}
  - {alias: writer, model: m-1, provider: hosted, inference_parameters: {temperature: 0.3, max_parallel_requests: 8}}
"""


def _staged_run(tmp_path: Path) -> tuple[RunLayout, dict[str, str], FakeSlurm, list[SubmissionRecord]]:
    run, profile, env = write_unit_run(
        tmp_path,
        KEY,
        recipe=STAGED_RECIPE,
        num_records=12,
        shards=3,
        # one task per shard: the tests follow each shard's own GPU and CPU tasks
        run_extra="allocations: 3\ndeployments:\n  - {model_alias: gen, model: m-2}\n",
    )
    profile.write_text(profile.read_text() + "gpus_per_node: 4\n")
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    assert len(prepared.plan.stages) == 2
    write_run_dir(prepared)
    fake = FakeSlurm()
    submit_shards(prepared.layout, prepared.plan, [0, 1, 2], Slurm(fake), env, datetime.now(UTC))
    return prepared.layout, env, fake, _records(prepared.layout)


def _partial(layout: RunLayout, shard: int, job: str, rows: int, stage: int | None) -> None:
    """A partial attempt of ``shard`` (``stage`` 0: its GPU stage) with its verified short candidate."""
    where = layout.stage_shard(shard, stage)
    attempt = where.attempt(f"attempt-{job}")
    make_private_dir(where.attempts, exist_ok=True)
    make_private_dir(attempt.dir, exist_ok=True)
    record = AttemptRecord(
        shard=shard,
        attempt=attempt.dir.name,
        job_id=job,
        node="n1",
        state="partial",
        started_at=f"2026-01-01T00:0{job[-1]}",
        reason="rows_dropped",
        rows=rows,
    )
    atomic_write(attempt.record, encode(record))
    candidate = WinnerRecord(
        shard=shard,
        attempt=attempt.dir.name,
        rows=rows,
        dataset_dir=str(attempt.dir / "output"),
        files=(),
        plan_sha256="-",
        published_at="-",
        partial=True,
    )
    atomic_write(attempt.candidate, encode(candidate))


def test_accept_partial_of_a_short_gpu_stage_publishes_it_and_runs_the_cpu_stage_as_retry_does(tmp_path: Path) -> None:
    layout, env, fake, (gpu, cpu) = _staged_run(tmp_path)
    _partial(layout, 1, "5001", 2, stage=0)
    _partial(layout, 1, "5003", 3, stage=0)  # the best one: more rows
    fake.sacct_out = "".join(f"{gpu.array_job_id}_{t}|COMPLETED|0:0|None\n" for t in (0, 2)) + (
        f"{gpu.array_job_id}_1|FAILED|3:0|None\n"
        + "".join(f"{cpu.array_job_id}_{t}|COMPLETED|0:0|None\n" for t in range(3))
    )
    before = run_status(layout, Slurm(fake)).shards[1]
    assert (before.state, before.stage) == ("partial", "gpu")
    fake.next_id = 6000
    done = accept_partial(layout, [1], Slurm(fake), env)
    assert [(a.shard, a.rows, a.stage) for a in done.accepted] == [(1, 3, "gpu")]
    assert done.cpu_stage == (1,) and done.job_ids == ("6000",) and done.queued == ()
    winner = read_json(layout.shard(1).stage(0).winner, WinnerRecord)
    assert (winner.attempt, winner.rows, winner.partial) == ("attempt-5003", 3, True)
    assert not layout.shard(1).winner.exists()  # the final result is the CPU stage's to publish
    (new,) = _records(layout)[2:]
    assert (new.stage, new.kind, new.shards, new.tasks, new.after_any) == (1, "retry", (1,), 1, ())  # as retry does
    assert Path(new.script).read_text().rstrip().endswith("--pool 1 --stage 1")
    with pytest.raises(LauncherError, match="shard 1 already has a result of its GPU stage"):
        accept_partial(layout, [1], Slurm(fake), env)  # published once, never replaced


def test_accept_partial_leaves_a_gpu_accepted_shard_to_a_cpu_array_still_queued(tmp_path: Path) -> None:
    layout, env, fake, (gpu, cpu) = _staged_run(tmp_path)
    _partial(layout, 0, "5001", 3, stage=0)
    fake.squeue_out = "".join(f"{cpu.array_job_id}_{t}|PENDING|Dependency\n" for t in range(3))
    fake.squeue_out += f"{gpu.array_job_id}_2|RUNNING|None\n"
    done = accept_partial(layout, [0], Slurm(fake), env)
    assert done.cpu_stage == () and done.queued == (0,) and done.job_ids == ()
    assert len(_records(layout)) == 2 and layout.shard(0).stage(0).winner.is_file()


def test_accept_partial_of_a_final_stage_shard_is_as_before_and_a_shard_without_one_is_refused(tmp_path: Path) -> None:
    layout, env, fake, _ = _staged_run(tmp_path)
    _partial(layout, 2, "5002", 1, stage=0)
    _partial(layout, 2, "5004", 3, stage=None)  # its CPU stage ended short too: that is the shard's result
    done = accept_partial(layout, [2], Slurm(fake), env)
    assert [(a.shard, a.rows, a.stage) for a in done.accepted] == [(2, 3, "cpu")] and done.cpu_stage == ()
    assert read_json(layout.shard(2).winner, WinnerRecord).partial and not layout.shard(2).stage(0).winner.exists()
    with pytest.raises(LauncherError, match="shard 0 has no partial result to accept"):
        accept_partial(layout, [0], Slurm(fake), env)
    assert fake.commands("sbatch")[2:] == []


# --- issue 18: a shard cancelled while its task was pending ends cancelled, and retry brings it back ---


def test_a_shard_cancelled_while_pending_ends_cancelled_and_retry_runs_it_again(tmp_path: Path) -> None:
    """Slurm forgets a pending array task cancelled before it started (neither squeue nor sacct lists it): the
    shard stayed ``unknown`` forever, ``wait`` never returned and ``retry`` found nothing to do."""
    layout, env, plan = _run(tmp_path, "", shards=3)
    runner = FakeSlurm(squeue="4242_0|RUNNING|None\n4242_1|PENDING|Resources\n4242_2|RUNNING|None\n")
    submit_shards(layout, plan, [0, 1, 2], Slurm(runner), env, datetime.now(UTC))
    done = cancel(layout, Slurm(runner), [1])
    assert done.ids == ("4242_1",) and runner.commands("scancel")[-1] == ["scancel", "4242_1"]
    runner.squeue_out = "4242_0|RUNNING|None\n4242_2|RUNNING|None\n"  # the cancelled task is gone, unaccounted
    shard = run_status(layout, Slurm(runner)).shards[1]
    assert (shard.state, shard.reason) == ("cancelled", "shard_cancelled")
    runner.squeue_out = ""
    runner.sacct_out = "".join(f"4242_{i}|FAILED|1:0|None\n" for i in (0, 2))
    for index in (0, 2):
        write_attempt(layout, index, str(4250 + index), "failed", task=f"4242_{index}", reason="engine_failed")
    status = run_status(layout, Slurm(runner))
    assert [s.state for s in status.shards] == ["failed", "cancelled", "failed"]
    assert status.state in TERMINAL  # wait returns
    again = retry(layout, Slurm(runner), env)
    assert again.shards == (0, 1, 2) and not layout.shard(1).cancelled.exists()
    assert run_status(layout, Slurm(runner)).shards[1].state != "cancelled"
