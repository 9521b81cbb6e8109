"""Issue 37: one check for every string ddslurm captures into a run's snapshot. Each string is compared with the
values of every secret of the submitting shell (the providers' and MCP servers' key variables, ``${VAR}`` names,
``server.env_from``, and whatever looks like a credential), then judged by the key-shape rule of its field; a stdio
server's arguments are judged by each value they give, split at ``=`` as ``server.extra_args`` is. A refusal
names the file, line, column and field, and the variable, never the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import ProviderSnapshot, credential_shape
from ddslurm.config.testing import ID_LIKE_CREDENTIALS, LITERAL_CREDENTIALS, NOT_CREDENTIALS
from ddslurm.providers import (
    MCP_PROVIDERS_FILE,
    PROVIDERS_FILE,
    Origin,
    ResolutionError,
    args_secrets,
    captured_secret,
    load_settings,
    redact,
    resolve,
    secret_names,
    secret_values,
)

# Plain words: no key-shape rule sees a secret in them, only the comparison with the shell's values does.
TOKEN = "correct-horse-battery-staple"
MODEL_KEY = "model-key-value-Zq81nVw0aa93"
ENV = {"DOCS_SESAME": TOKEN, "MODEL_ACCESS": MODEL_KEY, "PATH": "/usr/bin:/bin"}

PROVIDERS = """\
providers:
- name: models
  endpoint: http://127.0.0.1:9/v1
  api_key: MODEL_ACCESS
  extra_headers: {X-Title: ddslurm}
"""
MCP = """\
providers:
- name: docs
  provider_type: stdio
  command: docs-server
  args: [ARGS]
  env: {LOG_LEVEL: info, DOCS: '${DOCS_SESAME}'}
"""
RECIPE: dict[str, Any] = {
    "data_designer": {
        "tool_configs": [{"tool_alias": "t", "providers": ["docs"]}],
        "columns": [{"name": "q", "column_type": "llm-text", "model_alias": "w", "prompt": "x", "tool_alias": "t"}],
        "model_configs": [{"alias": "w", "model": "m", "provider": "models"}],
    }
}


def _home(tmp_path: Path, *, providers: str = PROVIDERS, mcp: str = MCP) -> Path:
    home = tmp_path / "dd-home"
    home.mkdir(exist_ok=True)
    (home / PROVIDERS_FILE).write_text(providers)
    (home / MCP_PROVIDERS_FILE).write_text(mcp)
    return home


def _resolve(tmp_path: Path, **files: str) -> ProviderSnapshot:
    settings = load_settings(_home(tmp_path, **files))
    return resolve(RECIPE, Origin(tmp_path / "recipe.yaml"), settings, (), ENV).snapshot


def _problems(tmp_path: Path, **files: str) -> list[str]:
    with pytest.raises(ResolutionError) as caught:
        _resolve(tmp_path, **files)
    for problem in caught.value.problems:
        assert TOKEN not in problem and MODEL_KEY not in problem
    return caught.value.problems


def _line_col(text: str, needle: str) -> tuple[int, int]:
    """The line and column (1-based) where ``needle``'s YAML node starts in ``text``."""
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number, line.index(needle) + 1
    raise AssertionError(needle)


@pytest.mark.parametrize(
    "arg",
    [
        f"--auth={TOKEN}",  # the case: the server's own token, inline
        f"token={TOKEN}",  # a name=value argument without dashes
        f"--config=/etc/{TOKEN}/x",  # anywhere in a value, under a name that says nothing
    ],
)
def test_an_mcp_argument_that_holds_a_secret_value_is_refused_at_its_place(tmp_path: Path, arg: str) -> None:
    mcp = MCP.replace("args: [ARGS]", f"args: ['--index=/shared/docs', '{arg}']")
    (problem,) = _problems(tmp_path, mcp=mcp)
    line, col = _line_col(mcp, f"'{arg}'")
    place = f"{tmp_path / 'dd-home' / MCP_PROVIDERS_FILE}:{line}:{col}: providers[0].args[1]"
    assert problem.startswith(f"{place}: MCP provider 'docs': holds the value of $DOCS_SESAME, a secret"), problem
    assert "command lines every user" in problem


