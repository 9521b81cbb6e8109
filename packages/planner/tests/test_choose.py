"""The layout search (``ddslurm.planner._choose``) through ``compile_plan``: a recorded fact changes the layout,
the deadline forces more allocations, ``gpus`` caps what is held at once, the runners-up, and the numbers the
run file sets stay set."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    Facts,
    LayoutChoice,
    ModelFact,
    ModelShape,
    PartitionNodes,
    Plan,
    ProviderSnapshot,
    RunFile,
    RunLayout,
    ServerSpec,
    Submission,
)
from ddslurm.planner import PlanError, PlanInputs, client_serving, compile_plan, plan_allocations, plan_serving
from ddslurm.planner._choose import NEAR_SHARE, TIME_LIMIT_SHARE, candidates
from ddslurm.planner._cost import DEFAULT_LOAD_S, DEFAULT_OVERHEAD_S, Candidate, CostSources, cost_inputs, predict

PROFILE = ClusterProfile(workspace="/ws", python_env="/venv", gpus_per_node=8, partition="gpu")


def run_file(shards: int = 8, records: int = 800, *, tp: int = 1, **fields: object) -> RunFile:
    replicas = fields.pop("replicas", "auto")
    dep = Deployment(
        model_alias="gen", model="m", replicas=replicas, tensor_parallel=tp,  # type: ignore[arg-type]
        server=ServerSpec(cpus=1, extra_args=("--max-num-seqs", "8")),
    )  # fmt: skip
    return RunFile(
        name="r", recipe="x.yaml", num_records=records, shards=shards, deployments=(dep,),
        submission=fields.pop("submission", Submission(cpus=4)), **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def slow_model(load_s: float = 1.0, rate: float = 0.1) -> Facts:
    return Facts(
        models=(
            ModelFact(
                shape=ModelShape(model="m"), load_s=load_s, requests_per_s=rate, capacity=8, measured_by="run",
                run_id="run-0", measured_at="2026-01-01T00:00:00Z",
            ),
        )
    )  # fmt: skip


def plan_of(run: RunFile, facts: Facts | None = None) -> Plan:
    return compile_plan(
        PlanInputs(
            run=run, profile=PROFILE, snapshot=ProviderSnapshot(), layout=RunLayout(Path("/ws/r")),
            recipe_sha256="-", snapshot_sha256="-", facts=facts or Facts(),
        )
    )  # fmt: skip


def chosen(plan: Plan) -> LayoutChoice:
    assert plan.prediction is not None
    return plan.prediction.chosen


# With the defaults (capacity 8: 0.8 requests/s, load 180 s, overhead 15 s, 1 request a record), a shard of 100
# records takes 100 / 0.8 + 0.5 x 8 / 0.8 = 130 s and an allocation holds 195 s before generating.
HOLD = DEFAULT_LOAD_S + DEFAULT_OVERHEAD_S
SHARD = 100 / 0.8 + 0.5 * 8 / 0.8


def test_with_the_default_load_one_allocation_pulls_every_shard() -> None:
    plan = plan_of(run_file())
    got = chosen(plan)
    assert (plan.allocations, plan.client_workers, got.allocations) == (1, 1, 1)
    assert got.wall_s == pytest.approx(HOLD + 8 * SHARD)
    assert got.gpu_hours == pytest.approx((HOLD + 8 * SHARD) / 3600)


def test_a_measured_fast_load_with_slow_throughput_makes_one_task_per_shard_win() -> None:
    plan = plan_of(run_file(), slow_model())
    got = chosen(plan)
    # load 1 s + overhead 15 s; a shard: 100 / 0.1 + 0.5 x 8 / 0.1 = 1040 s. One allocation: 16 + 8 x 1040 =
    # 8336 GPU-s; a task per shard: 8 x 1056 = 8448, within 2 % and done in 1056 s.
    assert (plan.allocations, got.allocations, plan.max_concurrent) == (None, 8, None)
    assert got.wall_s == pytest.approx(16 + 1040)
    assert got.gpu_hours == pytest.approx(8 * 1056 / 3600)
    assert (16 + 8 * 1040) * (1 + NEAR_SHARE) >= 8 * 1056
    assert plan.prediction is not None
    assert {(f.name, f.origin, f.run_id) for f in plan.prediction.facts if f.name == "load_s"} == {
        ("load_s", "run", "run-0")
    }


def test_the_deadline_forces_more_allocations() -> None:
    plan = plan_of(run_file(deadline="10"))
    got = chosen(plan)
    # 600 s: one allocation (195 + 8 x 130 s) and two (195 + 4 x 130) end late; three (3, 3 and 2 shards) end at
    # 195 + 3 x 130 = 585 s holding 585 + 585 + 455 GPU-s; four hold 4 x 455, more than 2 % above.
    assert plan.prediction is not None and plan.prediction.deadline_s == 600 and plan.prediction.meets_deadline
    assert (plan.allocations, got.wall_s) == (3, pytest.approx(HOLD + 3 * SHARD))
    assert got.gpu_hours == pytest.approx((2 * (HOLD + 3 * SHARD) + HOLD + 2 * SHARD) / 3600)


def test_no_layout_meets_the_deadline_the_fastest_is_chosen() -> None:
    plan = plan_of(run_file(deadline="0:05:00"))
    assert plan.prediction is not None and not plan.prediction.meets_deadline
    assert chosen(plan).wall_s == pytest.approx(HOLD + SHARD)  # 325 s > 300 s: one task per shard, all at once
    assert plan.prediction.rule.startswith("no layout") and "300 s" in plan.prediction.rule


def test_gpus_caps_what_is_held_at_once() -> None:
    plan = plan_of(run_file(gpus=2, deadline="5"))
    assert plan.prediction is not None and plan.prediction.budget_gpus == 2
    for layout in (plan.prediction.chosen, *plan.prediction.runners_up):
        assert layout.gpus_at_once <= 2
    assert plan.serving is not None and plan.serving.gpus * (plan.allocations or 0) <= 2
    # nothing ends in 300 s: the fastest in 2 GPUs is one allocation of two replicas and two workers, each
    # worker's shard 100 x 1.25 / 2 x 2 + 5 = 130 s, four rounds.
    assert (plan.allocations, plan.client_workers, chosen(plan).replicas) == (1, 2, (2,))
    assert chosen(plan).wall_s == pytest.approx(HOLD + 4 * SHARD)


def test_a_task_per_shard_within_gpus_runs_in_waves() -> None:
    plan = plan_of(run_file(gpus=2, allocations=8))
    got = chosen(plan)
    assert (plan.allocations, got.allocations, plan.max_concurrent) == (None, 8, 2)  # two at a time: four waves
    assert got.wall_s == pytest.approx(4 * (HOLD + SHARD))
    assert got.gpu_hours == pytest.approx(8 * (HOLD + SHARD) / 3600) and got.gpus_at_once == 2


def test_gpus_lets_the_planner_choose_replicas() -> None:
    # with 8 GPUs, 8 replicas and 8 workers in one allocation run the 8 shards at once on one load
    plan = plan_of(run_file(gpus=8, deadline="10"))
    assert plan.serving is not None
    assert len(plan.serving.deployments[0].replicas) == chosen(plan).replicas[0] > 1
    assert plan.serving.gpus == chosen(plan).replicas[0]


def test_a_faster_layout_more_than_two_percent_dearer_is_not_chosen() -> None:
    # load 20 s + overhead 15 s, 1 request/s a replica, 800 records: one replica pulls the 8 shards in
    # 35 + 8 x (100 + 4) = 867 GPU-s; two replicas (two workers) end in 451 s holding 2 x 451 = 902, 4 % more.
    plan = plan_of(run_file(gpus=2), slow_model(load_s=20.0, rate=1.0))
    assert plan.prediction is not None
    got, faster = plan.prediction.chosen, plan.prediction.runners_up[0]
    assert (got.allocations, got.replicas, got.client_workers) == (1, (1,), 1)
    assert got.gpu_hours * 3600 == pytest.approx(35 + 8 * 104)
    assert (faster.replicas, faster.wall_s, faster.gpu_hours * 3600) == ((2,), pytest.approx(451), pytest.approx(902))
    assert 1 + NEAR_SHARE < faster.gpu_hours / got.gpu_hours < 1.05
    assert "within 2%" in plan.prediction.rule


def test_runners_up_are_the_next_two_by_the_rule() -> None:
    run = run_file(gpus=4)
    plan = plan_of(run)
    assert plan.prediction is not None
    first, *others = (plan.prediction.chosen, *plan.prediction.runners_up)
    assert len(others) == 2
    layouts = {(c.allocations, c.replicas, c.client_workers) for c in (first, *others)}
    assert len(layouts) == 3
    # recompute the rule over every candidate, independently of the chooser's sorting
    serving = plan_serving(run, PROFILE, "gpu")
    records = tuple(s.num_records for s in plan.shards)
    inputs = cost_inputs(run, serving, CostSources(Facts(), "", "-", None, records, two_stage=False))
    every = [predict(c, inputs) for c in candidates(run, 8, (1,), inputs, 4)]
    least = min(c.gpu_hours for c in every)
    near = [c for c in every if c.gpu_hours <= least * 1.02]
    assert first.wall_s == min(c.wall_s for c in near)
    best = sorted(near, key=lambda c: (c.wall_s, c.gpu_hours))
    rest = sorted((c for c in every if c not in near), key=lambda c: (c.gpu_hours, c.wall_s))
    assert [(c.wall_s, c.gpu_hours) for c in others] == [(c.wall_s, c.gpu_hours) for c in [*best, *rest][1:3]]


def test_numbers_the_run_file_sets_stay_set() -> None:
    plan = plan_of(run_file(gpus=8, allocations=3, client_workers=1, replicas=2))
    got = chosen(plan)
    assert (got.allocations, got.replicas, got.client_workers) == (3, (2,), 1)
    assert (plan.allocations, plan.client_workers) == (3, 1)
    assert plan.serving is not None and len(plan.serving.deployments[0].replicas) == 2


def test_allocations_set_without_gpus_keeps_the_fixed_rule_and_no_prediction() -> None:
    plan = plan_of(run_file(allocations=2, replicas=2))
    assert (plan.allocations, plan.client_workers, plan.prediction) == (2, 2, None)


def test_without_gpus_nothing_holds_more_than_the_fixed_rule() -> None:
    for shards, replicas, extra in ((8, 1, {}), (8, 2, {}), (7, 4, {}), (8, 2, {"max_concurrent": 3})):
        run = run_file(shards, replicas=replicas, **extra)
        old = plan_allocations(run, plan_serving(run, PROFILE, "gpu"))
        before = min(old.count or shards, extra.get("max_concurrent", shards)) * replicas
        plan = plan_of(run)
        assert chosen(plan).gpus_at_once <= before, (shards, replicas, extra)
        assert plan.prediction is not None
        assert all(c.gpus_at_once <= before for c in plan.prediction.runners_up)


def test_gpus_fewer_than_one_allocation_is_refused_with_the_numbers() -> None:
    with pytest.raises(PlanError, match=r"^gpus: 1, but one allocation of the deployments holds 2 GPUs \(gen: 1 x 2"):
        plan_of(run_file(tp=2, gpus=1))


def test_a_deadline_that_is_not_a_time_names_the_field() -> None:
    with pytest.raises(PlanError, match=r"^deadline: 'soon' is not a Slurm time"):
        plan_of(run_file(deadline="soon"))


def test_hosted_only_runs_have_no_prediction() -> None:
    run = RunFile(name="r", recipe="x.yaml", num_records=8, shards=4, gpus=4)
    plan = plan_of(run)
    assert (plan.prediction, plan.allocations) == (None, None)


def test_client_serving_agrees_with_the_plan() -> None:
    for run, facts in (
        (run_file(gpus=8, deadline="10"), Facts()),
        (run_file(), slow_model()),
        (run_file(gpus=3), None),
    ):
        served = client_serving(run, PROFILE, facts=facts, recipe_key="-")
        assert served == plan_of(run, facts).serving


def test_the_search_for_a_thousand_shards_predicts_a_few_hundred_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search grows with the divisors of the shard count, not with the shards: counted, not timed (about 30 ms
    alone; bench/ measures time)."""
    from ddslurm.planner import _choose

    calls: list[Candidate] = []

    def counting(candidate: Candidate, inputs: object) -> object:
        calls.append(candidate)
        return _cost_predict(candidate, inputs)

    _cost_predict = _choose.predict
    monkeypatch.setattr(_choose, "predict", counting)
    run = run_file(1000, 100_000, gpus=64, deadline="2:00:00")
    plan = plan_of(run)
    assert 0 < len(calls) <= 2_000, len(calls)
    got = chosen(plan)
    assert got.gpus_at_once <= 64 and got.wall_s <= 7200
    assert math.isfinite(got.gpu_hours)


