"""max_parallel_requests of local aliases: sized from the plan's replicas x capacity, unless the model config sets its
own (any value, Data Designer's default of 4 included: "chosen" means present); hosted aliases exactly as the recipe
says."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ddslurm.config import (
    DD_DEFAULT_MAX_PARALLEL_REQUESTS,
    DeploymentPlan,
    ProviderSnapshot,
    ReplicaPlan,
    ServingPlan,
    SnapshotModel,
    SnapshotProvider,
    parallel_requests,
    recipe_with_models,
    sized_parallel_requests,
)

SNAPSHOT = ProviderSnapshot(
    providers=(
        SnapshotProvider(name="hosted", endpoint="https://h/v1", api_key_env="H_KEY"),
        *(
            SnapshotProvider(name=f"ddslurm-local-{a}", endpoint="", api_key_env="DDSLURM_LOCAL_TOKEN", local=True)
            for a in ("gen", "judge", "fixed", "four")
        ),
    ),
    models=(
        # Inference parameters without max_parallel_requests: not chosen.
        SnapshotModel(
            alias="gen",
            model="g",
            provider="ddslurm-local-gen",
            inference_parameters={"temperature": 0.5},
            source="deployment",
        ),
        SnapshotModel(alias="judge", model="j", provider="ddslurm-local-judge", source="deployment"),
        SnapshotModel(
            alias="fixed",
            model="f",
            provider="ddslurm-local-fixed",
            inference_parameters={"max_parallel_requests": 16},
            source="deployment",
        ),
        # A deliberate 4, Data Designer's default: chosen, so kept.
        SnapshotModel(
            alias="four",
            model="4",
            provider="ddslurm-local-four",
            inference_parameters={"max_parallel_requests": DD_DEFAULT_MAX_PARALLEL_REQUESTS},
            source="deployment",
        ),
        SnapshotModel(
            alias="writer",
            model="w",
            provider="hosted",
            inference_parameters={"max_parallel_requests": DD_DEFAULT_MAX_PARALLEL_REQUESTS, "top_p": 0.9},
        ),
        SnapshotModel(alias="plain", model="p", provider="hosted"),
    ),
)
RECIPE = {"data_designer": {"columns": [], "model_configs": []}}


def _deployment(alias: str, replicas: int, capacity: int | None) -> DeploymentPlan:
    return DeploymentPlan(
        alias=alias,
        model=alias,
        served_model_name=alias,
        tensor_parallel=1,
        replicas=tuple(ReplicaPlan(index=i, gpus=1, cpus=1) for i in range(replicas)),
        startup_timeout=30,
        proxy=replicas > 1,
        capacity=capacity,
        max_parallel_requests=None if capacity is None else replicas * capacity,
    )


SERVING = ServingPlan(
    deployments=(
        _deployment("gen", 3, 8),
        _deployment("judge", 1, 256),
        _deployment("fixed", 2, 8),
        _deployment("four", 2, 8),
    ),
    gpus=8,
)


def _models(recipe: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["alias"]: m for m in recipe["data_designer"]["model_configs"]}


def test_local_aliases_get_replicas_times_capacity_unless_the_recipe_sets_its_own() -> None:
    models = _models(recipe_with_models(RECIPE, SNAPSHOT, SERVING))
    assert models["gen"]["inference_parameters"] == {"temperature": 0.5, "max_parallel_requests": 24}
    assert models["judge"]["inference_parameters"] == {"max_parallel_requests": 256}
    assert models["fixed"]["inference_parameters"] == {"max_parallel_requests": 16}  # the recipe's own value
    assert models["four"]["inference_parameters"] == {"max_parallel_requests": 4}  # a deliberate 4 is the recipe's too
    # Hosted aliases exactly as the recipe says, the default included.
    assert models["writer"]["inference_parameters"] == {"max_parallel_requests": 4, "top_p": 0.9}
    assert "inference_parameters" not in models["plain"]
    assert SNAPSHOT.models[0].inference_parameters == {"temperature": 0.5}  # untouched
    assert sized_parallel_requests(SNAPSHOT, SERVING) == {"gen": 24, "judge": 256}
    assert parallel_requests(SNAPSHOT, SERVING) == {
        "gen": 24, "judge": 256, "fixed": 16, "four": 4, "writer": 4, "plain": 4,
    }  # fmt: skip


@pytest.mark.parametrize(
    "serving",
    [
        pytest.param(None, id="hosted-only-run"),
        pytest.param(
            ServingPlan(deployments=(_deployment("gen", 3, None), _deployment("judge", 1, None)), gpus=4),
            id="plan-compiled-before-sizing",
        ),
    ],
)
def test_without_a_sized_plan_every_model_config_is_the_snapshots(serving: ServingPlan | None) -> None:
    models = _models(recipe_with_models(RECIPE, SNAPSHOT, serving))
    assert {a: m.get("inference_parameters") for a, m in models.items()} == {
        m.alias: m.inference_parameters for m in SNAPSHOT.models
    }
    assert sized_parallel_requests(SNAPSHOT, serving) == {}


def test_a_hosted_alias_named_like_a_deployment_is_not_sized() -> None:
    """Only an alias served by a local provider is sized, even if the plan has a deployment of that name."""
    hosted_gen = SnapshotModel(alias="gen", model="g", provider="hosted")
    snapshot = msgspec.structs.replace(SNAPSHOT, models=(hosted_gen,))
    assert "inference_parameters" not in _models(recipe_with_models(RECIPE, snapshot, SERVING))["gen"]


@pytest.mark.dd
def test_data_designer_reads_the_sized_recipe_and_its_default_is_ours() -> None:
    import data_designer.config as dd

    assert dd.ModelConfig(alias="a", model="m", provider="p").inference_parameters.max_parallel_requests == (
        DD_DEFAULT_MAX_PARALLEL_REQUESTS
    )
    recipe = {
        "data_designer": {
            "columns": [
                {"name": "t", "column_type": "sampler", "sampler_type": "category", "params": {"values": ["a"]}}
            ],
            "model_configs": [],
        }
    }
    builder = dd.DataDesignerConfigBuilder.from_config(recipe_with_models(recipe, SNAPSHOT, SERVING))
    got = {m.alias: m.inference_parameters.max_parallel_requests for m in builder.model_configs}
    assert got == {"gen": 24, "judge": 256, "fixed": 16, "four": 4, "writer": 4, "plain": 4}


def test_deployed_aliases_skip_data_designers_health_check_and_hosted_ones_keep_it() -> None:
    """The controller checked every replica's /health and served model before any client ran; Data Designer's own
    check (a request per model before generating) would only cost seconds per shard."""
    models = _models(recipe_with_models(RECIPE, SNAPSHOT, SERVING))
    assert {a: m["skip_health_check"] for a, m in models.items()} == {
        "gen": True, "judge": True, "fixed": True, "four": True, "writer": False, "plain": False,
    }  # fmt: skip
    hosted_only = _models(recipe_with_models(RECIPE, SNAPSHOT, None))
    assert not any(m["skip_health_check"] for m in hosted_only.values())
