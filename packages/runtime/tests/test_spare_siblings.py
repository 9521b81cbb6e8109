"""Pulling allocations' client workers, driven step by step: a CPU-stage allocation runs ``cpu_stage_workers``
shards at once, and a spare client claims its shard early only while no sibling allocation of the array waits for
one with a free worker slot (``ddslurm.runtime._siblings``: the slots each allocation publishes, stale entries
ignored)."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    AttemptRecord,
    DeploymentPlan,
    Plan,
    Progress,
    ReplicaPlan,
    Resources,
    RunLayout,
    ServingPlan,
    SlotsRecord,
    StagePlan,
    WinnerRecord,
    atomic_write,
    encode,
    make_private_dir,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.runtime import Inputs
from ddslurm.runtime._inputs import stage_inputs
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._siblings import CHECK_EVERY_S, HEARTBEAT_S, STALE_S, Siblings, SlotBoard
from ddslurm.runtime._steps import Step, StepSpec
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._workers import SPARE_SETUP_S, ClaimPool, Workers
from ddslurm.runtime.testing import RUNTIME_EXE, attempt_runner, write_plan

STAGES = (StagePlan(kind="gpu", columns=("draft",)), StagePlan(kind="cpu", columns=("q",)))
ARRAY = "700"
JOB = "701"


class GatedLauncher:
    """Starts each client step as a process that runs until the test ends its shard (:meth:`finish`)."""

    def __init__(self) -> None:
        self.started: list[Step] = []

    def start(self, spec: StepSpec) -> Step:
        gate = _attempt_dir(spec) / "done"
        wait = 'while [ ! -e "$1" ]; do sleep 0.02; done'
        step = Step(spec, subprocess.Popen(["sh", "-c", wait, "sh", str(gate)], start_new_session=True))
        self.started.append(step)
        return step

    def finish(self, shard: int) -> None:
        """The shard's client records its success and exits."""
        [step] = [s for s in self.started if _shard_of(s.spec) == shard and s.poll() is None]
        record_path = _attempt_dir(step.spec) / "attempt.json"
        record = read_json(record_path, AttemptRecord)
        atomic_write(record_path, encode(msgspec.structs.replace(record, state="succeeded", client_runs=1)))
        (_attempt_dir(step.spec) / "done").touch()
        step.proc.wait(timeout=10)

    def running(self) -> list[int]:
        return sorted(_shard_of(s.spec) for s in self.started if s.poll() is None)

    def spares(self) -> list[int]:
        """Shards whose client was started as the spare (sharing the workers' CPUs)."""
        return [_shard_of(s.spec) for s in self.started if s.spec.srun_extra == ("--overlap",)]


def _shard_of(spec: StepSpec) -> int:
    return int(spec.argv[spec.argv.index("--shard") + 1])


def _attempt_dir(spec: StepSpec) -> Path:
    run_dir = Path(spec.argv[spec.argv.index("--run-dir") + 1])
    stage = int(spec.argv[spec.argv.index("--stage") + 1]) if "--stage" in spec.argv else None
    attempt = spec.argv[spec.argv.index("--attempt") + 1]
    return RunLayout(run_dir).stage_shard(_shard_of(spec), stage).attempt(attempt).dir


class NoProxies:
    """The serving of an allocation without servers (hosted-only, or the CPU stage)."""

    def proxy_down(self) -> bool:
        return False

    def restart_dead_proxies(self) -> None:
        return None


class ScriptedSiblings:
    """The other allocations of the array, as the test sets them: ``idle`` while one has a free worker slot."""

    def __init__(self, idle: bool) -> None:
        self.idle = idle
        self.asked = 0
        self.published: list[int] = []
        self.closed = False

    def publish(self, free: int) -> None:
        self.published.append(free)

    def sibling_idle(self) -> bool:
        self.asked += 1
        return self.idle

    def close(self) -> None:
        self.closed = True


