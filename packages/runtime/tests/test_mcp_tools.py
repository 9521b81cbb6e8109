"""``ddslurm-runtime inspect``'s ``tools`` action, as the launcher asks it at submit: the tools each MCP provider
offers, listed by this environment's Data Designer (its own MCP client) from real servers, with the keys and
``${VAR}`` values of the process's environment; what could not be listed, said per provider."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import ProviderSnapshot, SnapshotMCPProvider, ToolsAnswer, ToolsRequest, encode_message
from ddslurm.runtime import engine_environment
from fake_vllm.mcp_server import calls, start_remote, stdio_command

pytestmark = [pytest.mark.dd]

REMOTE_KEY = "remote-mcp-key-Q81nVw0aa93Lkq77"
STDIO_TOKEN = "stdio-token-PLm02kfj2n4vB61x"


def _inspect(request: ToolsRequest, env: dict[str, str], cwd: Path) -> ToolsAnswer:
    runtime = Path(sys.executable).parent / "ddslurm-runtime"
    done = subprocess.run(
        [str(runtime), "inspect"], input=encode_message(request), capture_output=True, text=True, env=env, cwd=cwd,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return msgspec.json.decode(done.stdout, type=ToolsAnswer)


def test_the_tools_action_lists_each_providers_tools_with_this_environments_keys(tmp_path: Path) -> None:
    local_command, local_args = stdio_command("local_lookup", tmp_path / "local.jsonl")
    seen = tmp_path / "token.sha256"
    server = tmp_path / "server.sh"  # the real stdio server, after it records what its T holds (hashed)
    server.write_text(f'#!/bin/sh\nprintf "%s" "$T" | sha256sum | cut -d" " -f1 > {seen}\nexec {local_command} "$@"\n')
    server.chmod(0o755)
    with start_remote("remote_lookup", tmp_path / "remote.jsonl", key_env="K", env={"K": REMOTE_KEY}) as remote:
        snapshot = ProviderSnapshot(
            mcp_providers=(
                SnapshotMCPProvider(
                    name="local", provider_type="stdio", command=str(server), args=tuple(local_args),
                    env_from={"T": "DOCS_TOKEN"},
                ),
                SnapshotMCPProvider(
                    name="remote", provider_type="streamable_http", endpoint=remote.endpoint, api_key_env="REMOTE_KEY"
                ),
                SnapshotMCPProvider(
                    name="wrong-key", provider_type="streamable_http", endpoint=remote.endpoint,
                    api_key_env="OTHER_KEY",
                ),
            )
        )  # fmt: skip
        request = ToolsRequest(snapshot=snapshot, timeout=30)
        env = {
            "PATH": os.environ["PATH"],
            "REMOTE_KEY": REMOTE_KEY,
            "OTHER_KEY": "not-the-servers-key-000000",
            "DOCS_TOKEN": STDIO_TOKEN,
            **engine_environment(tmp_path / "home"),
        }
        answer = _inspect(request, env, tmp_path)
    assert answer.tools == {"local": ("local_lookup",), "remote": ("remote_lookup",)}
    assert list(answer.errors) == ["wrong-key"]
    assert REMOTE_KEY not in encode_message(answer) and "not-the-servers-key" not in encode_message(answer)
    # The stdio server got its ${VAR} value in its environment; listing called no tool.
    assert seen.read_text().strip() == hashlib.sha256(STDIO_TOKEN.encode()).hexdigest()
    assert calls(tmp_path / "local.jsonl") == [] and calls(tmp_path / "remote.jsonl") == []


def test_a_server_that_cannot_be_reached_is_said_and_the_others_still_listed(tmp_path: Path) -> None:
    command, args = stdio_command("local_lookup", tmp_path / "local.jsonl")
    snapshot = ProviderSnapshot(
        mcp_providers=(
            SnapshotMCPProvider(name="broken", provider_type="stdio", command="/bin/false"),
            SnapshotMCPProvider(name="down", provider_type="sse", endpoint="http://127.0.0.1:9/sse"),
            SnapshotMCPProvider(name="local", provider_type="stdio", command=command, args=tuple(args)),
        )
    )
    request = ToolsRequest(snapshot=snapshot, timeout=30)
    env = {"PATH": os.environ["PATH"], **engine_environment(tmp_path / "home")}
    answer = _inspect(request, env, tmp_path)
    assert answer.tools == {"local": ("local_lookup",)}
    errors = answer.errors
    assert sorted(errors) == ["broken", "down"] and errors["broken"]
    assert errors["down"] == "ConnectError: All connection attempts failed"  # the error, not the client's task group
