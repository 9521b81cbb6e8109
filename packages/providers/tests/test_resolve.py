"""Alias resolution into a provider snapshot, and the secret policy."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import Deployment, ProviderSnapshot, SnapshotModel, SnapshotProvider, recipe_section
from ddslurm.providers import (
    LOCAL_PROVIDER_PREFIX,
    LOCAL_TOKEN_ENV,
    MODEL_CONFIGS_FILE,
    PROVIDERS_FILE,
    AliasRow,
    NativeSettings,
    Origin,
    ResolutionError,
    is_credential_header,
    load_recipe,
    load_settings,
    missing_env,
    resolve,
    used_aliases,
)

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hosted-only"
SECRET = "s3cr3t-VALUE-never-printed-0123456789"
KEY_ENV = "DEMO_HOSTED_API_KEY"
ENV = {KEY_ENV: SECRET}

WRITER_PARAMS = {
    "extra_body": None,
    "generation_type": "chat-completion",
    "max_parallel_requests": 16,
    "max_tokens": 256,
    "temperature": 0.7,
    "timeout": None,
    "top_p": None,
}
JUDGE_PARAMS = {**WRITER_PARAMS, "temperature": 0.0}

PROVIDERS = f"""\
providers:
- name: demo-hosted
  endpoint: http://127.0.0.1:18400/v1
  provider_type: OpenAI
  api_key: {KEY_ENV}
  extra_body: {{chat_template_kwargs: {{enable_thinking: false}}}}
  extra_headers: {{X-Title: ddslurm}}
- name: unused-provider
  endpoint: https://unused.example/v1
  api_key: UNUSED_API_KEY