def test_a_layout_whose_allocation_outlasts_the_time_limit_is_not_chosen() -> None:
    # One allocation would run 195 + 8 x 130 = 1235 s, past 0.8 of a 20-minute limit (960 s): two (4 shards each,
    # 195 + 4 x 130 = 715 s) end within it. Without the limit one allocation is the cheapest.
    assert chosen(plan_of(run_file(submission=Submission(cpus=4, time_limit="04:00:00")))).allocations == 1
    got = chosen(plan_of(run_file(submission=Submission(cpus=4, time_limit="00:20:00"))))
    assert got.allocations == 2 and got.allocation_s == pytest.approx(HOLD + 4 * SHARD)
    assert got.allocation_s <= 1200 * TIME_LIMIT_SHARE < HOLD + 8 * SHARD


def test_when_no_layout_ends_within_the_time_limit_the_rule_picks_among_all() -> None:
    # 4 minutes (192 s of it): even one shard's allocation (195 + 130 s) runs past it: the cheapest of all is
    # chosen, as without the limit, and the rule says why.
    plan = plan_of(run_file(submission=Submission(cpus=4, time_limit="00:04:00")))
    got = chosen(plan)
    assert got.allocations == 1 and got.allocation_s > 240
    assert plan.prediction is not None and "no layout's allocations are predicted to end within" in plan.prediction.rule


