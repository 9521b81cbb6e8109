"""Discovery of Data Designer's settings directory and loading of its native settings files."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.providers import (
    MODEL_CONFIGS_FILE,
    PROVIDERS_FILE,
    NativeModelConfig,
    NativeProvider,
    Origin,
    SettingsError,
    load_settings,
)
from ddslurm.providers.discovery import DD_HOME_ENV, settings_dir

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

# DD's library writes every key, with explicit nulls (data-designer-engine.md §3).
LIBRARY_PROVIDERS = """\
providers:
- name: nvidia
  endpoint: https://integrate.api.nvidia.com/v1
  provider_type: openai
  api_key: NVIDIA_API_KEY
  extra_body: null
  extra_headers: null
- name: local-vllm
  endpoint: http://127.0.0.1:8000/v1
  provider_type: openai
  api_key: null
  extra_body: null
  extra_headers: null
"""
LIBRARY_MODELS = """\
model_configs:
- alias: gen
  model: served-name
  provider: local-vllm
  skip_health_check: false
  inference_parameters:
    generation_type: chat-completion
    max_parallel_requests: 32
    timeout: null
    temperature: 0.7
    top_p: 0.95
    max_tokens: 256
    extra_body: null
"""
# DD's CLI writes the same shapes with null keys left out.
CLI_PROVIDERS = """\
providers:
- name: nvidia
  endpoint: https://integrate.api.nvidia.com/v1
  provider_type: openai
  api_key: NVIDIA_API_KEY
