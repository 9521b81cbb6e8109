"""The plan's predicted spend: the run's records times what earlier runs of the recipe measured per record of each
hosted alias, priced by the run's price file, and the predicted GPU-hours at the generation partition's prices;
every figure recomputed here from the facts and prices it rests on."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import (
    ClusterProfile,
    Facts,
    LayoutChoice,
    ModelPrice,
    PartitionPrice,
    Prediction,
    Prices,
    ProviderSnapshot,
    RecipeFact,
    Resources,
    RunFile,
    RunLayout,
    SnapshotModel,
    SnapshotProvider,
)
from ddslurm.planner import PlanInputs, compile_plan
from ddslurm.planner._spend import forecast_spend

SNAPSHOT = ProviderSnapshot(
    providers=(
        SnapshotProvider(name="nim", endpoint="https://nim/v1", api_key_env="NIM_KEY"),
        SnapshotProvider(name="local", endpoint="", local=True),
    ),
    models=(
        SnapshotModel(alias="judge", model="meta/judge", provider="nim"),
        SnapshotModel(alias="critic", model="meta/critic", provider="nim"),
        SnapshotModel(alias="writer", model="org/writer", provider="local"),
    ),
)
PRICES = Prices(
    version=1,
    currency="EUR",
    models={"meta/judge": ModelPrice(input=0.6, output=2.4)},
    partitions={"gpu": PartitionPrice(gpu_hour=2.5, cpu_hour=0.04), "cpu": PartitionPrice(cpu_hour=0.05)},
)
FACT = RecipeFact(
    recipe_sha256="k" * 64,
    requests_per_record={"judge": 1.5, "critic": 1.0, "writer": 3.0},
    input_tokens_per_record={"judge": 412.25, "critic": 100.0},
    output_tokens_per_record={"judge": 37.5, "critic": 20.0},
    measured_by="run",
    run_id="earlier",
    measured_at="t",
)


def _plan_spend(records: int, facts: Facts, prices: Prices | None) -> object:
    inputs = PlanInputs(
        run=RunFile(name="demo", recipe="recipe.yaml", num_records=records, shards=7),
        profile=ClusterProfile(workspace="/ws", python_env="/venv", partition="cpu"),
        snapshot=SNAPSHOT,
        layout=RunLayout.in_workspace(Path("/ws"), "run-1"),
        recipe_sha256="1" * 64,
        recipe_key="k" * 64,
        snapshot_sha256="2" * 64,
        facts=facts,
        prices=prices,
    )
    return compile_plan(inputs).spend


def test_a_hosted_only_run_predicts_each_hosted_aliass_requests_tokens_and_money_from_the_recipes_facts() -> None:
    spend = _plan_spend(61, Facts().with_recipe_run(FACT), PRICES)
    judge, critic = spend.hosted  # type: ignore[attr-defined]
    assert (judge.alias, judge.requests, judge.input_tokens, judge.output_tokens) == (
        "judge", round(61 * 1.5), round(61 * 412.25), round(61 * 37.5),
    )  # fmt: skip
    assert judge.cost == pytest.approx((round(61 * 412.25) * 0.6 + round(61 * 37.5) * 2.4) / 1e6)
    assert judge.runs == 1
    assert (critic.requests, critic.input_tokens, critic.cost) == (61, 6100, None)  # the price file lacks it
    assert [a.alias for a in spend.hosted] == ["judge", "critic"]  # type: ignore[attr-defined]  # local not hosted
    assert (spend.gpu_hours, spend.cpu_hours, spend.currency) == (0.0, 0.0, "EUR")  # type: ignore[attr-defined]
    assert spend.total() is None  # type: ignore[attr-defined]  # the critic is not priced


def test_without_facts_of_the_recipe_nothing_is_predicted_and_without_prices_no_money() -> None:
    unknown = _plan_spend(61, Facts(), PRICES)
    assert [(a.requests, a.input_tokens, a.cost, a.runs) for a in unknown.hosted] == [(None, None, None, 0)] * 2  # type: ignore[attr-defined]
    assert unknown.total() is None  # type: ignore[attr-defined]
    unpriced = _plan_spend(61, Facts().with_recipe_run(FACT), None)
    assert unpriced.currency is None and [a.cost for a in unpriced.hosted] == [None, None]  # type: ignore[attr-defined]
    assert unpriced.hosted[0].requests == round(61 * 1.5)  # type: ignore[attr-defined]


def test_predicted_gpu_hours_are_priced_with_the_cpu_hours_their_allocations_hold() -> None:
    choice = LayoutChoice(allocations=3, replicas=(2,), client_workers=2, two_stage=False, gpus_at_once=6,
                          wall_s=1800.0, gpu_hours=1.75, gpu_busy=0.8)  # fmt: skip
    generation = Resources(partition="gpu", time_minutes=60, nodes=2, cpus_per_task=16)
    only_judge = Prices(version=1, models={"meta/judge": ModelPrice(input=0.6, output=2.4),
                                           "meta/critic": ModelPrice(input=1.0, output=1.0)},
                        partitions=PRICES.partitions)  # fmt: skip
    spend = forecast_spend(100, SNAPSHOT, FACT, only_judge, prediction=Prediction(chosen=choice),
                           generation=generation, gpus=4)  # fmt: skip
    cpu_hours = 1.75 / 4 * 16 * 2  # allocation-hours x CPUs of each of its nodes
    assert (spend.gpu_hours, spend.cpu_hours) == (1.75, pytest.approx(cpu_hours))
    assert spend.hours_cost == pytest.approx(1.75 * 2.5 + cpu_hours * 0.04)
    judge = (round(100 * 412.25) * 0.6 + round(100 * 37.5) * 2.4) / 1e6
    critic = (100 * 100.0 * 1.0 + 100 * 20.0 * 1.0) / 1e6
    assert spend.total() == pytest.approx(judge + critic + 1.75 * 2.5 + cpu_hours * 0.04)
    fixed = forecast_spend(100, SNAPSHOT, FACT, only_judge, prediction=None, generation=generation, gpus=4)
    assert fixed.gpu_hours is None and fixed.total() is None  # GPUs held, none predicted: no total
    unpriced = forecast_spend(100, SNAPSHOT, FACT, only_judge, prediction=Prediction(chosen=choice),
                              generation=Resources(partition="other", time_minutes=60), gpus=4)  # fmt: skip
    assert unpriced.hours_cost is None and unpriced.total() is None