# --- issue 35, item 5: only layouts the partition's nodes hold ---


def _plan_on(run: RunFile, nodes: PartitionNodes | None, facts: Facts, profile: ClusterProfile = PROFILE) -> Plan:
    return compile_plan(
        PlanInputs(
            run=run, profile=profile, snapshot=ProviderSnapshot(), layout=RunLayout(Path("/ws/r")),
            recipe_sha256="-", snapshot_sha256="-", facts=facts, nodes=nodes,
        )
    )  # fmt: skip


def test_no_layout_asks_a_node_for_more_cpus_than_the_partitions_smallest_has() -> None:
    """Hostile facts (a quick load, a slow replica) make the most replicas an allocation can hold the cheapest:
    more replicas of one CPU each, beside 4 client CPUs and the proxy's, than nodes of 7 CPUs hold; there the
    planner chooses among the layouts they hold."""
    run = run_file(gpus=8)
    facts = slow_model(load_s=1.0, rate=0.05)
    unbounded = _plan_on(run, None, facts)
    assert unbounded.generation.cpus_per_task > 7  # what the planner chose before it knew the nodes
    nodes = PartitionNodes(partition="gpu", nodes=3, cpus=7, gpus=8)
    plan = _plan_on(run, nodes, facts)
    assert plan.generation.cpus_per_task <= 7
    assert plan.prediction is not None
    for choice in (plan.prediction.chosen, *plan.prediction.runners_up):
        assert run.submission.cpus + sum(choice.replicas) * 1 + 1 <= 7, choice


