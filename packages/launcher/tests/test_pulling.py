"""Pulling allocations seen from the launcher: the arrays a submission makes, what status says of shards no
allocation has claimed yet, cancel and retry of single shards, and the dry run's bill."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import (
    AttemptRecord,
    ClaimRecord,
    Progress,
    ProviderSnapshot,
    RunLayout,
    SubmissionRecord,
    atomic_write,
    encode,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.launcher import Slurm, write_run_dir
from ddslurm.launcher.cli import main
from ddslurm.launcher.commands._console import STATE_STYLES, status_text
from ddslurm.launcher.errors import LauncherError
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.runs._steer import cancel, retry
from ddslurm.launcher.submission._arrays import submit_shards
from ddslurm.launcher.submission._bill import bill_lines, make_bill
from ddslurm.launcher.submission._prepare import prepare
from ddslurm.launcher.testing import FakeSlurm, accept_recipe, write_attempt, write_unit_run
from ddslurm.planner import plan_arrays

KEY = "sk-pulling-test-key-0123456789"


def _pulling_run(root: Path, *, shards: int = 7, extra: str = "allocations: 3\n") -> tuple[RunLayout, dict[str, str]]:
    run, profile, env = write_unit_run(root, KEY, num_records=10 * shards, shards=shards, run_extra=extra)
    now = datetime.now(UTC)
    prepared = prepare(run, profile, env, now, check_recipe=accept_recipe)
    write_run_dir(prepared)
    submit_shards(prepared.layout, prepared.plan, list(range(shards)), Slurm(FakeSlurm()), env, now)
    return prepared.layout, env


def _claim(layout: RunLayout, shard: int, task: int, array: str = "4242") -> None:
    layout.shard(shard).claims.mkdir(exist_ok=True)
    record = ClaimRecord(shard=shard, array_job_id=array, task=task, job_id=f"50{task}", node="n1", claimed_at="-")
    layout.shard(shard).claim(array).write_bytes(encode(record))


def test_a_pulling_run_submits_allocations_over_a_pool_with_their_retries(tmp_path: Path) -> None:
    layout, _ = _pulling_run(tmp_path, extra="allocations: 3\nretries: 1\n")
    records = sorted(
        (read_json(p, SubmissionRecord) for p in layout.submissions.glob("*.json")), key=lambda r: r.array_job_id
    )
    assert [(r.kind, r.tasks, r.shards) for r in records] == [
        ("initial", 3, tuple(range(7))),
        ("auto-retry", 3, tuple(range(7))),
    ]
    script = layout.script.read_text()
    assert "#SBATCH --array=0-2\n" in script
    assert script.rstrip().endswith("--pool 0-6") and "SLURM_ARRAY_TASK_ID" not in script
    retry_script = Path(records[1].script).read_text()
    assert f"--dependency=afternotok:{records[0].array_job_id}" in retry_script


def test_status_of_claimed_and_unclaimed_shards_of_a_pulling_array(tmp_path: Path) -> None:
    layout, _ = _pulling_run(tmp_path, shards=4, extra="allocations: 2\n")
    for shard, task in ((0, 0), (1, 1)):
        _claim(layout, shard, task)
        write_attempt(layout, shard, f"50{task}", "running", task=f"4242_{task}", progress=3)
    running = Slurm(FakeSlurm(squeue="4242_0|RUNNING|None\n4242_1|RUNNING|None\n"))
    status = run_status(layout, running)
    assert [(s.state, s.job_id) for s in status.shards[:2]] == [("running", "4242_0"), ("running", "4242_1")]
    for shard in status.shards[2:]:
        assert shard.state == "pending" and shard.job_id == "4242_[0-1]"
    assert status.state == "running"
    # Both allocations ended and nobody took shards 2 and 3 (the time limit stopped them): failed, retryable.
    ended = Slurm(FakeSlurm(sacct="4242_0|TIMEOUT|0:0|None\n4242_1|COMPLETED|0:0|None\n"))
    status = run_status(layout, ended)
    for shard in status.shards[2:]:
        assert (shard.state, shard.reason) == ("failed", "not_claimed"), shard
        assert "ddslurm retry" in (shard.message or "")


def test_cancelling_shards_of_pulling_allocations_writes_records_and_cancels_no_job(tmp_path: Path) -> None:
    layout, env = _pulling_run(tmp_path, shards=4, extra="allocations: 2\n")
    runner = FakeSlurm(squeue="4242_0|RUNNING|None\n4242_1|RUNNING|None\n")
    done = cancel(layout, Slurm(runner), [2, 3])
    assert done.ids == () and not done.run
    assert [c for c in runner.commands("scancel") if c[1:]] == []  # the allocations run other shards
    assert layout.shard(2).cancelled.is_file() and layout.shard(3).cancelled.is_file()
    assert not layout.shard(0).cancelled.exists()
    ended = FakeSlurm(sacct="4242_0|COMPLETED|0:0|None\n4242_1|COMPLETED|0:0|None\n")
    status = run_status(layout, Slurm(ended))
    assert [s.state for s in status.shards[2:]] == ["cancelled", "cancelled"]
    # A retry of a cancelled shard clears its record (kept aside) so that an allocation claims it again.
    ended.next_id = 7000
    again = retry(layout, Slurm(ended), env, [2])
    assert again.shards == (2,)
    assert not layout.shard(2).cancelled.exists() and list(layout.shard(2).dir.glob("cancelled-cleared-*.json"))
    assert layout.shard(3).cancelled.exists()
    record = read_json(layout.submissions / "7000.json", SubmissionRecord)
    assert (record.kind, record.tasks, record.shards) == ("retry", 1, (2,))


def test_cancel_of_shards_of_pulling_allocations_says_the_allocations_stop_them(tmp_path: Path) -> None:
    layout, env = _pulling_run(tmp_path, shards=4, extra="allocations: 2\n")
    runner = FakeSlurm(squeue="4242_0|RUNNING|None\n4242_1|RUNNING|None\n")
    out, err = io.StringIO(), io.StringIO()

    code = main(["cancel", str(layout.root), "--shards", "2-3"], env=env, slurm=Slurm(runner), stdout=out, stderr=err)

    assert code == 0 and err.getvalue() == ""
    assert out.getvalue() == (
        f"cancelled shards 2-3 of run {layout.run_id}: the allocations that pull shards stop their generation and "
        "take them no more (ddslurm retry --shards runs them again)\n"
    )  # not "cancelled 0 task(s)": no task is the shards' alone


def test_the_bill_counts_allocations_gpus_and_hours(tmp_path: Path) -> None:
    from ddslurm.config import DeploymentPlan, ReplicaPlan, Resources, ServingPlan

    dep = DeploymentPlan(
        alias="gen", model="m", served_model_name="m", tensor_parallel=2, startup_timeout=60, proxy=True,
        replicas=tuple(ReplicaPlan(index=i, gpus=2, cpus=4) for i in range(2)), max_parallel_requests=512,
    )  # fmt: skip
    plan = make_plan(
        "run-1",
        (5,) * 8,
        allocations=2,
        client_workers=2,
        serving=ServingPlan(deployments=(dep,), gpus=4),
        generation=Resources(time_minutes=90, cpus_per_task=13, gres="gpu:4"),
        retries=1,
    )
    arrays = plan_arrays(plan, RunLayout(tmp_path), list(range(8)), 1001, kind="initial", stamp="s")
    bill = make_bill(plan, arrays, [], ProviderSnapshot())
    [jobs] = bill.jobs
    assert (jobs.tasks, jobs.retry_tasks, jobs.gpus_per_task) == (2, 2, 4)
    assert bill.gpu_hours == 12.0  # 2 allocations x 4 GPUs x 1.5 h
    assert bill.cpu_hours == 39.0
    text = "\n".join(bill_lines(bill))
    assert "2 pulling allocation(s) for 8 shards" in text and "2 client worker(s)" in text
    assert "\nbatches: 5 records a batch\n" in text  # a plan from before the planner chose batches says only that
    assert "12 GPU-hours (2 task(s) x 4 GPU(s) x 90 min)" in text
    assert sum("--job-name=server-gen-" in s for s in bill.steps) == 2
    assert sum("--job-name=proxy-gen" in s for s in bill.steps) == 1
    assert sum("client-<shard>" in s for s in bill.steps) == 2
    assert all("--port <port>" in s for s in bill.steps if "server-gen" in s)
    assert msgspec.json.decode(msgspec.json.encode(bill))["allocations"] == 2


@pytest.mark.parametrize(
    ("records", "shards", "allocations", "want_sizes", "want_tasks"),
    [
        pytest.param(60, 7, None, "60 records over 7 shards: 4 shards of 9 and 3 of 8", "one per shard (7 shards)"),
        pytest.param(
            60, 6, 3, "60 records over 6 shards of 10 each", "3 pulling allocations: 6 shards / 2 client worker(s)"
        ),
        pytest.param(61, 8, 2, "61 records over 8 shards: 5 shards of 8 and 3 of 7", "2 pulling allocations: the run"),
    ],
)
def test_the_bill_says_why_shard_sizes_and_task_counts_are_what_they_are(
    tmp_path: Path, records: int, shards: int, allocations: int | None, want_sizes: str, want_tasks: str
) -> None:
    from ddslurm.planner import plan_shards

    specs = plan_shards(records, shards)
    plan = make_plan("run-1", tuple(s.num_records for s in specs), allocations=allocations, client_workers=2)
    arrays = plan_arrays(plan, RunLayout(tmp_path), list(range(shards)), 1001, kind="initial", stamp="s")
    bill = make_bill(plan, arrays, [], ProviderSnapshot())

    # The sizes as counted here from the plan's shards, independently of the bill.
    sizes = sorted({s.num_records for s in specs}, reverse=True)
    counted = [sum(s.num_records == size for s in specs) for size in sizes]
    assert bill.shard_sizes.startswith(want_sizes)
    for size, count in zip(sizes, counted, strict=True):
        assert f"{count} of {size}" in bill.shard_sizes or f"{count} shards of {size}" in bill.shard_sizes
    assert sum(s.num_records for s in specs) == records
    [jobs] = bill.jobs
    assert jobs.why.startswith(want_tasks) and jobs.tasks == (allocations or shards)
    text = "\n".join(bill_lines(bill))
    assert f"shards: {want_sizes}" in text and f"task(s) in 1 array(s) ({want_tasks}" in text


def test_the_bill_says_seeded_shards_follow_the_passes_over_the_seed(tmp_path: Path) -> None:
    from ddslurm.config import SeedPlan, SeedRows
    from ddslurm.planner import plan_shards

    specs = plan_shards(30, 4, SeedRows.of(0, 25))  # one pass of 25 rows, then 5 records of the next
    seed = SeedPlan(seed_type="local", kind="file", root="seed", path="s.csv", files=(), rows=25, pool_size=25)
    plan = msgspec.structs.replace(make_plan("run-1", tuple(s.num_records for s in specs)), seed=seed)
    bill = make_bill(plan, [], [], ProviderSnapshot())

    assert [s.num_records for s in specs] == [9, 8, 8, 5]
    assert bill.shard_sizes == (
        "30 records over 4 shards: 1 shard of 9, 2 of 8 and 1 of 5 (the records cycle through the seed dataset's 25 "
        "rows: a shard keeps within one pass over them or starts where a pass starts, so that it reads the seed rows "
        "the unsharded run would)"
    )


def test_retry_dry_run_shows_the_arrays_and_changes_nothing(tmp_path: Path) -> None:
    import io
    import json

    from ddslurm.launcher.cli import main

    layout, env = _pulling_run(tmp_path, shards=4, extra="allocations: 2\nclient_workers: 1\n")
    cancel(layout, Slurm(FakeSlurm()), [1, 3])
    ended = FakeSlurm(sacct="4242_0|COMPLETED|0:0|None\n4242_1|COMPLETED|0:0|None\n")
    before = sorted(p.name for p in layout.root.rglob("*"))
    out = io.StringIO()
    code = main(["retry", str(layout.root), "--dry-run", "--json"], env=env, slurm=Slurm(ended, env=env), stdout=out)
    assert code == 0, out.getvalue()
    shown = json.loads(out.getvalue())
    assert shown["shards"] == [0, 1, 2, 3] and shown["tasks"] == 2
    assert [(a["kind"], a["pulling"], a["shards"]) for a in shown["arrays"]] == [("retry", True, "0-3")]
    assert ended.commands("sbatch") == []
    assert sorted(p.name for p in layout.root.rglob("*")) == before  # the cancel records are still there
    text = io.StringIO()
    assert main(["retry", str(layout.root), "--dry-run"], env=env, slurm=Slurm(ended, env=env), stdout=text) == 0
    assert text.getvalue().startswith("dry run: a retry would submit 4 shard(s): 0-3\n")


def test_a_shard_failed_in_a_running_allocation_is_pending_while_an_automatic_retry_is_queued(tmp_path: Path) -> None:
    """One allocation pulls both shards; its replica died and both attempts ended ``server_died`` while the
    allocation still runs. Two automatic retry levels wait for it (``afternotok``): the shards are pending, the run
    is running (``wait`` goes on), and ``retry`` submits nothing. Once no retry is left queued, they are failed."""
    layout, env = _pulling_run(tmp_path, shards=2, extra="allocations: 1\nretries: 2\n")
    subs = sorted(
        (read_json(p, SubmissionRecord) for p in layout.submissions.glob("*.json")), key=lambda r: r.array_job_id
    )
    assert [s.kind for s in subs] == ["initial", "auto-retry", "auto-retry"]
    first, second = subs[1].array_job_id, subs[2].array_job_id
    for shard in (0, 1):
        _claim(layout, shard, 0)
        write_attempt(layout, shard, "500", "failed", task="4242_0", reason="server_died")
    queued = FakeSlurm(squeue=f"4242_0|RUNNING|None\n{first}_0|PENDING|Dependency\n{second}_0|PENDING|Dependency\n")
    status = run_status(layout, Slurm(queued))
    assert [s.state for s in status.shards] == ["pending", "pending"] and status.state == "running"
    assert all(
        f"automatic retry array {first}" in (s.message or "") and s.reason == "server_died" for s in status.shards
    )
    retried = retry(layout, Slurm(queued), env)
    assert retried.shards == () and queued.commands("sbatch") == []
    # Slurm cancelled the retries (their dependency can never be met) and the allocation ended: nothing is to come.
    over = FakeSlurm(sacct=f"4242_0|FAILED|1:0|None\n{first}_0|CANCELLED|0:0|None\n{second}_0|CANCELLED|0:0|None\n")
    status = run_status(layout, Slurm(over))
    assert [s.state for s in status.shards] == ["failed", "failed"] and status.state == "failed"


@pytest.mark.parametrize(
    ("allocations", "max_concurrent", "clients"),
    [
        pytest.param(None, None, 40, id="a-task-a-shard"),
        pytest.param(None, 10, 10, id="max-concurrent"),
        pytest.param(5, None, 10, id="pulling-5x2"),
    ],
)
def test_the_bill_warns_when_the_clients_ask_a_key_for_more_than_it_is_stated_to_admit(
    tmp_path: Path, allocations: int | None, max_concurrent: int | None, clients: int
) -> None:
    """Clients at once (tasks, or allocations x client workers, within max_concurrent) x each client's
    ``max_parallel_requests`` of the key's aliases (Data Designer's 4 where unset), against ``hosted_limits``; the
    key's models the price file does not price are named."""
    from ddslurm.config import HostedLimit, ModelPrice, Prices, SnapshotModel, SnapshotProvider

    snapshot = ProviderSnapshot(
        providers=(SnapshotProvider(name="api", endpoint="https://api.example.com/v1", api_key_env="API_KEY"),),
        models=(SnapshotModel(alias="w", model="mw", provider="api", inference_parameters={"max_parallel_requests": 6}),
                SnapshotModel(alias="j", model="mj", provider="api")),
    )  # fmt: skip
    prices = Prices(version=1, models={"mw": ModelPrice(input=1, output=2)})
    plan = make_plan("run-1", (6,) * 40, allocations=allocations, client_workers=2, max_concurrent=max_concurrent,
                     hosted_limits={"api": HostedLimit(in_flight=16)}, prices=prices)  # fmt: skip
    arrays = plan_arrays(plan, RunLayout(tmp_path), list(range(40)), 1001, kind="initial", stamp="s")
    [key] = make_bill(plan, arrays, [], snapshot).keys
    assert (key.clients, key.per_client, key.at_once) == (clients, 6 + 4, clients * 10)
    text = "\n".join(bill_lines(make_bill(plan, arrays, [], snapshot)))
    assert f"api (API_KEY): up to {clients} client(s) x 10 request(s) at once = {clients * 10}" in text
    assert f"warning: {clients * 10} requests at once against a key stated to admit 16" in text
    assert "about 2 client(s) at once keep it busy" in text  # 16 over 10 a client, rounded up
    assert "no price in the price file for: mj" in text


