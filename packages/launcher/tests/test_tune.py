"""``ddslurm tune``: the calibration run derived from a run file, its levels, and its measurements made facts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    AttemptRecord,
    Calibration,
    CalibrationEntry,
    ClientUsage,
    ConcurrencyPoint,
    DeploymentPlan,
    Plan,
    ReplicaPlan,
    Resources,
    RunLayout,
    ServingPlan,
    ShardSpec,
    atomic_write,
    calibration_file,
    encode,
    encode_pretty,
    load_run_file,
    read_json,
)
from ddslurm.launcher.commands._tune import tune_lines
from ddslurm.launcher.errors import UsageError
from ddslurm.launcher.facts._tune import DEFAULT_RECORDS, tune_run_file
from ddslurm.launcher.facts._tune_facts import TuneFailedError, tune_result
from ddslurm.planner import calibration_levels_of

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mixed" / "run.yaml"


def test_the_calibration_run_is_the_run_file_made_small() -> None:
    run = load_run_file(EXAMPLE)
    tune = tune_run_file(run, EXAMPLE, None)
    assert tune.name == "mixed-demo-tune" and tune.deployments == run.deployments
    assert tune.submission == run.submission and Path(tune.recipe) == EXAMPLE.parent / "recipe.yaml"
    assert tune.num_records == min(DEFAULT_RECORDS, run.num_records) == 24
    assert (tune.shards, tune.allocations, tune.client_workers, tune.stages, tune.retries) == (1, 1, 1, "single", 0)
    assert tune_run_file(run, EXAMPLE, 5).num_records == 5
    with pytest.raises(UsageError, match="--records"):
        tune_run_file(run, EXAMPLE, 0)
    with pytest.raises(UsageError, match="no deployments"):
        tune_run_file(msgspec.structs.replace(run, deployments=()), EXAMPLE, None)


def _deployment(alias: str, capacity: int) -> DeploymentPlan:
    return DeploymentPlan(alias=alias, model=f"org/{alias}", served_model_name=alias, tensor_parallel=2,
                          replicas=(ReplicaPlan(index=0, gpus=2, cpus=1),), startup_timeout=60,
                          capacity=capacity)  # fmt: skip


def _plan(*deployments: DeploymentPlan) -> Plan:
    serving = ServingPlan(deployments=deployments, gpus=4)
    return Plan(run_id="r-tune-1", run_name="r-tune", num_records=8,
                shards=(ShardSpec(index=0, first_record=0, num_records=8),), resume="if_possible", buffer_size=8,
                recipe_file="inputs/recipe.yaml", recipe_sha256="ab" * 32, snapshot_file="inputs/snapshot.json",
                snapshot_sha256="cd" * 32, secret_env=(), python_env="/env",
                generation=Resources(time_minutes=60), collection=Resources(time_minutes=60),
                serving=serving, gpu_type="a100")  # fmt: skip


def test_the_levels_are_the_powers_of_two_up_to_each_capacity_and_the_capacities() -> None:
    assert calibration_levels_of(_plan(_deployment("gen", 6), _deployment("big", 8)).serving) == (1, 2, 4, 6, 8)
    assert calibration_levels_of(_plan(_deployment("gen", 1)).serving) == (1,)


CLIENT_OUT = """\
[12:00:01] [INFO] |-- model: 'gen-model'
[12:00:01] [INFO] |-- model alias: 'gen'
[12:00:01] [INFO] |-- model provider: 'ddslurm-local-gen'
[12:00:09] [INFO] 📊 Model usage summary:
[12:00:09] [INFO]   |-- model: gen-model
[12:00:09] [INFO]   |-- tokens: input=100, output=200, total=300, tps=10
[12:00:09] [INFO]   |-- requests: success=16, failed=0, total=16, rpm=60
"""


def _finished_tune_run(tmp_path: Path, *, calibrated: bool) -> tuple[RunLayout, Plan]:
    layout = RunLayout(tmp_path / "runs" / "r-tune-1")
    plan = _plan(_deployment("gen", 4))
    attempt = layout.shard(0).attempt("attempt-7")
    attempt.dir.mkdir(parents=True)
    state, reason = ("succeeded", None) if calibrated else ("failed", "calibration_failed")
    record = AttemptRecord(shard=0, attempt="attempt-7", job_id="7", node="n1", state=state,
                           started_at="2026-01-01T00:00:00+00:00", rows=8, reason=reason,
                           message=None if calibrated else "http://127.0.0.1:1 answered 500")  # fmt: skip
    atomic_write(attempt.record, encode(record))
    (attempt.dir / "client.out").write_text(CLIENT_OUT)
    atomic_write(attempt.client_usage, encode_pretty(ClientUsage(cpu_s=4.0, wall_s=20.0)))
    if calibrated:
        sweep = tuple(ConcurrencyPoint(in_flight=n, requests_per_s=r) for n, r in ((1, 2.0), (2, 3.5), (4, 5.0)))
        entry = CalibrationEntry(alias="gen", load_s=42.5, sweep=sweep, prompts=16)
        atomic_write(calibration_file(attempt.dir), encode_pretty(Calibration(entries=(entry,))))
    return layout, plan


def test_a_calibration_becomes_a_model_fact_and_a_recipe_fact(tmp_path: Path) -> None:
    layout, plan = _finished_tune_run(tmp_path, calibrated=True)
    result = tune_result(layout, plan, "2026-01-01T01:00:00+00:00")
    ((alias, model),) = result.models
    assert alias == "gen" and model.shape.key() == "vllm:org/gen:tp2-pp1-dp1:a100"
    assert (model.load_s, model.capacity, model.requests_per_s) == (42.5, 4, 5.0)
    assert [p.in_flight for p in model.sweep] == [1, 2, 4] and model.measured_by == "tune"
    recipe = result.recipe
    assert recipe.requests_per_record == {"gen": 16 / 8}
    assert recipe.client_cpu_s_per_request == pytest.approx(4.0 / 16)
    assert recipe.recipe_sha256 == plan.recipe_sha256 and recipe.run_id == "r-tune-1"
    lines = tune_lines(result)
    assert "@1 req/s" in lines[1] and "@4 req/s" in lines[1]
    assert lines[2].split()[:2] == ["gen", "org/gen"] and lines[2].split()[-4:] == ["42.5", "2.00", "3.50", "5.00"]
    assert "gen 2" in lines[3] and "0.2500 s" in lines[3]


def test_the_best_level_stands_when_it_beats_the_capacity(tmp_path: Path) -> None:
    layout, plan = _finished_tune_run(tmp_path, calibrated=True)
    attempt = layout.shard(0).attempt("attempt-7")
    sweep = (ConcurrencyPoint(in_flight=2, requests_per_s=6.0), ConcurrencyPoint(in_flight=4, requests_per_s=5.5))
    entry = CalibrationEntry(alias="gen", load_s=1.0, sweep=sweep, prompts=3)
    atomic_write(calibration_file(attempt.dir), encode_pretty(Calibration(entries=(entry,))))
    assert tune_result(layout, plan, "t").models[0][1].requests_per_s == 6.0


def test_a_failed_calibration_names_the_reason_and_the_run(tmp_path: Path) -> None:
    layout, plan = _finished_tune_run(tmp_path, calibrated=False)
    with pytest.raises(TuneFailedError) as caught:
        tune_result(layout, plan, "t")
    assert "calibration_failed" in str(caught.value) and "answered 500" in str(caught.value)
    assert str(layout.root) in str(caught.value)


class _Queue:
    """A scheduler whose job stays queued for ``polls`` queries."""

    def __init__(self, polls: int) -> None:
        self.polls, self.asked = polls, 0

    def squeue(self, job_ids: object) -> list[str]:
        self.asked += 1
        return ["70_0"] if self.asked <= self.polls else []


def test_tune_waits_for_the_sweep_after_the_attempt_ended_until_the_job_is_gone(tmp_path: Path) -> None:
    from ddslurm.launcher.facts._tune import await_calibration

    layout, _ = _finished_tune_run(tmp_path, calibrated=False)
    attempt = layout.shard(0).attempt("attempt-7")
    record = read_json(attempt.record, AttemptRecord)
    atomic_write(attempt.record, encode(msgspec.structs.replace(record, state="succeeded", reason=None)))
    queue, slept = _Queue(3), []
    await_calibration(layout, queue, ["70"], sleep=slept.append, limit_s=60)  # type: ignore[arg-type]
    assert queue.asked == 4 and slept == [1.0] * 3  # succeeded, no calibration yet: until the job left the queue
    entry = CalibrationEntry(alias="gen", load_s=1.0, sweep=(ConcurrencyPoint(in_flight=1, requests_per_s=1.0),),
                             prompts=1)  # fmt: skip
    atomic_write(calibration_file(attempt.dir), encode_pretty(Calibration(entries=(entry,))))
    queue = _Queue(5)
    await_calibration(layout, queue, ["70"], sleep=slept.append, limit_s=60)  # type: ignore[arg-type]
    assert queue.asked == 0  # written: no query at all


def test_tune_shows_what_the_planner_would_have_used_beside_what_it_measured(tmp_path: Path) -> None:
    """Issue 35: before a calibration, the planner used the defaults (no fact) or the workspace's fact (a run's,
    the median of its runs, read at the calibration's capacity); ``tune`` prints it beside the measure."""
    from ddslurm.config import ModelFact, ModelSample
    from ddslurm.launcher.facts._tune import planned_beside

    layout, plan = _finished_tune_run(tmp_path, calibrated=True)
    ((alias, model),) = tune_result(layout, plan, "2026-01-01T01:00:00+00:00").models
    fresh = planned_beside(None, alias, model)
    # the defaults: a 180 s load, a replica at capacity 4 completing 4 / 10 requests a second
    assert [(f.name, f.used, f.origin, f.runs, f.measured) for f in fresh] == [
        ("load_s", 180.0, "default", 0, 42.5),
        ("requests_per_s", 0.4, "default", 0, 5.0),
    ]
    assert [f.ratio for f in fresh] == [round(42.5 / 180, 3), round(5.0 / 0.4, 3)]
    samples = tuple(ModelSample(load_s=s, requests_per_s=r, run_id=f"r{i}", measured_at="t")
                    for i, (s, r) in enumerate(((30.0, 4.0), (50.0, 6.0), (40.0, 4.5))))  # fmt: skip
    earlier = ModelFact(shape=model.shape, load_s=40.0, requests_per_s=4.5, capacity=4, measured_by="run",
                        run_id="r2", measured_at="t", samples=samples)  # fmt: skip
    known = planned_beside(earlier, alias, model)
    assert [(f.used, f.origin, f.runs, f.ratio) for f in known] == [
        (40.0, "run", 3, round(42.5 / 40.0, 3)),
        (4.5, "run", 3, round(5.0 / 4.5, 3)),
    ]
    result = dataclasses.replace(tune_result(layout, plan, "t"), compared=(*known,))
    lines = tune_lines(result)
    subject = f"{alias}:{model.shape.key()}"
    assert f"  requests_per_s of {subject}: 4.5 (run, 3 runs) / 5 (x{round(5.0 / 4.5, 3):g})" in lines