def test_allocations_that_span_both_nodes_of_a_partition_run_one_at_a_time() -> None:
    """An 8-GPU replica (tensor parallel 4, pipeline 2) on a partition of two 4-GPU nodes: each allocation holds
    both nodes, so `gpus: 16` cannot run two at once there."""
    dep = Deployment(model_alias="gen", model="m", replicas=1, tensor_parallel=4, pipeline_parallel=2,
                     server=ServerSpec(cpus=1))  # fmt: skip
    run = RunFile(
        name="r",
        recipe="x.yaml",
        num_records=800,
        shards=8,
        deployments=(dep,),
        gpus=16,
        deadline="00:01:00",
        submission=Submission(cpus=4),
    )  # fmt: skip  (no layout meets it: the fastest)
    profile = ClusterProfile(workspace="/ws", python_env="/venv", gpus_per_node=4, partition="gpu")
    facts = slow_model(load_s=1.0, rate=0.05)
    assert chosen(_plan_on(run, None, facts, profile)).gpus_at_once == 16  # two allocations at once, as before
    plan = _plan_on(run, PartitionNodes(partition="gpu", nodes=2, cpus=64, gpus=4), facts, profile)
    assert chosen(plan).gpus_at_once == 8
    assert plan.prediction is not None and all(c.gpus_at_once <= 8 for c in plan.prediction.runners_up)


