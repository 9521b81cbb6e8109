"""The recipe's MCP tools at submit: stdio commands found, and the tools ``allow_tools`` names listed from the real
servers by the profile's ``python_env`` (Data Designer's MCP client there, ``ddslurm-runtime inspect``)."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import (
    INSPECT_VERSION,
    ErrorAnswer,
    ProviderSnapshot,
    SnapshotMCPProvider,
    ToolsAnswer,
    ToolsRequest,
    decode_request,
    encode_message,
)
from ddslurm.launcher import SubmitError, prepare
from ddslurm.launcher.submission._mcp_check import command_problems, dd_check_tools
from ddslurm.launcher.testing import UNIT_RECIPE, accept_recipe, write_runtime_shim, write_unit_run
from ddslurm.providers import Origin, load_recipe
from fake_vllm.mcp_server import calls, start_remote, stdio_command

KEY = "remote-mcp-key-Zq81nVw0aa93Lkq"
OURS = version("ddslurm-runtime")


def _recipe(*configs: dict[str, Any]) -> dict[str, Any]:
    return {"data_designer": {"tool_configs": list(configs), "columns": []}}


def _stdio(name: str, tmp_path: Path, tool: str = "local_lookup") -> SnapshotMCPProvider:
    command, args = stdio_command(tool, tmp_path / f"{name}.jsonl")
    return SnapshotMCPProvider(name=name, provider_type="stdio", command=command, args=tuple(args))


def test_a_stdio_command_not_found_is_refused(tmp_path: Path) -> None:
    missing = SnapshotMCPProvider(name="gone", provider_type="stdio", command="no-such-mcp-server-here")
    absolute = SnapshotMCPProvider(name="abs", provider_type="stdio", command=str(tmp_path / "nope"))
    directory = SnapshotMCPProvider(name="dir", provider_type="stdio", command=str(tmp_path))
    relative = SnapshotMCPProvider(name="rel", provider_type="stdio", command="bin/server")
    found = _stdio("ok", tmp_path)
    on_path = SnapshotMCPProvider(name="py", provider_type="stdio", command=Path(sys.executable).name)
    snapshot = ProviderSnapshot(mcp_providers=(missing, absolute, directory, relative, found, on_path))
    env = {"PATH": str(Path(sys.executable).parent)}
    problems = command_problems(snapshot, env, tmp_path)
    where, node = f"{tmp_path / 'mcp_providers.yaml'}: MCP provider", "the client step starts it on the node"
    assert problems == [
        f"{where} 'gone': command 'no-such-mcp-server-here' is not found on PATH; {node}",
        f"{where} 'abs': command '{tmp_path / 'nope'}' is not an executable file; {node}",
        f"{where} 'dir': command '{tmp_path}' is not an executable file; {node}",
        f"{where} 'rel': command 'bin/server' is a relative path; write an absolute path or a command on PATH",
    ]
    # Checked before any server is asked for its tools.
    recipe = _recipe({"tool_alias": "t", "providers": ["gone"], "allow_tools": ["x"]})
    runtime = tmp_path / "no-python-env" / "bin" / "ddslurm-runtime"  # never asked
    assert dd_check_tools(recipe, Origin(tmp_path / "r.yaml"), snapshot, env, tmp_path, runtime) == problems


def test_allow_tools_are_checked_against_the_servers_tools(tmp_path: Path) -> None:
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(
        "data_designer:\n"
        "  tool_configs:\n"
        "  - tool_alias: both\n"
        "    providers: [local, remote]\n"
        "    allow_tools: [local_lookup, remote_lookup, missing_tool]\n"
        "  - tool_alias: open\n"
        "    providers: [other]\n"
        "  columns: []\n"
    )
    recipe = load_recipe(recipe_path)
    with start_remote("remote_lookup", tmp_path / "remote.jsonl", key_env="K", env={"K": KEY}) as remote:
        snapshot = ProviderSnapshot(
            mcp_providers=(
                _stdio("local", tmp_path),
                SnapshotMCPProvider(
                    name="remote", provider_type="streamable_http", endpoint=remote.endpoint, api_key_env="REMOTE_KEY"
                ),
                _stdio("other", tmp_path, tool="never_listed"),
            )
        )
        env = {**os.environ, "REMOTE_KEY": KEY}
        runtime = write_runtime_shim(tmp_path / "venv")
        problems = dd_check_tools(recipe, Origin(recipe_path), snapshot, env, tmp_path, runtime)
        assert problems == [
            f"{recipe_path}:5:48: data_designer.tool_configs[0].allow_tools[2]: tool 'missing_tool' is not offered "
            "by MCP provider(s) 'local', 'remote' (they offer: local_lookup, remote_lookup)"
        ]
        # The key is the one the server wants, resolved from the variable; listing calls no tool.
        assert calls(tmp_path / "remote.jsonl") == []
        wrong = dd_check_tools(
            recipe, Origin(recipe_path), snapshot, {**env, "REMOTE_KEY": "x" * 20}, tmp_path, runtime
        )
    assert len(wrong) == 1 and "MCP provider 'remote': its tools could not be listed" in wrong[0]
    assert "tool_configs[0].providers" in wrong[0] and "x" * 20 not in wrong[0]


def test_a_recipe_whose_tools_are_all_allowed_connects_to_nothing(tmp_path: Path) -> None:
    unreachable = SnapshotMCPProvider(name="r", provider_type="sse", endpoint="http://127.0.0.1:9/sse")
    recipe = _recipe({"tool_alias": "t", "providers": ["r"]})
    snapshot = ProviderSnapshot(mcp_providers=(unreachable,))
    runtime = tmp_path / "no-python-env" / "bin" / "ddslurm-runtime"  # never asked
    assert dd_check_tools(recipe, Origin(tmp_path / "r.yaml"), snapshot, dict(os.environ), tmp_path, runtime) == []


def test_an_allowed_tool_that_is_offered_passes(tmp_path: Path) -> None:
    recipe = _recipe({"tool_alias": "t", "providers": ["local"], "allow_tools": ["local_lookup"], "timeout_sec": 60})
    snapshot = ProviderSnapshot(mcp_providers=(_stdio("local", tmp_path),))
    runtime = write_runtime_shim(tmp_path / "venv")
    assert dd_check_tools(recipe, Origin(tmp_path / "r.yaml"), snapshot, dict(os.environ), tmp_path, runtime) == []


TOOL_RECIPE = (
    UNIT_RECIPE.replace('prompt: "Say {{ topic }}"}', 'prompt: "Say {{ topic }}", tool_alias: t}')
    + "  tool_configs:\n  - {tool_alias: t, providers: [remote, local], allow_tools: [ALLOWED]}\n"
)


def _tool_run(tmp_path: Path, endpoint: str, allowed: str) -> tuple[Path, Path, dict[str, str]]:
    run, profile, env = write_unit_run(
        tmp_path, "sk-hosted-key-0123456789abcdef", recipe=TOOL_RECIPE.replace("ALLOWED", allowed)
    )
    command, args = stdio_command("local_lookup", tmp_path / "local.jsonl")
    (tmp_path / "dd" / "mcp_providers.yaml").write_text(
        "providers:\n"
        f"- {{name: remote, provider_type: streamable_http, endpoint: '{endpoint}', api_key: REMOTE_KEY}}\n"
        f"- {{name: local, provider_type: stdio, command: '{command}', args: {list(args)}, env: {{T: '${{TOKEN}}'}}}}\n"
        "- {name: unused, provider_type: stdio, command: not-checked}\n"
    )
    return run, profile, {**env, "PATH": os.environ["PATH"], "REMOTE_KEY": KEY, "TOKEN": "stdio-token-PLm02kfj2n4"}


def test_submit_captures_the_tools_providers_and_exports_their_keys_by_name(tmp_path: Path) -> None:
    with start_remote("remote_lookup", tmp_path / "remote.jsonl", key_env="K", env={"K": KEY}) as remote:
        run, profile, env = _tool_run(tmp_path, remote.endpoint, "remote_lookup")
        prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    assert prepared.plan.secret_env == ("HOSTED_KEY", "REMOTE_KEY", "TOKEN")
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    assert [p.name for p in snapshot.mcp_providers] == ["remote", "local"]
    assert snapshot.mcp_providers[1].env_from == {"T": "TOKEN"} and snapshot.mcp_providers[1].env == {}
    assert KEY.encode() not in prepared.snapshot_bytes and b"PLm02kfj2n4" not in prepared.snapshot_bytes


def test_submit_refuses_an_allowed_tool_no_provider_offers_before_writing(tmp_path: Path) -> None:
    with start_remote("remote_lookup", tmp_path / "remote.jsonl", key_env="K", env={"K": KEY}) as remote:
        run, profile, env = _tool_run(tmp_path, remote.endpoint, "web_search")
        with pytest.raises(SubmitError) as caught:
            prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    message = str(caught.value)
    assert "the recipe's MCP tools cannot be used" in message
    assert f"{tmp_path / 'recipe.yaml'}:8:" in message
    assert "data_designer.tool_configs[0].allow_tools[0]: tool 'web_search' is not offered" in message
    assert "(they offer: local_lookup, remote_lookup)" in message
    assert not (tmp_path / "work").exists()


BUILD_WITH_PROVIDERS = """\
import data_designer.config as dd
from data_designer.interface import DataDesigner

