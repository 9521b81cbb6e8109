"""MCP providers: read from ``mcp_providers.yaml``, only those the recipe's tool configs name captured, keys by
variable name only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import ProviderSnapshot, SnapshotMCPProvider, encode_pretty
from ddslurm.providers import MCP_PROVIDERS_FILE, Origin, ResolutionError, SettingsError, load_settings, resolve

KEY = "mcp-remote-key-Zq81nVw0aa93Lkq"
TOKEN = "stdio-token-value-PLm02kfj2n4"
ENV = {"SEARCH_MCP_KEY": KEY, "DOCS_TOKEN": TOKEN, "MODEL_KEY": "model-key-value-123"}

PROVIDERS = """\
providers:
- name: models
  endpoint: http://127.0.0.1:9/v1
  api_key: MODEL_KEY
"""
MODELS = """\
model_configs:
- alias: writer
  model: m
  provider: models
"""
MCP = """\
providers:
- name: search
  provider_type: streamable_http
  endpoint: http://127.0.0.1:8123/mcp
  api_key: SEARCH_MCP_KEY
- name: docs
  provider_type: stdio
  command: python
  args: [-m, docs_server]
  env: {LOG_LEVEL: info, DOCS_TOKEN: '${DOCS_TOKEN}'}
- name: unused
  provider_type: stdio
  command: python
  env: {API_KEY: sk-not-checked-since-unused-0123456789}