def _workers(
    layout: RunLayout,
    inputs: Inputs,
    launcher: GatedLauncher,
    pool: ClaimPool,
    stage: int | None = None,
    clock: Callable[[], float] = lambda: 0.0,
) -> Workers:
    allocation = layout.allocation(JOB)
    make_private_dir(allocation, exist_ok=True)
    workers = Workers(
        attempt_runner(layout, stage=stage),
        pool,
        inputs,
        launcher=launcher,
        env={},
        runtime_exe=RUNTIME_EXE,
        run_dir=layout.root,
        allocation=allocation,
        job_id=JOB,
        node="n1",
        restart=0,
        slurm_log=None,
        client_mb=None,
        identity="1:2:3",
        logger=new_logger(io.BytesIO()),
        stop=StopSignal(),
        grace=2.0,
        clock=clock,
    )
    workers.publish_endpoints(allocation / "endpoints.json", b"{}\n")  # no servers: up at once
    return workers


def _pool(layout: RunLayout, shards: int, siblings: Siblings, stage: int | None = None, task: int = 0) -> ClaimPool:
    return ClaimPool(
        layout,
        range(shards),
        array_job_id=ARRAY,
        task=task,
        job_id=JOB,
        node="n1",
        clock=lambda: "-",
        stage=stage,
        siblings=siblings,
    )


def _gpu_stage_done(layout: RunLayout, shards: int) -> None:
    for index in range(shards):
        stage0 = layout.shard(index).stage(0)
        make_private_dir(stage0.dir, exist_ok=True)
        winner = WinnerRecord(
            shard=index, attempt="attempt-1", rows=2, dataset_dir="-", files=(), plan_sha256="-", published_at="-"
        )
        atomic_write(stage0.winner, encode(winner))


def _cpu_stage(tmp_path: Path, shards: int, cpus: int, workers: int) -> tuple[RunLayout, Inputs]:
    plan: Plan = make_plan(
        "run-1",
        (2,) * shards,
        stages=STAGES,
        allocations=1,
        client_workers=1,
        cpu_stage=Resources(time_minutes=10, cpus_per_task=cpus, gres="none"),
        cpu_stage_workers=workers,
    )
    layout, inputs = write_plan(tmp_path / "run-1", plan)
    _gpu_stage_done(layout, shards)
    return layout, stage_inputs(inputs, 1)


