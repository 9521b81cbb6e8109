"""What ``ddslurm submit`` says when it refuses: every error names its file, line, column and field, and no
error repeats a value that might be a key."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ddslurm.launcher import SubmitError, prepare
from ddslurm.launcher.testing import InProcessHost
from ddslurm.providers import SettingsError, load_settings

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""

RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}
  model_configs:
  - {alias: writer, model: m-1, provider: hosted}
"""


def _files(tmp_path: Path, run_extra: str = "", profile_extra: str = "") -> tuple[Path, Path, dict[str, str]]:
    home = tmp_path / "dd"
    home.mkdir()
    (home / "model_providers.yaml").write_text(
        "providers:\n- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HOSTED_KEY}\n"
    )
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    run = tmp_path / "run.yaml"
    shards = "" if "shards:" in run_extra else "shards: 2\n"
    run.write_text(f"name: unit\nrecipe: recipe.yaml\nnum_records: 10\n{shards}{run_extra}")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "ddslurm-runtime").write_text("#!/bin/sh\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"workspace: work\npython_env: venv\npartition: gpu\ncpu_partition: cpu\n{profile_extra}")
    env = {"DATA_DESIGNER_HOME": str(home), "HOSTED_KEY": "k" * 24, "PATH": "/usr/bin:/bin"}
    return run, profile, env


@pytest.mark.parametrize(
    ("run_extra", "profile_extra", "want"),
    [
        pytest.param(
            "submission:\n  memory: lots\n",
            "",
            "{run}:6:3: submission.memory: 'lots' is not a Slurm size such as 16G or 500M",
            id="submission-memory",
        ),
        pytest.param(
            "collection:\n  time_limit: soon\n",
            "",
            "{run}:6:3: collection.time_limit: 'soon' is not a Slurm time",
            id="collection-time-limit",
        ),
        pytest.param(
            "shards: 20\n",
            "",
            "{run}:4:1: shards: 20 shards for 10 records",
            id="shards",
        ),
        pytest.param(
            "deployments:\n- {model_alias: writer, model: m, tensor_parallel: 3}\n",
            "gpus_per_node: 4\n",
            "{run}:6:35: deployments[0].tensor_parallel: 3 does not divide the 4 GPUs of a node (model alias 'writer')",
            id="deployment",
        ),
        pytest.param(
            "deployments:\n- {model_alias: writer, model: m}\n",
            "gpus_per_node: 0\n",
            "{profile}:5:1: gpus_per_node: 0, but the run deploys models",
            id="profile-field",
        ),
        pytest.param(
            "deployments:\n- {model_alias: writer, model: m}\n- {model_alias: writer, model: n}\n",
            "gpus_per_node: 4\n",
            "1 problem(s) resolving model providers:\n  - {run}:7:4: deployments[1].model_alias: model alias "
            "'writer' is already deployed by deployments[0]",
            id="deployed-twice",
        ),
    ],
)
def test_refusals_name_file_line_and_field(tmp_path: Path, run_extra: str, profile_extra: str, want: str) -> None:
    run, profile, env = _files(tmp_path, run_extra, profile_extra)
    with pytest.raises(SubmitError) as info:
        prepare(run, profile, env, datetime.now(UTC), host=HOST)
    assert str(info.value).startswith(want.format(run=run, profile=profile)), str(info.value)


def test_reserved_provider_name_names_the_deployment(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, "deployments:\n- {model_alias: writer, model: m}\n", "gpus_per_node: 4\n")
    providers = tmp_path / "dd" / "model_providers.yaml"
    providers.write_text(providers.read_text() + "- {name: ddslurm-local-writer, endpoint: 'http://x/v1'}\n")
    with pytest.raises(SubmitError) as info:
        prepare(run, profile, env, datetime.now(UTC), host=HOST)
    assert (
        f"{providers}:3:4: providers[1].name: provider name 'ddslurm-local-writer' is reserved for ddslurm's local "
        f"deployment of model alias 'writer' ({run}:6:3: deployments[0])"
    ) in str(info.value)


def test_a_duplicate_key_in_a_settings_file_is_placed_and_its_values_are_not_shown(tmp_path: Path) -> None:
    (tmp_path / "model_providers.yaml").write_text(
        "providers:\n- name: p\n  endpoint: http://h/v1\n  api_key: sk-first-0123456789abcdef\n"
        "  api_key: sk-second-0123456789abcdef\n"
    )
    with pytest.raises(SettingsError) as info:
        load_settings(tmp_path)
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'model_providers.yaml'}:5:3: duplicate key 'api_key'"), text
    assert "sk-first" not in text and "sk-second" not in text


def test_missing_recipe_and_python_env_are_placed(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path)
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: nowhere.yaml"))
    with pytest.raises(SubmitError) as info:
        prepare(run, profile, env, datetime.now(UTC), host=HOST)
    assert str(info.value) == f"{run}:2:1: recipe: {tmp_path / 'nowhere.yaml'} does not exist"

    (tmp_path / "p").mkdir()
    run, profile, env = _files(tmp_path / "p")
    profile.write_text(profile.read_text().replace("python_env: venv", "python_env: novenv"))
    with pytest.raises(SubmitError) as info:
        prepare(run, profile, env, datetime.now(UTC), host=HOST)
    assert str(info.value).startswith(f"{profile}:2:1: python_env: {tmp_path / 'p' / 'novenv' / 'bin'}")