def test_an_argument_given_apart_from_its_flag_is_refused_at_the_value(tmp_path: Path) -> None:
    mcp = MCP.replace("args: [ARGS]", f"args: [--auth, '{TOKEN}']")
    (problem,) = _problems(tmp_path, mcp=mcp)
    assert "providers[0].args[1]: MCP provider 'docs': holds the value of $DOCS_SESAME" in problem


def test_a_key_shaped_value_under_a_credential_flag_is_still_refused_without_a_shell_value(tmp_path: Path) -> None:
    """The key-shape rules of ``server.extra_args`` apply to each value an argument gives: ``token=`` says it is a
    credential though no variable of the shell holds it."""
    mcp = MCP.replace("args: [ARGS]", "args: ['token=not-in-any-variable-42']")
    (problem,) = _problems(tmp_path, mcp=mcp)
    assert "providers[0].args[0]: MCP provider 'docs': looks like a secret (its name says it holds a credential" in (
        problem
    )
    assert "not-in-any-variable-42" not in problem


def test_harmless_arguments_pass(tmp_path: Path) -> None:
    args = ["-m", "docs_server", "--index=/shared/docs", "--mode", "fast", "level=3", "--verbose"]
    mcp = MCP.replace("args: [ARGS]", f"args: {args}")
    (provider,) = _resolve(tmp_path, mcp=mcp).mcp_providers
    assert provider.args == tuple(args) and provider.env_from == {"DOCS": "DOCS_SESAME"}


def test_a_literal_env_value_that_is_a_secret_is_refused(tmp_path: Path) -> None:
    mcp = MCP.replace("args: [ARGS]", "args: []").replace("LOG_LEVEL: info", f"LOG_LEVEL: '{MODEL_KEY}'")
    (problem,) = _problems(tmp_path, mcp=mcp)
    assert "providers[0].env.LOG_LEVEL: MCP provider 'docs': holds the value of $MODEL_ACCESS, a secret" in problem


def test_a_header_value_that_is_a_key_is_refused_at_its_place(tmp_path: Path) -> None:
    """An innocent header name with another provider's key as its value: no shape rule sees it, the value does."""
    providers = PROVIDERS.replace("X-Title: ddslurm", f"X-Title: '{TOKEN}'")
    (problem,) = _problems(tmp_path, providers=providers, mcp=MCP.replace("args: [ARGS]", "args: []"))
    line, col = _line_col(providers, "X-Title")  # a header is placed at its name, as every header problem is
    place = f"{tmp_path / 'dd-home' / PROVIDERS_FILE}:{line}:{col}: providers[0].extra_headers['X-Title']"
    assert problem.startswith(f"{place}: provider 'models': holds the value of $DOCS_SESAME, a secret"), problem


def test_a_secret_in_a_providers_endpoint_is_refused(tmp_path: Path) -> None:
    providers = PROVIDERS.replace("http://127.0.0.1:9/v1", f"http://127.0.0.1:9/{TOKEN}/v1")
    (problem,) = _problems(tmp_path, providers=providers, mcp=MCP.replace("args: [ARGS]", "args: []"))
    assert "providers[0].endpoint: provider 'models': holds the value of $DOCS_SESAME" in problem