def test_a_run_no_node_can_hold_is_refused_with_the_numbers() -> None:
    run = run_file(replicas=2, submission=Submission(cpus=12))
    with pytest.raises(PlanError) as refused:
        _plan_on(run, PartitionNodes(partition="gpu", nodes=4, cpus=8, gpus=8), slow_model())
    message = str(refused.value)
    assert "partition gpu" in message and "asks for 15 CPUs a node" in message and "has 8" in message, message


def test_no_layout_asks_a_node_for_more_gpus_or_memory_than_the_partitions_smallest_has() -> None:
    """Hostile facts make several replicas of one GPU the cheapest, on nodes of 8 GPUs (the profile) where the
    partition's smallest has 2 GPUs, or (the profile's memory_per_gpu 30G) 96 GB of memory: only the layouts those
    nodes hold are chosen among; memory the run file fixes beyond a node's is refused with the numbers."""
    run = run_file(gpus=8)
    facts = slow_model(load_s=1.0, rate=0.05)
    assert chosen(_plan_on(run, None, facts)).replicas[0] >= 4  # what the planner chose before it knew the nodes
    few_gpus = _plan_on(run, PartitionNodes(partition="gpu", nodes=2, cpus=64, gpus=2), facts)
    assert few_gpus.prediction is not None
    assert all(sum(c.replicas) <= 2 for c in (few_gpus.prediction.chosen, *few_gpus.prediction.runners_up))
    profile = msgspec.structs.replace(PROFILE, memory_per_gpu="30G")
    small = PartitionNodes(partition="gpu", nodes=2, cpus=64, gpus=8, memory_mb=96_000)
    plan = _plan_on(run, small, facts, profile)
    assert plan.prediction is not None
    for choice in (plan.prediction.chosen, *plan.prediction.runners_up):
        assert sum(choice.replicas) * 30 * 1024 <= 96_000, choice  # at most 3 replicas of 30G a GPU
    assert plan.generation.memory == f"{sum(chosen(plan).replicas) * 30 * 1024}M"
    fixed = msgspec.structs.replace(run, submission=msgspec.structs.replace(run.submission, memory="200G"))
    with pytest.raises(PlanError) as refused:
        _plan_on(fixed, small, facts)
    assert "204800 MB of memory a node" in str(refused.value) and "96000 MB" in str(refused.value), refused.value