def test_a_cpu_stage_allocation_with_three_workers_runs_three_shards_at_once(tmp_path: Path) -> None:
    layout, inputs = _cpu_stage(tmp_path, shards=5, cpus=7, workers=3)
    assert (inputs.plan.client_workers, inputs.plan.client_cpus, inputs.plan.serving) == (3, 7 // 3, None)
    launcher = GatedLauncher()
    workers = _workers(layout, inputs, launcher, _pool(layout, 5, ScriptedSiblings(False), stage=1), stage=1)
    try:
        workers.start_first()
        workers.top_up(NoProxies())
        # three workers generating at once, and the spare of the fourth shard waiting
        assert launcher.running() == [0, 1, 2, 3] and launcher.spares() == [3]
        workers_steps = [s for s in launcher.started if not s.spec.srun_extra]
        assert [s.spec.cpus for s in workers_steps] == [2, 2, 2]
        assert all(s.spec.argv[s.spec.argv.index("--stage") + 1] == "1" for s in launcher.started)
        launcher.finish(1)
        workers.collect(NoProxies())
        workers.top_up(NoProxies())  # the spare takes the freed slot; shard 4 is the new spare
        assert launcher.running() == [0, 2, 3, 4] and launcher.spares() == [3, 4]
        for shard in (0, 2, 3):
            launcher.finish(shard)
        workers.collect(NoProxies())
        workers.top_up(NoProxies())  # the spare generates; nothing is left to claim
        assert launcher.running() == [4]
        launcher.finish(4)
        workers.collect(NoProxies())
        workers.top_up(NoProxies())
        assert workers.idle() and workers.exit_code() == 0
    finally:
        workers.stop()
    assert _states(layout, 5) == ["succeeded"] * 5


def test_a_spare_does_not_claim_while_a_sibling_has_a_free_slot_and_claims_once_none_has(tmp_path: Path) -> None:
    layout, inputs = write_plan(tmp_path / "run-1", make_plan("run-1", (2,) * 4, allocations=2, client_workers=1))
    siblings = ScriptedSiblings(idle=True)
    launcher = GatedLauncher()
    workers = _workers(layout, inputs, launcher, _pool(layout, 4, siblings))
    try:
        workers.start_first()
        for _ in range(3):
            workers.top_up(NoProxies())
        assert siblings.asked >= 3 and launcher.running() == [0] and launcher.spares() == []
        assert not layout.shard(1).claim(ARRAY).exists()  # left to the sibling that waits for a shard
        # a worker slot claiming for itself always may
        launcher.finish(0)
        workers.collect(NoProxies())
        assert siblings.published[-1] == 1  # its own free slot, until it takes a shard
        workers.top_up(NoProxies())
        assert launcher.running() == [1] and launcher.spares() == [] and siblings.published[-1] == 0
        siblings.idle = False  # the sibling took its shard
        workers.top_up(NoProxies())
        assert launcher.running() == [1, 2] and launcher.spares() == [2]
        assert layout.shard(2).claim(ARRAY).exists()
    finally:
        workers.stop()
    assert siblings.closed


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _board(layout: RunLayout, task: int, clock: Clock) -> SlotBoard:
    return SlotBoard(layout, array_job_id=ARRAY, task=task, job_id=f"70{task}", node="n1", clock=clock, pid=42)


def test_a_published_free_slot_holds_siblings_back_until_it_is_taken_or_stale(tmp_path: Path) -> None:
    layout, clock = RunLayout(tmp_path / "run-1"), Clock()
    mine, sibling = _board(layout, 0, clock), _board(layout, 1, clock)
    assert not mine.sibling_idle()  # nobody published anything
    sibling.publish(2)
    record = read_json(layout.slot_file(ARRAY, 1), SlotsRecord)
    assert (record.task, record.free, record.node, record.pid, record.updated_at) == (1, 2, "n1", 42, clock.now)
    assert layout.slot_file(ARRAY, 1).stat().st_mode & 0o777 == 0o600
    clock.now += CHECK_EVERY_S
    assert mine.sibling_idle()
    mine.publish(1)  # its own entry never holds itself back
    assert _board(layout, 1, clock).sibling_idle()
    sibling.publish(0)  # it took its shard: the entry is gone
    assert not layout.slot_file(ARRAY, 1).exists()
    assert _board(layout, 2, clock).sibling_idle()  # task 0's entry is still there
    other = SlotBoard(layout, array_job_id="800", task=0, job_id="801", node="n1", clock=clock)
    assert not other.sibling_idle()  # another array (another stage or submission) is no sibling
    mine.close()
    assert not layout.slot_file(ARRAY, 0).exists()
    assert not _board(layout, 2, clock).sibling_idle()


def test_an_entry_not_rewritten_within_the_stale_limit_counts_as_gone(tmp_path: Path) -> None:
    layout, clock = RunLayout(tmp_path / "run-1"), Clock()
    crashed = _board(layout, 1, clock)
    crashed.publish(1)
    clock.now += STALE_S - 0.5
    assert _board(layout, 0, clock).sibling_idle()
    clock.now += 1.0  # it crashed: no heartbeat for more than STALE_S
    assert not _board(layout, 0, clock).sibling_idle()


def test_an_allocation_with_free_slots_rewrites_its_entry_every_heartbeat(tmp_path: Path) -> None:
    layout, clock = RunLayout(tmp_path / "run-1"), Clock()
    board = _board(layout, 1, clock)
    board.publish(1)
    first = read_json(layout.slot_file(ARRAY, 1), SlotsRecord).updated_at
    clock.now += HEARTBEAT_S / 2
    board.publish(1)
    assert read_json(layout.slot_file(ARRAY, 1), SlotsRecord).updated_at == first  # not yet
    clock.now += HEARTBEAT_S
    board.publish(1)
    assert read_json(layout.slot_file(ARRAY, 1), SlotsRecord).updated_at == clock.now
    clock.now += STALE_S - 1  # kept fresh by its heartbeat: still waiting after more than STALE_S in all
    assert _board(layout, 0, clock).sibling_idle()
    board.publish(2)  # a change is written at once
    assert read_json(layout.slot_file(ARRAY, 1), SlotsRecord).free == 2


@pytest.mark.parametrize("stale", [False, True])
def test_a_spare_asks_the_slots_its_siblings_published_in_the_run_directory(tmp_path: Path, stale: bool) -> None:
    layout, inputs = write_plan(tmp_path / "run-1", make_plan("run-1", (2,) * 3, allocations=2, client_workers=1))
    clock = Clock()
    _board(layout, 1, clock).publish(1)  # task 1 of the array waits for a shard
    if stale:
        clock.now += STALE_S + 1
    launcher = GatedLauncher()
    workers = _workers(layout, inputs, launcher, _pool(layout, 3, _board(layout, 0, clock)))
    try:
        workers.start_first()
        workers.top_up(NoProxies())
        assert launcher.spares() == ([1] if stale else [])
    finally:
        workers.stop()
    assert layout.slot_file(ARRAY, 1).exists() and not layout.slot_file(ARRAY, 0).exists()


def test_an_entry_that_cannot_be_written_fails_nothing_and_holds_nobody_back(tmp_path: Path) -> None:
    layout, clock = RunLayout(tmp_path / "run-1"), Clock()
    make_private_dir(layout.root)
    (layout.root / "slots").write_text("not a directory")  # every write under it fails
    board = _board(layout, 1, clock)
    board.publish(1)
    board.close()
    assert not _board(layout, 0, clock).sibling_idle()


def test_a_shard_whose_result_is_recorded_frees_its_slot_before_its_process_has_exited(tmp_path: Path) -> None:
    """The client records ``succeeded`` as its last act, then its interpreter and srun step take about a second to
    exit: the spare generates as soon as the record says so, and the allocation is done only once the process has
    exited (teardown never cuts it short)."""
    layout, inputs = write_plan(tmp_path / "run-1", make_plan("run-1", (2,) * 3, allocations=1, client_workers=1))
    launcher = GatedLauncher()
    workers = _workers(layout, inputs, launcher, _pool(layout, 3, ScriptedSiblings(False)))

    def record_only(shard: int) -> Step:
        [step] = [s for s in launcher.started if _shard_of(s.spec) == shard and s.poll() is None]
        path = _attempt_dir(step.spec) / "attempt.json"
        record = read_json(path, AttemptRecord)
        atomic_write(path, encode(msgspec.structs.replace(record, state="succeeded", client_runs=1)))
        return step

    try:
        workers.start_first()
        workers.top_up(NoProxies())
        assert launcher.running() == [0, 1] and launcher.spares() == [1]
        exiting = record_only(0)  # recorded, still running
        workers.collect(NoProxies())
        workers.top_up(NoProxies())
        assert exiting.poll() is None and launcher.running() == [0, 1, 2]  # shard 1 generates; 2 is the spare
        for shard in (1, 2):
            workers.collect(NoProxies())
            workers.top_up(NoProxies())
            launcher.finish(shard)
        workers.collect(NoProxies())
        workers.top_up(NoProxies())
        assert not workers.idle()  # shard 0's process has not exited yet
        (_attempt_dir(exiting.spec) / "done").touch()
        exiting.proc.wait(timeout=10)
        assert workers.idle() and workers.exit_code() == 0
    finally:
        workers.stop()
    assert _states(layout, 3) == ["succeeded"] * 3


def test_a_spare_whose_shard_is_cancelled_is_recorded_cancelled_at_once_not_when_promoted(tmp_path: Path) -> None:
    """Issue 40: a spare's attempt says it is one (``status`` shows its shard ``waiting``); ``cancel --shards`` of
    its shard stops its client and records the attempt ``cancelled`` in the allocation's next round, while the
    worker's shard still generates (it said ``running`` until that shard ended), and the next shard's spare takes
    its place."""
    layout, inputs = write_plan(tmp_path / "run-1", make_plan("run-1", (2,) * 3, allocations=1, client_workers=1))
    launcher = GatedLauncher()
    workers = _workers(layout, inputs, launcher, _pool(layout, 3, ScriptedSiblings(False)))

    def record(shard: int) -> AttemptRecord:
        return read_json(layout.shard(shard).attempt(f"attempt-{JOB}").record, AttemptRecord)

    try:
        workers.start_first()
        workers.top_up(NoProxies())
        assert launcher.running() == [0, 1] and launcher.spares() == [1]
        assert (record(1).spare, record(1).generating_at, record(1).state) == (True, None, "running")
        assert not record(0).spare
        layout.shard(1).cancelled.write_text("{}")
        workers.collect(NoProxies())
        assert (record(1).state, record(1).reason) == ("cancelled", "shard_cancelled")
        assert launcher.running() == [0]  # the spare's client is stopped; the worker's shard goes on
        workers.top_up(NoProxies())
        assert launcher.running() == [0, 2] and launcher.spares() == [1, 2] and record(2).spare
        for shard in (0, 2):
            launcher.finish(shard)
            workers.collect(NoProxies())
            workers.top_up(NoProxies())
        assert workers.idle() and workers.exit_code() == 0
    finally:
        workers.stop()
    assert _states(layout, 3) == ["succeeded", "cancelled", "succeeded"]


def _states(layout: RunLayout, shards: int) -> list[str]:
    """The state of each shard's attempt in this allocation."""
    return [read_json(layout.shard(i).attempt(f"attempt-{JOB}").record, AttemptRecord).state for i in range(shards)]


def _served(tmp_path: Path, shards: int, records: int, *, capacity: int, workers: int) -> tuple[RunLayout, Inputs]:
    """A pulling plan of one allocation whose clients share one deployed replica (``max_parallel_requests`` 4)."""
    replica = ReplicaPlan(index=0, gpus=1, cpus=1)
    writer = DeploymentPlan(alias="writer", model="m", served_model_name="m", tensor_parallel=1, startup_timeout=60,
                            replicas=(replica,), capacity=capacity, max_parallel_requests=4)  # fmt: skip
    serving = ServingPlan(deployments=(writer,), gpus=1)
    plan = make_plan("run-1", (records,) * shards, allocations=1, client_workers=workers, serving=serving)
    return write_plan(tmp_path / "run-1", plan)


@contextmanager
def _serving_started(
    tmp_path: Path, shards: int, records: int, *, capacity: int, workers: int, clock: Callable[[], float] = lambda: 0.0
) -> Iterator[tuple[RunLayout, GatedLauncher, Workers]]:
    """The allocation of :func:`_served`, its first clients started and topped up once; stopped on the way out."""
    layout, inputs = _served(tmp_path, shards, records, capacity=capacity, workers=workers)
    launcher = GatedLauncher()
    running = _workers(layout, inputs, launcher, _pool(layout, shards, ScriptedSiblings(False)), clock=clock)
    try:
        running.start_first()
        running.top_up(NoProxies())
        yield layout, launcher, running
    finally:
        running.stop()


def _progress(layout: RunLayout, shard: int, rows: int, in_batch: int = 0) -> None:
    """The shard's attempt reports ``rows`` done and ``in_batch`` in its current batch."""
    path = layout.shard(shard).attempt(f"attempt-{JOB}").progress
    atomic_write(path, encode(Progress(rows=rows, batches=1, updated_at="-", in_batch=in_batch)))


def _finish_each(workers: Workers, launcher: GatedLauncher, shards: int) -> None:
    """Shards 0 .. ``shards`` - 1 finish one by one, each followed by a round of the allocation's loop."""
    for shard in range(shards):
        launcher.finish(shard)
        workers.collect(NoProxies())
        workers.top_up(NoProxies())


def test_a_shard_whose_last_requests_are_in_flight_gives_its_slot_to_the_spare(tmp_path: Path) -> None:
    """A deployed alias's client keeps its share of the replicas in flight (max_parallel_requests 4 here): once no
    more than that many of its shard's records are left, the spare takes its slot and sets up while they finish; a
    shard with more left keeps its slot."""
    with _serving_started(tmp_path, 3, 10, capacity=4, workers=1) as (layout, launcher, workers):
        assert launcher.running() == [0, 1] and launcher.spares() == [1]
        _progress(layout, 0, rows=5, in_batch=0)  # 5 of 10 left: more than its 4 in flight
        workers.top_up(NoProxies())
        assert launcher.running() == [0, 1] and launcher.spares() == [1]
        _progress(layout, 0, rows=5, in_batch=2)  # 3 left: all in flight
        workers.top_up(NoProxies())
        assert launcher.running() == [0, 1, 2] and launcher.spares() == [1, 2]  # 1 generates, 2 is the spare
        _finish_each(workers, launcher, 3)
        assert workers.idle() and workers.exit_code() == 0


def test_workers_that_share_the_replicas_each_have_a_spare_and_drain_together(tmp_path: Path) -> None:
    """Two workers share the replicas (their shards are the same size, so they finish about together): each has a
    spare, and when both drain, both spares generate at once (with one spare, the second worker's successor would
    start cold, after a process start and Data Designer's import, with its share of the replicas idle)."""
    with _serving_started(tmp_path, 6, 10, capacity=8, workers=2) as (layout, launcher, workers):
        assert launcher.running() == [0, 1, 2, 3] and launcher.spares() == [2, 3]
        marker = [layout.shard(shard).attempt(f"attempt-{JOB}").draining for shard in range(6)]
        assert not any(m.exists() for m in marker)  # nothing drains yet
        _progress(layout, 0, rows=5, in_batch=2)  # both drain: 3 left each, all in flight
        _progress(layout, 1, rows=6, in_batch=1)
        workers.top_up(NoProxies())
        assert launcher.running() == [0, 1, 2, 3, 4, 5] and launcher.spares() == [2, 3, 4, 5]
        # the controller marks the draining shards (status shows them draining, their slots the spares')
        assert [m.exists() for m in marker] == [True, True, False, False, False, False]
        assert workers.idle() is False
        _finish_each(workers, launcher, 6)
    assert workers.idle() and workers.exit_code() == 0 and _states(layout, 6) == ["succeeded"] * 6
    assert not any(m.exists() for m in marker)  # an ended attempt keeps no mark


def test_a_cpu_stage_allocation_keeps_one_spare_whatever_its_workers(tmp_path: Path) -> None:
    """Without deployments nothing drains and the workers' CPUs are the bottleneck: one spare, not one a worker."""
    layout, inputs = write_plan(tmp_path / "run-1", make_plan("run-1", (2,) * 5, allocations=1, client_workers=2))
    launcher = GatedLauncher()
    workers = _workers(layout, inputs, launcher, _pool(layout, 5, ScriptedSiblings(False)))
    try:
        workers.start_first()
        workers.top_up(NoProxies())
        assert launcher.running() == [0, 1, 2] and launcher.spares() == [2]
    finally:
        workers.stop()


def test_a_shard_expected_to_finish_within_a_spares_set_up_gives_its_slot_to_the_spare(tmp_path: Path) -> None:
    """Beyond its last requests in flight: once the shard's rate since its progress first showed says the records
    left take no more than SPARE_SETUP_S, the spare takes its slot (its set-up overlaps them); a slower shard keeps
    its slot."""
    clock = Clock()
    with _serving_started(tmp_path, 3, 100, capacity=4, workers=1, clock=clock) as (layout, launcher, workers):
        _progress(layout, 0, 10)  # first seen: no rate yet
        workers.top_up(NoProxies())
        clock.now += 10
        _progress(layout, 0, 60)  # 5 records/s: 40 left take 8 s, more than SPARE_SETUP_S
        workers.top_up(NoProxies())
        assert SPARE_SETUP_S < 8 and launcher.running() == [0, 1] and launcher.spares() == [1]
        clock.now += 4
        _progress(layout, 0, 80)  # 5 records/s since first seen: 20 left take 4 s
        workers.top_up(NoProxies())
        assert SPARE_SETUP_S >= 4 and launcher.running() == [0, 1, 2] and launcher.spares() == [1, 2]