LOCAL = dd.LocalStdioMCPProvider(name="local", command=COMMAND, args=ARGS, env={"T": "${TOKEN}"})
REMOTE = dd.MCPProvider(name="remote", endpoint="http://127.0.0.1:9/mcp", api_key=KEY)


def load_config_builder():
    model = dd.ModelConfig(alias="writer", model="m-1", provider="hosted")
    tools = dd.ToolConfig(tool_alias="t", providers=["local", "remote"])
    builder = dd.DataDesignerConfigBuilder(model_configs=[model], tool_configs=[tools])
    builder.add_column(
        dd.SamplerColumnConfig(name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a"]))
    )
    builder.add_column(dd.LLMTextColumnConfig(name="q", model_alias="writer", prompt="Say {{ topic }}", tool_alias="t"))
    return builder


if __name__ == "__main__":
    DataDesigner(mcp_providers=[LOCAL, REMOTE]).create(load_config_builder())
"""


def _builder_tool_run(tmp_path: Path, key: str) -> tuple[Path, Path, dict[str, str]]:
    run, profile, env = write_unit_run(tmp_path, "sk-hosted-key-0123456789abcdef")
    command, args = stdio_command("local_lookup", tmp_path / "local.jsonl")
    script = BUILD_WITH_PROVIDERS.replace("COMMAND", repr(command)).replace("ARGS", repr(list(args)))
    (tmp_path / "build.py").write_text(script.replace("KEY", repr(key)))
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: build.py"))
    return run, profile, {**env, "PATH": os.environ["PATH"], "REMOTE_KEY": KEY, "TOKEN": "stdio-token-PLm02kfj2n4"}


def test_a_builder_scripts_own_mcp_providers_are_captured_by_the_same_rules(tmp_path: Path) -> None:
    """The providers a builder script gives ``DataDesigner(mcp_providers=...)`` in its main block (held at its top
    level) are the ones Data Designer uses when the script runs: captured as those of ``mcp_providers.yaml``,
    keys by variable name."""
    run, profile, env = _builder_tool_run(tmp_path, "REMOTE_KEY")
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    assert [p.name for p in snapshot.mcp_providers] == ["local", "remote"]
    local, remote = snapshot.mcp_providers
    assert local.env_from == {"T": "TOKEN"} and remote.api_key_env == "REMOTE_KEY"
    assert "REMOTE_KEY" in prepared.plan.secret_env and "TOKEN" in prepared.plan.secret_env
    assert b"PLm02kfj2n4" not in prepared.snapshot_bytes


def test_a_literal_key_in_a_builder_scripts_mcp_provider_is_refused_unshown(tmp_path: Path) -> None:
    literal = "sk-literal-mcp-key-9c2Jd81hQ0x"
    run, profile, env = _builder_tool_run(tmp_path, literal)
    with pytest.raises(SubmitError) as caught:
        prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    message = str(caught.value)
    assert f"{tmp_path / 'build.py'}" in message and "api_key" in message, message
    assert literal not in message
    assert not (tmp_path / "work").exists()


def test_a_server_whose_command_line_would_hold_a_secret_is_never_started(tmp_path: Path) -> None:
    """Issue 37: the tool listing starts no process whose command line holds the value of a secret of the shell
    (every user of the submit host reads command lines): checked again where the servers are started, by the one
    check of a captured string, whatever the snapshot."""
    token = "correct-horse-battery-staple"
    real, args = stdio_command("local_lookup", tmp_path / "local.jsonl")
    started = tmp_path / "started"
    command = tmp_path / "server.sh"  # the real server, after it marks that it was started
    command.write_text(f'#!/bin/sh\ntouch {started}\nexec {real} "$@"\n')
    command.chmod(0o755)
    leaky = SnapshotMCPProvider(
        name="leaky", provider_type="stdio", command=str(command), args=(*args, f"--auth={token}"),
        env_from={"T": "DOCS_SESAME"},
    )  # fmt: skip
    snapshot = ProviderSnapshot(mcp_providers=(leaky,))
    env = {**os.environ, "DOCS_SESAME": token}
    recipe = _recipe({"tool_alias": "t", "providers": ["leaky"], "allow_tools": ["local_lookup"]})
    runtime = write_runtime_shim(tmp_path / "venv")
    problems = dd_check_tools(recipe, Origin(tmp_path / "r.yaml"), snapshot, env, tmp_path, runtime)
    assert problems == [
        f"{tmp_path / 'mcp_providers.yaml'}: MCP provider 'leaky': args[{len(args)}] holds the value of "
        "$DOCS_SESAME, a secret (values are not shown); not started: its command line is seen by every user"
    ]
    assert not started.exists()
    # The same server with its token in its environment only is started and listed.
    safe = ProviderSnapshot(mcp_providers=(msgspec.structs.replace(leaky, args=tuple(args)),))
    assert dd_check_tools(recipe, Origin(tmp_path / "r.yaml"), safe, env, tmp_path, runtime) == []
    assert started.exists()


def _python_env(tmp_path: Path, answer: str, code: int = 0) -> Path:
    """A ``python_env`` whose ``ddslurm-runtime`` records how it was asked (arguments, working directory, Data
    Designer's home, the request on its stdin) under ``tmp_path/asked`` and prints ``answer``."""
    asked = tmp_path / "asked"
    asked.mkdir()
    (asked / "answer").write_text(answer)
    command = tmp_path / "other-env" / "bin" / "ddslurm-runtime"
    command.parent.mkdir(parents=True)
    command.write_text(
        "#!/bin/sh\n"
        f"pwd > {asked}/cwd\n"
        f'printf "%s" "$*" > {asked}/argv\n'
        f'printf "%s" "$DATA_DESIGNER_HOME" > {asked}/home\n'
        f"cat > {asked}/request.json\n"
        f"cat {asked}/answer\n"
        "echo 'said on stderr' >&2\n"
        f"exit {code}\n"
    )
    command.chmod(0o755)
    return command


def test_the_tools_are_listed_by_the_python_envs_runtime(tmp_path: Path) -> None:
    """Issue 38: the listing is ``python_env``'s (the Data Designer the client step calls the tools with), never the
    launcher's: its ``ddslurm-runtime inspect`` gets the request on stdin, with Data Designer's home in a scratch
    directory (its working directory) and the ``${VAR}`` variables' names only."""
    token = "stdio-token-PLm02kfj2n4"
    local = SnapshotMCPProvider(
        name="local", provider_type="stdio", command=sys.executable, args=("-m", "server"), env_from={"T": "TOKEN"}
    )
    snapshot = ProviderSnapshot(mcp_providers=(local,))
    env = {"PATH": os.environ["PATH"], "TOKEN": token, "DATA_DESIGNER_HOME": str(tmp_path / "users-home")}
    runtime = _python_env(tmp_path, encode_message(ToolsAnswer(tools={"local": ("only_in_python_env",)})))
    allowed = _recipe({"tool_alias": "t", "providers": ["local"], "allow_tools": ["only_in_python_env"]})
    assert dd_check_tools(allowed, Origin(tmp_path / "r.yaml"), snapshot, env, tmp_path, runtime) == []
    asked = tmp_path / "asked"
    assert (asked / "argv").read_text() == "inspect"
    home = (asked / "home").read_text()
    assert Path(home).name.startswith("ddslurm-mcp-check-") and (asked / "cwd").read_text().strip() == home
    assert not Path(home).exists()  # the scratch home is gone with the check
    request = decode_request((asked / "request.json").read_text())
    assert request == ToolsRequest(snapshot=snapshot, timeout=30.0)
    assert token not in (asked / "request.json").read_text()
    other = _recipe({"tool_alias": "t", "providers": ["local"], "allow_tools": ["local_lookup"]})
    assert dd_check_tools(other, Origin(tmp_path / "r.yaml"), snapshot, env, tmp_path, runtime) == [
        f"{tmp_path / 'r.yaml'}: data_designer.tool_configs[0].allow_tools[0]: tool 'local_lookup' is not offered by "
        "MCP provider(s) 'local' (they offer: only_in_python_env)"
    ]


@pytest.mark.parametrize(
    ("answer", "code", "says"),
    [
        pytest.param(
            encode_message(ToolsAnswer(tools={}, errors={"local": "ConnectError: refused"})), 0,
            "data_designer.tool_configs[0].providers: MCP provider 'local': its tools could not be listed "
            "(ConnectError: refused); is the server up",
            id="the-servers-failure",
        ),
        pytest.param(
            encode_message(ToolsAnswer(tools={})), 0,
            "MCP provider 'local': its tools could not be listed (python_env's answer does not name it)",
            id="not-named",
        ),
        pytest.param(
            encode_message(ErrorAnswer(error="inspecting the recipe failed: KeyError: x")), 0,
            "(the profile's python_env) could not list the MCP tools: inspecting the recipe failed: KeyError: x",
            id="its-error",
        ),
        pytest.param(
            '{"tools": {"local": ["local_lookup"]}, "errors": {}}', 0,
            "(the profile's python_env) could not list the MCP tools: "
            f"{{python_env}}/bin/ddslurm-runtime (the profile's python_env {{python_env}}) answers in a form the "
            "submit host cannot read: the answer says no inspect protocol version (it is older than the versioned "
            f"protocol); this side speaks inspect protocol {INSPECT_VERSION}. The submit host has ddslurm-runtime "
            f"{OURS} (inspect protocol {INSPECT_VERSION}): install the same ddslurm in python_env "
            f"(ddslurm-runtime=={OURS})",
            id="an-older-ddslurm",
        ),
        pytest.param(
            "Traceback: no module named ddslurm", 3,
            "could not run (exit code 3):\nsaid on stderr",
            id="no-answer",
        ),
    ],
)  # fmt: skip
def test_what_the_python_env_could_not_list_is_said(tmp_path: Path, answer: str, code: int, says: str) -> None:
    local = SnapshotMCPProvider(name="local", provider_type="stdio", command=sys.executable)
    runtime = _python_env(tmp_path, answer, code)
    says = says.format(python_env=runtime.parent.parent)
    recipe = _recipe({"tool_alias": "t", "providers": ["local"], "allow_tools": ["local_lookup"]})
    env = {"PATH": os.environ["PATH"]}
    problems = dd_check_tools(
        recipe, Origin(tmp_path / "r.yaml"), ProviderSnapshot(mcp_providers=(local,)), env, tmp_path, runtime
    )
    assert len(problems) == 1 and says in problems[0], problems


def test_a_python_env_that_cannot_be_run_is_said(tmp_path: Path) -> None:
    local = SnapshotMCPProvider(name="local", provider_type="stdio", command=sys.executable)
    recipe = _recipe({"tool_alias": "t", "providers": ["local"], "allow_tools": ["local_lookup"]})
    runtime = tmp_path / "gone" / "bin" / "ddslurm-runtime"
    problems = dd_check_tools(
        recipe, Origin(tmp_path / "r.yaml"), ProviderSnapshot(mcp_providers=(local,)), dict(os.environ), tmp_path,
        runtime,
    )  # fmt: skip
    assert problems == [
        f"cannot run {runtime} (the profile's python_env) to list the MCP tools: "
        f"[Errno 2] No such file or directory: '{runtime}'"
    ]