- {name: local-vllm, endpoint: http://127.0.0.1:8000/v1}
"""
CLI_MODELS = """\
model_configs:
- alias: gen
  model: served-name
  provider: local-vllm
  inference_parameters:
    temperature: 0.7
    top_p: 0.95
    max_tokens: 256
"""

WANT_PROVIDERS = (
    NativeProvider(name="nvidia", endpoint="https://integrate.api.nvidia.com/v1", api_key="NVIDIA_API_KEY"),
    NativeProvider(name="local-vllm", endpoint="http://127.0.0.1:8000/v1"),
)


def write_settings(directory: Path, providers: str | None = None, models: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if providers is not None:
        (directory / PROVIDERS_FILE).write_text(providers, encoding="utf-8")
    if models is not None:
        (directory / MODEL_CONFIGS_FILE).write_text(models, encoding="utf-8")
    return directory


# --- settings_dir ---


@pytest.mark.parametrize(
    ("env", "want"),
    [
        pytest.param({DD_HOME_ENV: "/opt/dd"}, "/opt/dd", id="DATA_DESIGNER_HOME-set"),
        pytest.param({DD_HOME_ENV: "relative/dd"}, "relative/dd", id="DATA_DESIGNER_HOME-relative"),
        pytest.param({}, "/home/alice/.data-designer", id="unset-uses-home"),
        pytest.param({DD_HOME_ENV: ""}, "/home/alice/.data-designer", id="empty-uses-home"),
        pytest.param({"HOME": "/elsewhere"}, "/home/alice/.data-designer", id="explicit-home-beats-HOME"),
    ],
)
def test_settings_dir(env: dict[str, str], want: str) -> None:
    assert settings_dir(env, Path("/home/alice")) == Path(want)


def test_settings_dir_defaults_to_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert settings_dir({}) == tmp_path / ".data-designer"


# --- load_settings ---


@pytest.mark.parametrize(
    ("providers", "models"),
    [
        pytest.param(LIBRARY_PROVIDERS, LIBRARY_MODELS, id="library-shape-explicit-nulls"),
        pytest.param(CLI_PROVIDERS, CLI_MODELS, id="cli-shape-absent-keys"),
    ],
)
def test_load_settings_accepts_both_shapes(tmp_path: Path, providers: str, models: str) -> None:
    directory = write_settings(tmp_path / "dd", providers, models)

    settings = load_settings(directory)

    assert settings.directory == directory
    assert tuple(p for p, _ in settings.providers) == WANT_PROVIDERS
    assert [o for _, o in settings.providers] == [
        Origin(directory / PROVIDERS_FILE, steps=("providers", 0)),
        Origin(directory / PROVIDERS_FILE, steps=("providers", 1)),
    ]
    [(model, origin)] = settings.models
    assert origin == Origin(directory / MODEL_CONFIGS_FILE, steps=("model_configs", 0))
    assert origin.at("provider") == f"{directory / MODEL_CONFIGS_FILE}:4:3: model_configs[0].provider"
    assert (model.alias, model.model, model.provider, model.skip_health_check) == (
        "gen",
        "served-name",
        "local-vllm",
        False,
    )
    assert model.inference_parameters is not None
    assert {k: v for k, v in model.inference_parameters.items() if v is not None} == {
        **({"generation_type": "chat-completion", "max_parallel_requests": 32} if "null" in models else {}),
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 256,
    }


def test_inference_parameters_are_kept_exactly(tmp_path: Path) -> None:
    directory = write_settings(tmp_path, models=LIBRARY_MODELS)
    [(model, _)] = load_settings(directory).models
    params = model.inference_parameters
    assert params == {
        "generation_type": "chat-completion",
        "max_parallel_requests": 32,
        "timeout": None,
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 256,
        "extra_body": None,
    }
    assert params is not None
    assert type(params["temperature"]) is float  # plain builtins, not ruamel scalar types


@pytest.mark.parametrize(
    ("written", "want"),
    [
        pytest.param("OpenAI", "openai", id="mixed-case"),
        pytest.param("ANTHROPIC", "anthropic", id="upper-case"),
        pytest.param("openai", "openai", id="already-lower"),
    ],
)
def test_provider_type_is_lower_cased(tmp_path: Path, written: str, want: str) -> None:
    directory = write_settings(tmp_path, f"providers:\n- name: p\n  endpoint: e\n  provider_type: {written}\n")
    [(provider, _)] = load_settings(directory).providers
    assert provider.provider_type == want


@pytest.mark.parametrize(
    ("providers", "models"),
    [
        pytest.param(None, None, id="no-files"),
        pytest.param("providers:\n", "model_configs:\n", id="null-lists"),
        pytest.param("providers: []\n", "model_configs: []\n", id="empty-lists"),
        pytest.param("default: nvidia\nproviders: []\n", None, id="legacy-default-key-ignored"),
    ],
)
def test_load_settings_empty(tmp_path: Path, providers: str | None, models: str | None) -> None:
    settings = load_settings(write_settings(tmp_path / "dd", providers, models))
    assert (settings.providers, settings.models) == ((), ())


def test_missing_directory_means_no_settings(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "does-not-exist")
    assert (settings.providers, settings.models) == ((), ())


def test_only_one_file_present(tmp_path: Path) -> None:
    settings = load_settings(write_settings(tmp_path, models=CLI_MODELS))
    assert settings.providers == ()
    assert [m.alias for m, _ in settings.models] == ["gen"]


@pytest.mark.parametrize(
    ("file", "text", "where"),
    [
        pytest.param(
            PROVIDERS_FILE,
            "providers:\n- name: a\n  endpoint: e\n  endpiont: x\n",
            "4:3: providers[0].endpiont: unknown field",
            id="provider-unknown-key",
        ),
        pytest.param(
            PROVIDERS_FILE,
            "providers:\n- name: a\n  endpoint: e\n- name: b\n",
            "4:3: providers[1].endpoint: required field is missing",
            id="provider-missing-endpoint",
        ),
        pytest.param(
            PROVIDERS_FILE,
            "providers:\n- name: a\n  endpoint: e\n  api_key: 5\n",
            "4:3: providers[0].api_key: expected str | null, got int",
            id="provider-wrong-type",
        ),
        pytest.param(
            PROVIDERS_FILE,
            "providers:\n- name: a\n  endpoint: e\n  extra_headers:\n    X-Request-Id: 5\n",
            "4:3: providers[0].extra_headers: expected str, got int",
            id="header-value-not-a-string",
        ),
        pytest.param(PROVIDERS_FILE, "providers: [\n", "2:1: expected the node content", id="yaml-syntax"),
        pytest.param(PROVIDERS_FILE, "providers: {}\n", "1:1: providers: expected array, got object", id="map"),
        pytest.param(
            MODEL_CONFIGS_FILE,
            "model_configs:\n- alias: a\n  model: m\n  skip_health_check: maybe\n",
            "4:3: model_configs[0].skip_health_check: expected bool, got str",
            id="model-wrong-type",
        ),
        pytest.param(
            MODEL_CONFIGS_FILE,
            "model_configs:\n- model: m\n",
            "2:3: model_configs[0].alias: required field is missing",
            id="model-missing-alias",
        ),
        pytest.param(
            MODEL_CONFIGS_FILE, "- alias: a\n", "1:1: the top level must be a mapping", id="model-file-is-a-list"
        ),
    ],
)
def test_malformed_settings_name_file_line_col(tmp_path: Path, file: str, text: str, where: str) -> None:
    (tmp_path / file).write_text(text, encoding="utf-8")

    with pytest.raises(SettingsError) as info:
        load_settings(tmp_path)

    assert str(info.value).startswith(f"{tmp_path / file}:{where}")


def test_native_structs_are_frozen() -> None:
    provider = NativeProvider(name="p", endpoint="e")
    model = NativeModelConfig(alias="a", model="m")
    with pytest.raises(AttributeError):
        provider.api_key = "X"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        model.provider = "p"  # type: ignore[misc]