"""


@pytest.fixture
def recipe() -> dict[str, Any]:
    return load_recipe(EXAMPLE / "recipe.yaml")


@pytest.fixture
def settings(tmp_path: Path) -> NativeSettings:
    return make_settings(tmp_path, PROVIDERS)


def make_settings(directory: Path, providers: str | None = None, models: str | None = None) -> NativeSettings:
    directory.mkdir(parents=True, exist_ok=True)
    if providers is not None:
        (directory / PROVIDERS_FILE).write_text(providers, encoding="utf-8")
    if models is not None:
        (directory / MODEL_CONFIGS_FILE).write_text(models, encoding="utf-8")
    return load_settings(directory)


def origin() -> Origin:
    return Origin(EXAMPLE / "recipe.yaml")


def shorthand(columns: list[dict[str, Any]], models: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    recipe: dict[str, Any] = {"columns": columns}
    if models is not None:
        recipe["model_configs"] = models
    return recipe


def llm(name: str, alias: str) -> dict[str, Any]:
    return {"column_type": "llm-text", "name": name, "model_alias": alias, "prompt": "p"}


# --- used_aliases ---


def test_used_aliases_of_the_example_recipe(recipe: dict[str, Any]) -> None:
    assert used_aliases(recipe) == ("writer", "judge")


@pytest.mark.parametrize(
    ("recipe", "want"),
    [
        pytest.param(shorthand([llm("a", "x"), llm("b", "y")]), ("x", "y"), id="shorthand-top-level-columns"),
        pytest.param(
            shorthand([llm("a", "y"), llm("b", "x"), llm("c", "y")]), ("y", "x"), id="first-use-order-no-repeats"
        ),
        pytest.param(
            shorthand([{"name": "s", "column_type": "sampler", "params": {"values": ["a"]}}]), (), id="no-llm-columns"
        ),
        pytest.param({"columns": None}, (), id="null-columns"),
        pytest.param({}, (), id="no-columns"),
        pytest.param(
            {"data_designer": {"columns": [llm("a", "inner")]}, "columns": [llm("b", "outer")]},
            ("inner",),
            id="full-format-wins-over-top-level",
        ),
        pytest.param(
            shorthand([{"name": "c", "column_type": "custom", "params": {"generators": [{"model_alias": "deep"}]}}]),
            ("deep",),
            id="nested-model-alias",
        ),
        pytest.param(
            {"columns": [llm("a", "x")], "model_configs": [{"alias": "unused", "model": "m", "provider": "p"}]},
            ("x",),
            id="model-configs-alone-are-not-uses",
        ),
    ],
)
def test_used_aliases(recipe: dict[str, Any], want: tuple[str, ...]) -> None:
    assert used_aliases(recipe) == want


def test_recipe_section() -> None:
    inner = {"columns": []}
    assert recipe_section({"data_designer": inner, "library_version": "1"}) is inner
    flat = {"columns": []}
    assert recipe_section(flat) is flat


# --- resolve: hosted ---


def test_hosted_aliases_keep_model_and_inference_parameters_exactly(
    recipe: dict[str, Any], settings: NativeSettings
) -> None:
    resolution = resolve(recipe, origin(), settings, (), ENV)

    assert resolution.snapshot.models == (
        SnapshotModel(
            alias="writer",
            model="demo/writer-8b",
            provider="demo-hosted",
            inference_parameters=WRITER_PARAMS,
            source="recipe",
        ),
        SnapshotModel(
            alias="judge",
            model="demo/judge-70b",
            provider="demo-hosted",
            inference_parameters=JUDGE_PARAMS,
            source="recipe",
        ),
    )
    params = resolution.snapshot.models[1].inference_parameters
    assert params is not None
    assert type(params["temperature"]) is float


def test_only_needed_providers_are_in_the_snapshot(recipe: dict[str, Any], settings: NativeSettings) -> None:
    assert [p.name for p, _ in settings.providers] == ["demo-hosted", "unused-provider"]

    snapshot = resolve(recipe, origin(), settings, (), ENV).snapshot

    assert snapshot.providers == (
        SnapshotProvider(
            name="demo-hosted",
            endpoint="http://127.0.0.1:18400/v1",
            provider_type="openai",
            api_key_env=KEY_ENV,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            extra_headers={"X-Title": "ddslurm"},
            local=False,
        ),
    )
    assert snapshot.secret_env_names() == (KEY_ENV,)


def test_unused_provider_problems_are_ignored(recipe: dict[str, Any], tmp_path: Path) -> None:
    # The unused provider's key variable is unset and its header carries a credential: neither matters.
    settings = make_settings(
        tmp_path,
        PROVIDERS + "- name: broken\n  endpoint: e\n  api_key: sk-literal\n  extra_headers: {Authorization: x}\n",
    )
    assert [p.name for p in resolve(recipe, origin(), settings, (), ENV).snapshot.providers] == ["demo-hosted"]


def test_api_keys_appear_only_as_names(recipe: dict[str, Any], settings: NativeSettings) -> None:
    resolution = resolve(recipe, origin(), settings, (), ENV)

    wire = msgspec.json.encode(resolution.snapshot)
    assert SECRET.encode() not in wire
    assert KEY_ENV.encode() in wire
    rows = msgspec.json.encode(list(resolution.rows))
    assert SECRET.encode() not in rows
    assert SECRET not in repr(resolution)


def test_rows_describe_each_alias(recipe: dict[str, Any], settings: NativeSettings) -> None:
    rows = resolve(recipe, origin(), settings, (), ENV).rows
    assert rows == (
        AliasRow("writer", "hosted", "demo-hosted", "http://127.0.0.1:18400/v1", "demo/writer-8b", KEY_ENV, True, True),
        AliasRow("judge", "hosted", "demo-hosted", "http://127.0.0.1:18400/v1", "demo/judge-70b", KEY_ENV, True, True),
    )


def test_model_config_from_the_settings_directory(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        "providers:\n- {name: nv, endpoint: https://nv/v1, api_key: NV_KEY}\n",
        "model_configs:\n- alias: gen\n  model: org/m\n  provider: nv\n  skip_health_check: true\n"
        "  inference_parameters: {temperature: {distribution_type: uniform, params: {low: 0.1, high: 0.9}}}\n",
    )

    snapshot = resolve(shorthand([llm("c", "gen")]), origin(), settings, (), {"NV_KEY": "k"}).snapshot

    assert snapshot.models == (
        SnapshotModel(
            alias="gen",
            model="org/m",
            provider="nv",
            inference_parameters={"temperature": {"distribution_type": "uniform", "params": {"low": 0.1, "high": 0.9}}},
            skip_health_check=True,
            source="settings",
        ),
    )


def test_provider_without_api_key(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, "providers:\n- {name: open, endpoint: http://h/v1}\n")
    recipe = shorthand([llm("c", "gen")], [{"alias": "gen", "model": "m", "provider": "open"}])

    resolution = resolve(recipe, origin(), settings, (), {})

    assert resolution.snapshot.providers == (SnapshotProvider(name="open", endpoint="http://h/v1"),)
    assert resolution.snapshot.secret_env_names() == ()
    assert resolution.rows[0].key_env is None
    assert resolution.rows[0].key_set is None


def test_identical_definitions_in_recipe_and_settings_are_fine(recipe: dict[str, Any], tmp_path: Path) -> None:
    writer = recipe["data_designer"]["model_configs"][0]
    models = msgspec.json.encode({"model_configs": [writer]}).decode()  # JSON is YAML
    settings = make_settings(tmp_path, PROVIDERS + PROVIDERS.split("\n", 1)[1], models)

    snapshot = resolve(recipe, origin(), settings, (), ENV).snapshot

    assert [m.source for m in snapshot.models] == ["recipe", "recipe"]
    assert [p.name for p in snapshot.providers] == ["demo-hosted"]


# --- resolve: local deployments ---


@pytest.mark.parametrize(
    ("served", "want_model"),
    [
        pytest.param("writer-served", "writer-served", id="served-model-name"),
        pytest.param(None, "meta/llama-3.1-8b", id="defaults-to-model"),
    ],
)
def test_local_deployment_gets_a_generated_provider(
    recipe: dict[str, Any], settings: NativeSettings, served: str | None, want_model: str
) -> None:
    deployments = (Deployment(model_alias="writer", model="meta/llama-3.1-8b", served_model_name=served),)

    resolution = resolve(recipe, origin(), settings, deployments, ENV)

    assert LOCAL_PROVIDER_PREFIX == "ddslurm-local-"
    assert resolution.snapshot.providers == (
        SnapshotProvider(name="ddslurm-local-writer", endpoint="", api_key_env=LOCAL_TOKEN_ENV, local=True),
        SnapshotProvider(
            name="demo-hosted",
            endpoint="http://127.0.0.1:18400/v1",
            api_key_env=KEY_ENV,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            extra_headers={"X-Title": "ddslurm"},
        ),
    )
    assert resolution.snapshot.models[0] == SnapshotModel(
        alias="writer",
        model=want_model,
        provider="ddslurm-local-writer",
        inference_parameters=WRITER_PARAMS,
        source="deployment",
    )
    assert resolution.snapshot.models[1].provider == "demo-hosted"
    assert resolution.rows[0] == AliasRow(
        "writer", "local", "ddslurm-local-writer", "(started in the job)", want_model, None, None
    )


def test_all_local_needs_no_settings_and_no_keys(tmp_path: Path) -> None:
    recipe = shorthand([llm("a", "gen")])
    deployments = (Deployment(model_alias="gen", model="org/m"),)

    snapshot = resolve(recipe, origin(), make_settings(tmp_path / "empty"), deployments, {}).snapshot

    assert snapshot == ProviderSnapshot(
        providers=(SnapshotProvider(name="ddslurm-local-gen", endpoint="", api_key_env=LOCAL_TOKEN_ENV, local=True),),
        models=(SnapshotModel(alias="gen", model="org/m", provider="ddslurm-local-gen", source="deployment"),),
    )
    assert [p.api_key_env for p in snapshot.providers if not p.local] == []  # nothing the submitting shell exports


# --- resolve: every problem ---


def _drop(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


def case_unknown_alias(recipe: dict[str, Any]) -> dict[str, Any]:
    recipe["data_designer"]["columns"][2]["model_alias"] = "ghost"
    return {}


def case_missing_provider(recipe: dict[str, Any]) -> dict[str, Any]:
    recipe["data_designer"]["model_configs"][1]["provider"] = "nowhere"
    return {}


def case_no_provider(recipe: dict[str, Any]) -> dict[str, Any]:
    configs = recipe["data_designer"]["model_configs"]
    configs[1] = _drop(configs[1], "provider")
    return {}


def case_alias_twice(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"models": "model_configs:\n- {alias: writer, model: other/model, provider: demo-hosted}\n"}


def case_provider_twice(recipe: dict[str, Any]) -> dict[str, Any]:
    return {
        "providers": PROVIDERS + "- {name: demo-hosted, endpoint: https://other/v1, api_key: DEMO_HOSTED_API_KEY}\n"
    }


def case_reserved_name(recipe: dict[str, Any]) -> dict[str, Any]:
    return {
        "providers": PROVIDERS + "- {name: ddslurm-local-writer, endpoint: http://x/v1}\n",
        "deployments": (Deployment(model_alias="writer", model="m"),),
    }


def case_key_unset(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"env": {}}


def case_key_empty(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"env": {KEY_ENV: ""}}


def case_literal_key(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"providers": PROVIDERS.replace(f"api_key: {KEY_ENV}", f"api_key: sk-{SECRET}"), "env": {}}


def case_lower_case_key(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"providers": PROVIDERS.replace(f"api_key: {KEY_ENV}", "api_key: abcdef0123456789"), "env": {}}


def case_credential_header(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"providers": PROVIDERS.replace("{X-Title: ddslurm}", f"{{Authorization: Bearer {SECRET}}}")}


def case_unused_deployment(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"deployments": (Deployment(model_alias="embedder", model="m"),)}


def case_bad_recipe_model_configs(recipe: dict[str, Any]) -> dict[str, Any]:
    recipe["data_designer"]["model_configs"][0]["surprise"] = 1
    return {}


@pytest.mark.parametrize(
    ("mutate", "names", "words"),
    [
        pytest.param(case_unknown_alias, ["'ghost'"], "has no deployment in the run file", id="alias-without-config"),
        pytest.param(case_missing_provider, ["'judge'", "'nowhere'"], "does not exist", id="provider-does-not-exist"),
        pytest.param(case_no_provider, ["'judge'"], "names no provider", id="model-config-without-provider"),
        pytest.param(case_alias_twice, ["'writer'"], "defined twice with different content", id="alias-twice"),
        pytest.param(
            case_provider_twice, ["'demo-hosted'"], "defined twice with different content", id="provider-twice"
        ),
        pytest.param(case_reserved_name, ["'ddslurm-local-writer'"], "is reserved", id="reserved-local-name"),
        pytest.param(case_key_unset, ["'demo-hosted'", KEY_ENV], "is unset or empty", id="api-key-env-unset"),
        pytest.param(case_key_empty, ["'demo-hosted'", KEY_ENV], "is unset or empty", id="api-key-env-empty"),
        pytest.param(case_literal_key, ["'demo-hosted'"], "looks like a literal key", id="literal-api-key"),
        pytest.param(case_lower_case_key, ["'demo-hosted'"], "looks like a literal key", id="lower-case-api-key"),
        pytest.param(
            case_credential_header, ["'demo-hosted'", "'Authorization'"], "carries a credential", id="auth-header"
        ),
        pytest.param(case_unused_deployment, ["'embedder'"], "no column of the recipe uses", id="unused-deployment"),
        pytest.param(case_bad_recipe_model_configs, ["surprise"], "model_configs", id="malformed-recipe-models"),
    ],
)
def test_each_problem_is_reported_by_name(
    recipe: dict[str, Any], tmp_path: Path, mutate: Any, names: list[str], words: str
) -> None:
    recipe = copy.deepcopy(recipe)
    case = mutate(recipe)
    settings = make_settings(tmp_path, case.get("providers", PROVIDERS), case.get("models"))

    with pytest.raises(ResolutionError) as info:
        resolve(recipe, origin(), settings, case.get("deployments", ()), case.get("env", ENV))

    problems = info.value.problems
    assert len(problems) == 1, problems
    assert words in problems[0]
    for name in names:
        assert name in problems[0]
    assert SECRET not in str(info.value)
    assert str(info.value).startswith("1 problem(s) resolving model providers:\n  - ")


def test_a_misspelt_alias_gets_a_did_you_mean(recipe: dict[str, Any], tmp_path: Path) -> None:
    recipe = copy.deepcopy(recipe)
    recipe["data_designer"]["columns"].append(llm("extra", "jduge"))  # the recipe's model configs have "judge"
    settings = make_settings(tmp_path, PROVIDERS)
    deployments = (Deployment(model_alias="writr", model="m"),)  # the recipe uses "writer", hosted

    with pytest.raises(ResolutionError) as info:
        resolve(recipe, origin(), settings, deployments, ENV)

    problems = info.value.problems
    assert len(problems) == 2, problems
    assert problems[0].endswith(
        "model alias 'jduge' has no deployment in the run file and no model config in the "
        f"recipe or in {settings.directory}; did you mean 'judge'?"
    )
    assert problems[1].endswith("no column of the recipe uses model alias 'writr'; did you mean 'writer'?")


def test_an_alias_like_no_other_gets_no_suggestion(recipe: dict[str, Any], tmp_path: Path) -> None:
    recipe = copy.deepcopy(recipe)
    recipe["data_designer"]["columns"].append(llm("extra", "zzz"))

    settings = make_settings(tmp_path, PROVIDERS)

    with pytest.raises(ResolutionError) as info:
        resolve(recipe, origin(), settings, (), ENV)

    at = origin().at("data_designer", "columns", len(recipe["data_designer"]["columns"]) - 1, "model_alias")
    assert info.value.problems == [
        f"{at}: model alias 'zzz' has no deployment in the run file and no model config in the recipe or in "
        f"{settings.directory}"
    ]


def test_every_problem_is_reported_at_once(recipe: dict[str, Any], tmp_path: Path) -> None:
    recipe = copy.deepcopy(recipe)
    columns = recipe["data_designer"]["columns"]
    columns.append(llm("extra", "ghost"))
    columns.append(llm("other", "orphan"))
    recipe["data_designer"]["model_configs"].append({"alias": "orphan", "model": "m", "provider": "nowhere"})
    settings = make_settings(tmp_path, PROVIDERS.replace("{X-Title: ddslurm}", "{X-Api-Key: k}"))
    deployments = (Deployment(model_alias="unused", model="m"),)

    with pytest.raises(ResolutionError) as info:
        resolve(recipe, origin(), settings, deployments, {})

    problems = info.value.problems
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    for fragment in (
        f"environment variable {KEY_ENV} is unset",
        "providers[0].extra_headers['X-Api-Key']: provider 'demo-hosted': carries a credential",
        "model alias 'ghost' has no deployment",
        "model alias 'orphan'",
        "provider 'nowhere' does not exist",
        "no column of the recipe uses model alias 'unused'",
    ):
        assert fragment in text
    assert str(info.value).startswith("5 problem(s) resolving model providers:\n")
    assert str(info.value).count("\n  - ") == 5


def test_a_provider_shared_by_many_aliases_is_reported_once(recipe: dict[str, Any], settings: NativeSettings) -> None:
    with pytest.raises(ResolutionError) as info:
        resolve(recipe, origin(), settings, (), {})
    assert len(info.value.problems) == 1


# --- secret policy ---


@pytest.mark.parametrize(
    ("header", "want"),
    [
        pytest.param("Authorization", True, id="authorization"),
        pytest.param("authorization", True, id="lower-case"),
        pytest.param(" Authorization ", True, id="padded"),
        pytest.param("Proxy-Authorization", True, id="proxy-authorization"),
        pytest.param("Cookie", True, id="cookie"),
        pytest.param("X-Api-Key", True, id="x-api-key"),
        pytest.param("api-key", True, id="api-key"),
        pytest.param("x-goog-api-key", True, id="suffix-key"),
        pytest.param("X-Auth-Token", True, id="auth-token"),
        pytest.param("X-Client-Secret", True, id="secret"),
        pytest.param("X-Password", True, id="password"),
        pytest.param("X-Apikey", True, id="apikey"),
        pytest.param("Key", True, id="bare-key"),
        pytest.param("X-Title", False, id="title"),
        pytest.param("HTTP-Referer", False, id="referer"),
        pytest.param("Content-Type", False, id="content-type"),
        pytest.param("X-Request-Id", False, id="request-id"),
        pytest.param("OpenAI-Organization", False, id="organization"),
        pytest.param("X-Monkey", False, id="key-inside-a-word"),
        pytest.param("X-Keyboard", False, id="key-prefix-of-a-word"),
    ],
)
def test_is_credential_header(header: str, want: bool) -> None:
    assert is_credential_header(header) is want


@pytest.mark.parametrize(
    ("names", "env", "want"),
    [
        pytest.param(["A", "B"], {"A": "1", "B": "2"}, [], id="all-set"),
        pytest.param(["A", "B"], {"A": "1"}, ["B"], id="one-unset"),
        pytest.param(["A", "B"], {"A": "", "B": "x"}, ["A"], id="empty-counts-as-missing"),
        pytest.param(["B", "A"], {}, ["B", "A"], id="keeps-order"),
        pytest.param([], {}, [], id="none-asked"),
    ],
)
def test_missing_env(names: list[str], env: dict[str, str], want: list[str]) -> None:
    assert missing_env(names, env) == want


def test_a_model_alias_deployed_twice_is_refused(recipe: dict[str, Any], settings: NativeSettings) -> None:
    deps = (Deployment(model_alias="writer", model="a"), Deployment(model_alias="writer", model="b"))
    with pytest.raises(ResolutionError) as err:
        resolve(recipe, Origin(Path("recipe.yaml")), settings, deps, {})
    assert any("deployments[1]" in p and "'writer'" in p for p in err.value.problems)