def _attempt_of(layout: RunLayout, shard: int, **fields: Any) -> None:
    """Allocation 4242_0's attempt of ``shard`` as the runtime writes it (a worker's, or a spare's: ``spare``)."""
    record = write_attempt(layout, shard, "500", "running", task="4242_0", started=f"{T0}:00:00+00:00")
    atomic_write(layout.shard(shard).attempt(record.attempt).record, encode(msgspec.structs.replace(record, **fields)))


T0 = "2026-01-01T00"


def test_a_spares_shard_is_waiting_a_cancelled_one_cancelled_and_only_the_workers_are_running(tmp_path: Path) -> None:
    """Issue 40: one allocation of two client workers pulls five shards. Shards 0 and 1 are its workers' (1 has no
    progress file yet: 0 rows, not "-"), 2 its spare that waits for a worker's slot, 3 a spare whose shard was cancelled
    (its record still says running: the allocation stops it in its next round), 4 a spare promoted (its client began
    generating) in the slot of shard 0, whose last records are in flight (its controller marked it draining). Status
    shows 2 waiting, never running; 3 cancelled at once; 0 draining; running only the workers' slots (no more than
    client_workers), each rate over the time since its client began generating; retry leaves 2 and 3 alone."""
    layout, env = _pulling_run(tmp_path, shards=5, extra="allocations: 1\nclient_workers: 2\n")
    for shard in range(5):
        _claim(layout, shard, 0)
    _attempt_of(layout, 0, generating_at=f"{T0}:00:20+00:00")
    _attempt_of(layout, 1, generating_at=f"{T0}:00:20+00:00")
    _attempt_of(layout, 2, spare=True)
    _attempt_of(layout, 3, spare=True)
    layout.shard(3).cancelled.write_text("{}")
    _attempt_of(layout, 4, spare=True, generating_at=f"{T0}:00:40+00:00")
    layout.shard(0).attempt("attempt-500").draining.touch()  # the controller's mark: its slot is the spare's
    for shard, rows, in_batch in ((0, 3, 1), (4, 0, 2)):
        progress = Progress(rows=rows, batches=1, updated_at="-", in_batch=in_batch)
        atomic_write(layout.shard(shard).attempt("attempt-500").progress, encode(progress))
    runner = FakeSlurm(squeue="4242_0|RUNNING|None\n")
    now = datetime.fromisoformat(f"{T0}:01:00+00:00")
    status = run_status(layout, Slurm(runner), now=now)
    shown = [(s.state, s.rows, s.rate, s.reason) for s in status.shards]
    assert shown == [
        ("draining", 3 + 1, round(4 / 40, 2), None),  # 4 rows in the 40 s since its client began generating
        ("running", 0, None, None),
        ("waiting", None, None, None),
        ("cancelled", None, None, "shard_cancelled"),
        ("running", 2, round(2 / 20, 2), None),
    ]
    assert status.state == "running"
    assert status.counts == {"draining": 1, "running": 2, "waiting": 1, "cancelled": 1}
    assert status.counts["running"] <= 2  # the allocation's client_workers
    assert status.records_done == 4 + 0 + 2  # a draining shard's rows are made rows
    # the console: its own state and colour; --json the same states
    text = status_text(status).splitlines()
    assert re.match(r"\s*1\s+running\s+0/10\s", text[4]) and re.match(r"\s*2\s+waiting\s+-/10\s", text[5]), text
    assert re.match(r"\s*0\s+draining\s+4/10\s", text[3]), text
    styles = [STATE_STYLES[state] for state in ("waiting", "draining", "running", "pending")]
    assert len(set(styles)) == len(styles)
    out = io.StringIO()
    code = main(["status", str(layout.root), "--json"], env=env, slurm=Slurm(runner), stdout=out, stderr=io.StringIO())
    assert code == 0 and [s["state"] for s in json.loads(out.getvalue())["shards"]][2:4] == ["waiting", "cancelled"]
    # retry: the spare is busy, and so is the cancelled shard until its allocation has recorded it stopped
    for busy in (2, 3):
        with pytest.raises(LauncherError, match=rf"shard\(s\) {busy} are still running or queued"):
            retry(layout, Slurm(runner), env, [busy])
    stopped = read_json(layout.shard(3).attempt("attempt-500").record, AttemptRecord)
    atomic_write(
        layout.shard(3).attempt("attempt-500").record,
        encode(msgspec.structs.replace(stopped, state="cancelled", reason="shard_cancelled")),
    )
    runner.next_id = 7000
    assert retry(layout, Slurm(runner), env, [3]).shards == (3,)
