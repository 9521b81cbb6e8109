"""The cost model (``ddslurm.planner._cost``): predictions recomputed by hand for small layouts, the facts it reads
and where each number came from, and its greedy shard placement against a plain simulation."""

from __future__ import annotations

import heapq
import random
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    ClusterProfile,
    ConcurrencyPoint,
    Deployment,
    Facts,
    FactUse,
    ModelFact,
    ModelShape,
    ProviderSnapshot,
    RecipeColumn,
    RecipeFact,
    RunFile,
    RunLayout,
    ServerSpec,
    ServingPlan,
    Submission,
    engine_flags,
)
from ddslurm.planner import PlanInputs, compile_plan, plan_serving
from ddslurm.planner._cost import (
    CPU_STAGE_START_S,
    DEFAULT_LOAD_S,
    DEFAULT_REQUEST_S,
    Candidate,
    CostInputs,
    CostSources,
    cost_inputs,
    fill_slots,
    predict,
    rate_at,
    shape_of,
    shard_runs,
)

SHA = "a" * 64
PROFILE = ClusterProfile(workspace="/ws", python_env="/venv", gpus_per_node=8, partition="gpu")


def run_file(records: int = 20, shards: int = 2, *, capacity: int = 8, cpus: int = 4, **fields: object) -> RunFile:
    dep = Deployment(
        model_alias="gen", model="m", server=ServerSpec(cpus=1, extra_args=("--max-num-seqs", str(capacity)))
    )
    return RunFile(
        name="r", recipe="x.yaml", num_records=records, shards=shards, deployments=(dep,),
        submission=Submission(cpus=cpus), **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def measured(load_s: float = 10.0, rate: float = 4.0, per_record: float = 2.0, cpu_s: float = 0.001) -> Facts:
    model = ModelFact(
        shape=ModelShape(model="m"), load_s=load_s, requests_per_s=rate, capacity=8, measured_by="tune",
        run_id="cal-1", measured_at="2026-01-01T00:00:00Z",
    )  # fmt: skip
    recipe = RecipeFact(
        recipe_sha256=SHA, requests_per_record={"gen": per_record}, client_cpu_s_per_request=cpu_s,
        allocation_overhead_s=5.0, cpu_stage_records_per_s=5.0, measured_by="run", run_id="run-1",
        measured_at="2026-01-01T00:00:00Z",
    )  # fmt: skip
    return Facts(models=(model,), recipes=(recipe,))


def inputs_of(run: RunFile, facts: Facts, *, two_stage: bool = False, columns: tuple[RecipeColumn, ...] | None = None,
              records: tuple[int, ...] | None = None) -> CostInputs:  # fmt: skip
    serving = plan_serving(run, PROFILE, "gpu")
    per = records or tuple([run.num_records // run.shards] * run.shards)
    return cost_inputs(run, serving, CostSources(facts, "", SHA, columns, per, two_stage))


# Hand figures for measured(): rate 4 requests/s of a replica at capacity 8, 2 requests a record, load 10 s,
# overhead 5 s. One replica does a record in 2 / 4 = 0.5 s; a shard's drain is 0.5 x 8 / 4 = 1 s; an allocation
# holds its GPUs 10 + 5 = 15 s before generating. Busy GPU-seconds: 20 records x 2 / 4 x 1 GPU = 10.


def test_two_shards_one_allocation_one_worker_by_hand() -> None:
    got = predict(Candidate(1, (1,), 1, 1), inputs_of(run_file(), measured()))
    # shard 0: 10 x 0.5 + 1 = 6 s, then shard 1 on the same worker: 6 s; 15 + 12 = 27 s on 1 GPU.
    assert got.wall_s == pytest.approx(27.0)
    assert got.gpu_hours == pytest.approx(27.0 / 3600)
    assert got.gpu_busy == pytest.approx(10.0 / 27.0)
    assert (got.allocations, got.replicas, got.client_workers, got.gpus_at_once) == (1, (1,), 1, 1)


def test_two_workers_on_two_replicas_by_hand() -> None:
    got = predict(Candidate(1, (2,), 2, 1), inputs_of(run_file(), measured()))
    # two replicas: a record in 2 / (2 x 4) = 0.25 s; each worker gets half: 10 x 0.25 x 2 + 1 = 6 s, at once.
    assert got.wall_s == pytest.approx(21.0)
    assert got.gpu_hours == pytest.approx(2 * 21.0 / 3600)
    assert got.gpus_at_once == 2
    assert got.gpu_busy == pytest.approx(10.0 / 42.0)


def test_one_task_per_shard_and_its_waves_by_hand() -> None:
    inputs = inputs_of(run_file(), measured())
    together = predict(Candidate(2, (1,), 1, 2), inputs)
    # each task: 15 + 10 x 0.5 + 1 = 21 s; two at once: wall 21 s, 42 GPU-seconds.
    assert (together.wall_s, together.gpu_hours) == pytest.approx((21.0, 42.0 / 3600))
    waves = predict(Candidate(2, (1,), 1, 1), inputs)  # the throttle runs one at a time: the second after the first
    assert (waves.wall_s, waves.gpu_hours, waves.gpus_at_once) == pytest.approx((42.0, 42.0 / 3600, 1))


def test_the_client_cpus_cap_the_rate_by_hand() -> None:
    # 1 client CPU, 0.5 CPU-s a request, 2 requests a record: the client sends a record every 1 s (slower than 0.5).
    got = predict(Candidate(1, (1,), 1, 1), inputs_of(run_file(cpus=1), measured(cpu_s=0.5)))
    assert got.wall_s == pytest.approx(15 + 2 * (10 * 1.0 + 1))


def test_a_pulling_allocation_waiting_for_the_budget_holds_only_its_overhead() -> None:
    # two allocations, one at a time: the first pulls all three shards, the second starts then and finds none (5 s).
    got = predict(Candidate(2, (1,), 1, 1), inputs_of(run_file(shards=3, records=30), measured()))
    first = 15 + 3 * (10 * 0.5 + 1)
    assert got.wall_s == pytest.approx(first + 5)
    assert got.gpu_hours == pytest.approx((first + 5) / 3600)


def test_two_stage_adds_the_cpu_stage_of_the_last_gpu_shard() -> None:
    got = predict(Candidate(1, (1,), 1, 1), inputs_of(run_file(), measured(), two_stage=True))
    # after 27 s: the last shard's 10 records at 5 a second, and the CPU stage's start.
    assert got.wall_s == pytest.approx(27 + 10 / 5 + CPU_STAGE_START_S)
    assert got.gpu_hours == pytest.approx(27 / 3600) and got.two_stage


def test_the_facts_used_and_their_origins() -> None:
    used = {(f.name, f.subject): f for f in inputs_of(run_file(), measured(), two_stage=True).facts}
    key = "gen:" + ModelShape(model="m").key()
    assert (used["load_s", key].value, used["load_s", key].origin, used["load_s", key].run_id) == (
        10.0,
        "tune",
        "cal-1",
    )
    assert used["requests_per_s", key].value == 4.0
    assert (used["requests_per_record", "gen"].value, used["requests_per_record", "gen"].origin) == (2.0, "run")
    assert used["client_cpu_s_per_request", "recipe"].value == 0.001
    assert used["allocation_overhead_s", "recipe"].value == 5.0
    assert used["cpu_stage_records_per_s", "recipe"].value == 5.0


def test_defaults_when_nothing_was_measured_and_requests_per_record_from_the_columns() -> None:
    def column(name: str, *aliases: str) -> RecipeColumn:
        return RecipeColumn(
            name=name, column_type="llm-text", aliases=aliases, refs=(), required=(), side_effects=(), drop=False,
            skips=False, propagate_skip=False, sampler_type=None,
        )  # fmt: skip

    columns = (column("a", "gen"), column("b", "gen"), column("c", "judge"))
    inputs = inputs_of(run_file(capacity=16), Facts(), columns=columns)
    [dep] = inputs.deployments
    assert (dep.load_s, dep.requests_per_s, dep.requests_per_record) == (DEFAULT_LOAD_S, 16 / DEFAULT_REQUEST_S, 2.0)
    assert {f.origin for f in inputs.facts} == {"default"} and all(f.run_id is None for f in inputs.facts)
    assert inputs_of(run_file(), Facts()).deployments[0].requests_per_record == 1.0  # columns unknown: 1


def test_a_fact_of_another_gpu_type_is_not_used() -> None:
    serving = plan_serving(run_file(), PROFILE, "gpu")
    inputs = cost_inputs(run_file(), serving, CostSources(measured(), "h100", SHA, None, (10, 10), two_stage=False))
    assert inputs.deployments[0].load_s == DEFAULT_LOAD_S


def test_compile_plan_records_the_prediction_of_its_layout() -> None:
    run = run_file(gpus=1)
    plan = compile_plan(
        PlanInputs(
            run=run, profile=PROFILE, snapshot=ProviderSnapshot(), layout=RunLayout(Path("/ws/r")),
            recipe_sha256=SHA, snapshot_sha256="-", facts=measured(),
        )
    )  # fmt: skip
    assert plan.prediction is not None
    chosen = plan.prediction.chosen
    assert chosen == predict(
        Candidate(chosen.allocations, chosen.replicas, chosen.client_workers, 1), inputs_of(run, measured())
    )
    assert plan.prediction.budget_gpus == 1 and plan.prediction.facts == inputs_of(run, measured()).facts


def _greedy(
    records: list[int], slots: int, start: float, per_record: float, fixed: float
) -> tuple[list[float], list[int]]:
    free = [(start, s) for s in range(slots)]
    ends, last = [start] * slots, [-1] * slots
    for index, n in enumerate(records):
        at, slot = heapq.heappop(free)
        ends[slot], last[slot] = at + n * per_record + fixed, index
        heapq.heappush(free, (ends[slot], slot))
    return ends, last


def test_the_closed_form_placement_is_the_greedy() -> None:
    rng = random.Random(23)
    for _ in range(3000):
        shards, slots = rng.randint(1, 40), rng.randint(1, 45)
        if rng.random() < 0.5:  # plan_shards' even split: the first shards one record more
            base, extra = divmod(rng.randint(shards, 5 * shards), shards)
            records = [base + (i < extra) for i in range(shards)]
        else:
            records = [rng.choice((1, 2, 3, 4, 8)) for _ in range(shards)]
        # durations of whole binary fractions: no rounding, so ties are ties in both
        per_record, fixed, start = rng.choice((0.125, 0.5, 1.0, 2.0)), rng.choice((0.0, 0.5, 3.0)), rng.choice((0, 5))
        assert fill_slots(shard_runs(records), slots, start, per_record, fixed) == _greedy(
            records, slots, start, per_record, fixed
        ), (records, slots, per_record, fixed)


# --- issue 35, item 3: a rate is used at the capacity it was measured at, or scaled by a calibration's sweep ---


def _rate_fact(capacity: int, rate: float, sweep: tuple[tuple[int, float], ...] = ()) -> ModelFact:
    return ModelFact(
        shape=ModelShape(model="m"),
        load_s=30.0,
        requests_per_s=rate,
        capacity=capacity,
        sweep=tuple(ConcurrencyPoint(in_flight=n, requests_per_s=r) for n, r in sweep),
        measured_by="tune" if sweep else "run",
        run_id="r",
        measured_at="t",
    )


def test_a_rate_measured_at_the_runs_capacity_is_used_as_measured() -> None:
    assert rate_at(_rate_fact(256, 40.0), 256) == (40.0, "")


def test_a_run_measured_at_another_capacity_is_not_used_and_the_bill_says_why() -> None:
    rate, note = rate_at(_rate_fact(4, 4.0), 256)
    assert rate is None
    assert "measured at capacity 4, not this run's 256" in note and "the default is used" in note


@pytest.mark.parametrize(
    ("capacity", "want"),
    [(2, 4.0 * 2 / 4), (4, 4.0), (6, 4.0 + (7.0 - 4.0) * (6 - 4) / (8 - 4)), (8, 7.0), (64, 9.0), (256, 9.0)],
)
def test_a_calibrations_sweep_gives_the_rate_at_any_capacity(capacity: int, want: float) -> None:
    fact = _rate_fact(8, 7.0, ((4, 4.0), (8, 7.0), (32, 9.0)))
    rate, note = rate_at(fact, capacity)
    assert rate == pytest.approx(want)
    assert (note == "") == (capacity == 8)


def _one_deployment(shards: int) -> tuple[RunFile, ServingPlan, int]:
    """A run of one single-replica deployment, 100 records a shard; its planned serving and replica capacity."""
    run = RunFile(
        name="r", recipe="recipe.yaml", num_records=100 * shards, shards=shards,
        deployments=(Deployment(model_alias="gen", model="m", replicas=1),),
    )  # fmt: skip
    serving = plan_serving(run, ClusterProfile(workspace="/w", python_env="/v", gpus_per_node=4), "gpu")
    capacity = serving.deployments[0].capacity
    assert capacity is not None
    return run, serving, capacity


def _rate_use(run: RunFile, serving: ServingPlan, facts: Facts) -> tuple[FactUse, CostInputs]:
    sources = CostSources(facts=facts, gpu_type="", recipe_key="k", columns=None,
                          shard_records=(100,) * run.shards, two_stage=False)  # fmt: skip
    inputs = cost_inputs(run, serving, sources)
    [use] = [f for f in inputs.facts if f.name == "requests_per_s"]
    return use, inputs


def test_the_bill_names_the_default_used_in_place_of_a_fact_of_another_capacity() -> None:
    """The issue's case: a capacity-4 fact of 1 s a request (4 requests/s) for a run at 256 in flight is not used
    unscaled (it made the planner choose twice the allocations and ten times the GPU-hours)."""
    run, serving, capacity = _one_deployment(8)
    assert capacity != 4
    facts = Facts(models=(msgspec.structs.replace(_rate_fact(4, 4.0), shape=shape_of(run, 0, "")),))
    use, inputs = _rate_use(run, serving, facts)
    assert use.origin == "default" and use.value == capacity / DEFAULT_REQUEST_S
    assert f"not this run's {capacity}" in use.note
    assert inputs.deployments[0].load_s == 30.0  # the load was measured all the same


def test_the_bill_says_how_many_runs_a_rate_rests_on_and_flags_an_outlier() -> None:
    run, serving, capacity = _one_deployment(2)
    facts = Facts()
    for i, rate in enumerate((5.2, 6.6, 5.9, 0.16)):
        fact = msgspec.structs.replace(_rate_fact(capacity, rate), shape=shape_of(run, 0, ""), run_id=f"r{i}")
        facts = facts.with_model_run(fact)
    use, _ = _rate_use(run, serving, facts)
    assert use.value == (5.2 + 5.9) / 2 and use.origin == "run"
    assert use.note.startswith("median of 4 runs; the latest run's 0.16 (run r3) is an outlier"), use.note


def test_a_rate_measured_with_other_engine_flags_is_not_used() -> None:
    run, serving, capacity = _one_deployment(2)
    flagged = msgspec.structs.replace(
        _rate_fact(capacity, 50.0), shape=shape_of(run, 0, ""), flags=("--enable-prefix-caching",)
    )
    use, _ = _rate_use(run, serving, Facts(models=(flagged,)))
    assert use.origin == "default" and "engine flags ['--enable-prefix-caching'], this run has []" in use.note
    same = msgspec.structs.replace(flagged, flags=())
    assert _rate_use(run, serving, Facts(models=(same,)))[0].value == 50.0


def test_the_engine_flags_of_a_fact_leave_the_capacity_flag_to_its_capacity() -> None:
    args = ("--max-num-seqs", "64", "--quantization", "fp8", "--max-running-requests=8", "--max-model-len=4096")
    assert engine_flags(args) == ("--quantization", "fp8", "--max-model-len=4096")