"""


def _recipe(*providers: str) -> dict[str, Any]:
    return {
        "data_designer": {
            "tool_configs": [{"tool_alias": "t", "providers": list(providers)}],
            "columns": [
                {"name": "q", "column_type": "llm-text", "model_alias": "writer", "prompt": "x", "tool_alias": "t"}
            ],
        }
    }


def _home(tmp_path: Path, mcp: str = MCP) -> Path:
    home = tmp_path / "dd-home"
    home.mkdir(exist_ok=True)
    (home / "model_providers.yaml").write_text(PROVIDERS)
    (home / "model_configs.yaml").write_text(MODELS)
    (home / MCP_PROVIDERS_FILE).write_text(mcp)
    return home


def _resolve(tmp_path: Path, recipe: dict[str, Any], mcp: str = MCP, env: dict[str, str] = ENV) -> ProviderSnapshot:
    settings = load_settings(_home(tmp_path, mcp))
    return resolve(recipe, Origin(tmp_path / "recipe.yaml"), settings, (), env).snapshot


def _problems(tmp_path: Path, recipe: dict[str, Any], mcp: str = MCP, env: dict[str, str] = ENV) -> list[str]:
    with pytest.raises(ResolutionError) as caught:
        _resolve(tmp_path, recipe, mcp, env)
    for problem in caught.value.problems:
        assert KEY not in problem and TOKEN not in problem and "sk-" not in problem
    return caught.value.problems


def test_only_the_named_providers_are_captured_with_keys_as_names(tmp_path: Path) -> None:
    snapshot = _resolve(tmp_path, _recipe("search", "docs"))
    assert snapshot.mcp_providers == (
        SnapshotMCPProvider(
            name="search",
            provider_type="streamable_http",
            endpoint="http://127.0.0.1:8123/mcp",
            api_key_env="SEARCH_MCP_KEY",
        ),
        SnapshotMCPProvider(
            name="docs",
            provider_type="stdio",
            command="python",
            args=("-m", "docs_server"),
            env={"LOG_LEVEL": "info"},
            env_from={"DOCS_TOKEN": "DOCS_TOKEN"},
        ),
    )
    assert snapshot.mcp_secret_env_names() == ("DOCS_TOKEN", "SEARCH_MCP_KEY")
    assert snapshot.secret_env_names() == ("DOCS_TOKEN", "MODEL_KEY", "SEARCH_MCP_KEY")
    written = encode_pretty(snapshot)
    assert KEY.encode() not in written and TOKEN.encode() not in written
    assert msgspec.json.decode(written, type=ProviderSnapshot) == snapshot


def test_a_recipe_without_tools_captures_none_and_old_snapshots_decode(tmp_path: Path) -> None:
    recipe = _recipe()
    del recipe["data_designer"]["tool_configs"]
    assert _resolve(tmp_path, recipe).mcp_providers == ()
    old = b'{"version": 1, "providers": [], "models": []}'
    assert msgspec.json.decode(old, type=ProviderSnapshot).mcp_providers == ()


def test_a_provider_that_is_not_configured_names_the_recipe_field(tmp_path: Path) -> None:
    (problem,) = _problems(tmp_path, _recipe("docs", "nowhere"))
    assert problem.startswith(f"{tmp_path / 'recipe.yaml'}: data_designer.tool_configs[0].providers[1]: ")
    assert "MCP provider 'nowhere' does not exist in" in problem and MCP_PROVIDERS_FILE in problem


def test_a_literal_remote_key_is_refused_at_its_field(tmp_path: Path) -> None:
    mcp = MCP.replace("api_key: SEARCH_MCP_KEY", f"api_key: {KEY}")
    (problem,) = _problems(tmp_path, _recipe("search"), mcp)
    assert problem.startswith(f"{tmp_path / 'dd-home' / MCP_PROVIDERS_FILE}:5:3: providers[0].api_key: ")
    assert "looks like a literal key (not shown)" in problem


def test_an_unset_key_variable_is_refused(tmp_path: Path) -> None:
    problems = _problems(tmp_path, _recipe("search", "docs"), env={"MODEL_KEY": "model-key-value-123"})
    assert len(problems) == 2
    assert "providers[0].api_key" in problems[0] and "SEARCH_MCP_KEY is unset" in problems[0]
    assert "providers[1].env.DOCS_TOKEN" in problems[1] and "DOCS_TOKEN is unset" in problems[1]


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("GITHUB_TOKEN: plainvalue1234", "env.GITHUB_TOKEN"),  # a credential-named key
        ("SETTING: ghp_abcdefghijklmnop", "env.SETTING"),  # a value that looks like a key
        ("SETTING: 'Bearer ${DOCS_TOKEN}'", "env.SETTING"),  # only a whole value names a variable
    ],
)
def test_credentials_in_a_stdio_env_are_refused(tmp_path: Path, entry: str, field: str) -> None:
    mcp = MCP.replace("LOG_LEVEL: info", entry)
    (problem,) = _problems(tmp_path, _recipe("docs"), mcp)
    assert f"providers[1].{field}: MCP provider 'docs': " in problem
    assert "plainvalue1234" not in problem and "ghp_" not in problem


def test_a_key_in_stdio_args_is_refused(tmp_path: Path) -> None:
    mcp = MCP.replace("args: [-m, docs_server]", "args: [--token, ghp_abcdefghijklmnop]")
    (problem,) = _problems(tmp_path, _recipe("docs"), mcp)
    assert "providers[1].args[1]: MCP provider 'docs': " in problem and "ghp_" not in problem


def test_credentials_in_an_endpoint_and_fields_of_the_other_kind_are_refused(tmp_path: Path) -> None:
    mcp = MCP.replace("endpoint: http://127.0.0.1:8123/mcp", "endpoint: http://u:p@127.0.0.1:8123/mcp\n  command: x")
    problems = _problems(tmp_path, _recipe("search"), mcp)
    assert any("providers[0].command: MCP provider 'search': not a field of a streamable_http" in p for p in problems)
    assert any("providers[0].endpoint" in p and "user-info" in p for p in problems)


def test_a_malformed_file_names_its_line(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"mcp_providers\.yaml:2:"):
        load_settings(_home(tmp_path, "providers:\n- {name: x, provider_type: websocket}\n"))


def test_a_provider_defined_twice_with_different_content_names_both_places(tmp_path: Path) -> None:
    mcp = (
        MCP
        + "- {name: docs, provider_type: stdio, command: other}\n- {name: search, provider_type: sse, endpoint: x}\n"
    )
    problems = _problems(tmp_path, _recipe("docs"), mcp)
    file = tmp_path / "dd-home" / MCP_PROVIDERS_FILE
    assert problems == [
        f"{file}:15:3: providers[3]: MCP provider 'docs' is defined twice with different content (first at "
        f"{file}:6:3: providers[1]); keep one definition"
    ]
