"""Definitions found in more than one place: compared as Data Designer reads them, only for what the recipe uses,
and every problem placed at file:line:col and field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import Deployment
from ddslurm.providers import (
    MODEL_CONFIGS_FILE,
    PROVIDERS_FILE,
    Origin,
    ResolutionError,
    load_recipe,
    load_settings,
    resolve,
    same_model_config,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hosted-only"
ENV = {"DEMO_HOSTED_API_KEY": "s3cr3t-value-0123456789"}
PROVIDERS = "providers:\n- {name: demo-hosted, endpoint: 'http://127.0.0.1:18400/v1', api_key: DEMO_HOSTED_API_KEY}\n"

# The recipe's writer as DD's CLI (ModelRepository) saves it to model_configs.yaml: null keys left out, defaults
# (generation_type, skip_health_check) not written.
WRITER_CLI_SHAPE = """\
model_configs:
- alias: writer
  model: demo/writer-8b
  provider: demo-hosted
  inference_parameters:
    max_parallel_requests: 16
    max_tokens: 256
    temperature: 0.7
"""


@pytest.fixture
def recipe() -> dict[str, Any]:
    return copy.deepcopy(load_recipe(EXAMPLE / "recipe.yaml"))


def _settings(tmp_path: Path, models: str | None = None, providers: str = PROVIDERS) -> Any:
    (tmp_path / PROVIDERS_FILE).write_text(providers, encoding="utf-8")
    if models is not None:
        (tmp_path / MODEL_CONFIGS_FILE).write_text(models, encoding="utf-8")
    return load_settings(tmp_path)


def test_dd_cli_shape_and_write_config_shape_are_the_same_model(recipe: dict[str, Any], tmp_path: Path) -> None:
    resolution = resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), _settings(tmp_path, WRITER_CLI_SHAPE), (), ENV)
    assert [(m.alias, m.source) for m in resolution.snapshot.models] == [("writer", "recipe"), ("judge", "recipe")]


def test_a_real_difference_is_refused_with_both_places(recipe: dict[str, Any], tmp_path: Path) -> None:
    settings = _settings(tmp_path, WRITER_CLI_SHAPE.replace("temperature: 0.7", "temperature: 0.9"))

    with pytest.raises(ResolutionError) as info:
        resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), settings, (), ENV)

    (problem,) = info.value.problems
    assert problem == (
        f"{tmp_path / MODEL_CONFIGS_FILE}:2:3: model_configs[0]: model alias 'writer' is defined twice with different "
        f"content (first at {EXAMPLE / 'recipe.yaml'}:72:5: data_designer.model_configs[0]); keep one definition"
    )


def test_a_default_written_out_differently_is_a_difference_only_if_dd_sees_one(
    recipe: dict[str, Any], tmp_path: Path
) -> None:
    # max_parallel_requests left out means DD's default (4), which is not the recipe's 16.
    settings = _settings(tmp_path, WRITER_CLI_SHAPE.replace("    max_parallel_requests: 16\n", ""))
    with pytest.raises(ResolutionError, match="'writer' is defined twice"):
        resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), settings, (), ENV)


def test_unused_aliases_and_providers_defined_twice_do_not_matter(recipe: dict[str, Any], tmp_path: Path) -> None:
    recipe["data_designer"]["model_configs"].append({"alias": "spare", "model": "a", "provider": "demo-hosted"})
    models = "model_configs:\n- {alias: spare, model: b, provider: other}\n"
    providers = PROVIDERS + "- {name: other, endpoint: 'http://a/v1'}\n- {name: other, endpoint: 'http://b/v1'}\n"

    resolution = resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), _settings(tmp_path, models, providers), (), ENV)

    assert [m.alias for m in resolution.snapshot.models] == ["writer", "judge"]


def test_a_used_provider_defined_twice_names_both_lines(recipe: dict[str, Any], tmp_path: Path) -> None:
    providers = PROVIDERS + "- {name: demo-hosted, endpoint: 'http://elsewhere/v1', api_key: DEMO_HOSTED_API_KEY}\n"
    with pytest.raises(ResolutionError) as info:
        resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), _settings(tmp_path, None, providers), (), ENV)
    (problem,) = info.value.problems
    assert problem.startswith(f"{tmp_path / PROVIDERS_FILE}:3:3: providers[1]: provider 'demo-hosted' is defined")
    assert f"(first at {tmp_path / PROVIDERS_FILE}:2:3: providers[0])" in problem


def test_the_comparison_is_injected(recipe: dict[str, Any], tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []

    def never_same(a: Any, b: Any) -> bool:
        calls.append((a["alias"], b["alias"]))
        return False

    settings = _settings(tmp_path, WRITER_CLI_SHAPE)
    with pytest.raises(ResolutionError, match="defined twice"):
        resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), settings, (), ENV, same_model=never_same)
    assert calls == [("writer", "writer")]


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        pytest.param(
            {"alias": "w", "model": "m", "provider": "p", "inference_parameters": {"temperature": 0.5, "top_p": None}},
            {"alias": "w", "model": "m", "provider": "p", "inference_parameters": {"temperature": 0.5}},
            True,
            id="explicit-null-vs-absent",
        ),
        pytest.param(
            {"alias": "w", "model": "m", "provider": "p", "skip_health_check": False},
            {"alias": "w", "model": "m", "provider": "p"},
            True,
            id="default-written-or-not",
        ),
        pytest.param(
            {"alias": "w", "model": "m", "provider": "p", "inference_parameters": {"temperature": 1}},
            {"alias": "w", "model": "m", "provider": "p", "inference_parameters": {"temperature": 1.0}},
            True,
            id="int-vs-float",
        ),
        pytest.param(
            {"alias": "w", "model": "m", "provider": "p"},
            {"alias": "w", "model": "n", "provider": "p"},
            False,
            id="different-model",
        ),
        pytest.param(
            {"alias": "w", "model": "m", "provider": "p", "inference_parameters": {"temperature": "hot"}},
            {"alias": "w", "model": "m", "provider": "p", "inference_parameters": {"temperature": "hot", "x": None}},
            True,
            id="invalid-for-dd-compared-without-nulls",
        ),
    ],
)
def test_same_model_config(a: dict[str, Any], b: dict[str, Any], want: bool) -> None:
    assert same_model_config(a, b) is want


# --- every problem names its file, line and field ---


def test_reserved_provider_name_names_the_deployment(recipe: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("name: r\nrecipe: recipe.yaml\nnum_records: 2\ndeployments:\n- model_alias: writer\n  model: m\n")
    providers = PROVIDERS + "- {name: ddslurm-local-writer, endpoint: 'http://x/v1'}\n"
    deployments = (Deployment(model_alias="writer", model="m"),)

    with pytest.raises(ResolutionError) as info:
        resolve(
            recipe,
            Origin(EXAMPLE / "recipe.yaml"),
            _settings(tmp_path, None, providers),
            deployments,
            ENV,
            run_origin=Origin(run),
        )

    (problem,) = info.value.problems
    assert problem == (
        f"{tmp_path / PROVIDERS_FILE}:3:4: providers[1].name: provider name 'ddslurm-local-writer' is reserved for "
        f"ddslurm's local deployment of model alias 'writer' ({run}:5:3: deployments[0]); rename yours"
    )


@pytest.mark.parametrize(
    ("change", "want"),
    [
        pytest.param(
            lambda r: r["data_designer"]["columns"][2].update(model_alias="ghost"),
            "{recipe}:35:5: data_designer.columns[2].model_alias: model alias 'ghost' has no deployment",
            id="unknown-alias-at-its-column",
        ),
        pytest.param(
            lambda r: r["data_designer"]["model_configs"][1].update(provider="nowhere"),
            "{recipe}:94:5: data_designer.model_configs[1].provider: model alias 'judge': provider 'nowhere' does "
            "not exist",
            id="missing-provider-at-its-field",
        ),
        pytest.param(
            lambda r: r["data_designer"]["model_configs"][0].update(surprise=1),
            "{recipe}:72:5: data_designer.model_configs[0].surprise: unknown field",
            id="malformed-model-config",
        ),
    ],
)
def test_recipe_problems_point_into_the_recipe(recipe: dict[str, Any], tmp_path: Path, change: Any, want: str) -> None:
    change(recipe)
    with pytest.raises(ResolutionError) as info:
        resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), _settings(tmp_path), (), ENV)
    (problem,) = info.value.problems
    assert problem.startswith(want.format(recipe=EXAMPLE / "recipe.yaml")), problem


def test_deployment_problems_point_into_the_run_file(recipe: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(
        "name: r\nrecipe: recipe.yaml\nnum_records: 2\ndeployments:\n"
        "- {model_alias: writer, model: a}\n- {model_alias: writer, model: b}\n- {model_alias: embedder, model: e}\n"
    )
    deployments = (
        Deployment(model_alias="writer", model="a"),
        Deployment(model_alias="writer", model="b"),
        Deployment(model_alias="embedder", model="e"),
    )
    with pytest.raises(ResolutionError) as info:
        resolve(recipe, Origin(EXAMPLE / "recipe.yaml"), _settings(tmp_path), deployments, ENV, run_origin=Origin(run))
    assert info.value.problems == [
        f"{run}:6:4: deployments[1].model_alias: model alias 'writer' is already deployed by deployments[0]; use "
        "replicas to run more copies of one model",
        f"{run}:7:4: deployments[2].model_alias: no column of the recipe uses model alias 'embedder'; remove the "
        "deployment",
    ]