def test_the_one_check_and_the_names_it_compares_with() -> None:
    env = {**ENV, "CI_JOB_TOKEN": "plainvalue1234", "EMPTYISH": "EMPTY", "HOME": "/root"}
    names = secret_names(env, {"DOCS_SESAME", "MODEL_ACCESS", "NOT_SET"})
    assert names == {"DOCS_SESAME", "MODEL_ACCESS", "CI_JOB_TOKEN"}  # named, set, and a token by its name
    secrets = secret_values(names | {"EMPTYISH"}, env)
    assert set(secrets) == {"DOCS_SESAME", "MODEL_ACCESS", "CI_JOB_TOKEN"}  # a placeholder is no secret
    assert captured_secret(f"x {TOKEN} y", secrets, shaped=False) == "holds the value of $DOCS_SESAME, a secret " + (
        "(values are not shown)"
    )
    assert captured_secret("plain words", secrets) is None
    assert args_secrets(["-m", "s", f"--auth={TOKEN}", "--k", "plainvalue1234"], secrets) == [
        (2, "holds the value of $DOCS_SESAME, a secret (values are not shown)"),
        (4, "holds the value of $CI_JOB_TOKEN, a secret (values are not shown)"),
    ]
    shown = redact(f"printed {TOKEN} and plainvalue1234", secrets)
    assert shown == "printed <$DOCS_SESAME redacted> and <$CI_JOB_TOKEN redacted>"


# --- places: an MCP server's env and arguments, and the shell's variables, agree with the one secret policy ---


def _mcp_fields(value: str) -> dict[str, str]:
    """An stdio MCP provider with ``value`` in its ``env`` and in its arguments, by the field a problem names."""
    return {
        "env.SETTING": MCP.replace("args: [ARGS]", "args: []").replace(
            "LOG_LEVEL: info", f"SETTING: {json.dumps(value)}"
        ),
        "args[0]": MCP.replace("args: [ARGS]", f"args: [{json.dumps(value)}]"),
    }


@pytest.mark.parametrize("value", [pytest.param(v, id=k) for k, v in LITERAL_CREDENTIALS.items()])
def test_an_mcp_server_refuses_what_the_policy_refuses(tmp_path: Path, value: str) -> None:
    """An ``ASIA`` key id (the run file's rule had no ``ASIA``), ``bearer ...`` in lower case, a key after a
    separator: refused in a stdio server's ``env`` and arguments, as in ``server.env``, the value never shown."""
    assert credential_shape(value, ids_ordinary=True) is not None
    for field, mcp in _mcp_fields(value).items():
        (tmp_path / field).mkdir()
        (problem,) = _problems(tmp_path / field, mcp=mcp)
        assert f": providers[0].{field}: MCP provider 'docs': looks like a secret (the value " in problem, problem
        assert value not in problem


@pytest.mark.parametrize(
    "value", [pytest.param(v, id=k) for k, v in (*ID_LIKE_CREDENTIALS.items(), *NOT_CREDENTIALS.items())]
)
def test_an_mcp_server_keeps_what_the_policy_keeps_where_ids_are_ordinary(tmp_path: Path, value: str) -> None:
    """A git revision or a path holding ``hf_`` on a server's command line or in its environment is kept, as in
    ``server.extra_args`` and ``server.env``."""
    assert credential_shape(value, ids_ordinary=True) is None
    for field, mcp in _mcp_fields(value).items():
        (tmp_path / field).mkdir()
        (provider,) = _resolve(tmp_path / field, mcp=mcp).mcp_providers
        assert value in (*provider.args, *provider.env.values()), field


@pytest.mark.parametrize(
    "value", [pytest.param(v, id=k) for k, v in (*LITERAL_CREDENTIALS.items(), *ID_LIKE_CREDENTIALS.items())]
)
def test_a_shell_variable_the_policy_sees_as_a_key_is_a_secret(value: str) -> None:
    """Whatever its name, a variable of the submitting shell whose value the policy takes for a key is one of the
    run's secrets (kept from a builder script, compared with every captured string, scanned for on the node)."""
    assert credential_shape(value) is not None
    assert secret_names({"SETTING": value, "PATH": "/usr/bin:/bin"}) == {"SETTING"}


@pytest.mark.parametrize("value", [pytest.param(v, id=k) for k, v in NOT_CREDENTIALS.items()])
def test_a_shell_variable_the_policy_keeps_is_no_secret(value: str) -> None:
    assert secret_names({"SETTING": value}) == set()
