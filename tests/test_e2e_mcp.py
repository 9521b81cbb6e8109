"""MCP tools end to end on the local Slurm cluster: an LLM column calls a tool of a remote MCP server (its key by
variable name) and another a tool of a stdio server the client step starts (its token a ``${VAR}`` env value);
the servers log the calls, the rows carry what the tools returned, and no file of the run holds a secret."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from fake_vllm.mcp_server import calls, start_remote, stdio_command
from fake_vllm.testing import set_gate
from tests.e2e import cli_json

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

REMOTE_KEY = "mcp-remote-" + "Zq81nVw0aa93Lkq7c2"
DOCS_TOKEN = "mcp-docs-" + "PLm02kfj2n4vB61x9d"
OUTPUTS: list[str] = []

RECIPE = """\
data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [owls, bats]}}
  - {name: far, column_type: llm-text, model_alias: writer, prompt: "Find {{ topic }}", tool_alias: remote-tools}
  - {name: near, column_type: llm-text, model_alias: writer, prompt: "Seek {{ topic }}", tool_alias: local-tools}
  model_configs:
  - {alias: writer, model: demo/writer-8b, provider: demo-hosted, inference_parameters: {max_tokens: 64}}
  tool_configs:
  - {tool_alias: remote-tools, providers: [remote], allow_tools: [remote_lookup], timeout_sec: 60}
  - {tool_alias: local-tools, providers: [local], timeout_sec: 60}
"""


def _write_mcp_providers(dd_home: Path, endpoint: str, command: str, args: list[str]) -> None:
    """The Data Designer home's MCP providers: the remote server (its key by variable name) and the stdio one (its
    token a ``${VAR}`` env value)."""
    (dd_home / "mcp_providers.yaml").write_text(
        "providers:\n"
        f"- {{name: remote, provider_type: streamable_http, endpoint: '{endpoint}', api_key: MCP_KEY}}\n"
        f"- {{name: local, provider_type: stdio, command: '{command}', args: {args},\n"
        "   env: {DOCS_TOKEN: '${MCP_DOCS_TOKEN}', MODE: e2e}}\n"
    )


def test_tools_of_a_remote_and_a_stdio_mcp_server_reach_the_rows(make_run_files: Any, scan_for_secret: Any) -> None:
    files = make_run_files("mcp", num_records=4, shards=2, buffer_size=2)
    (files.root / "recipe.yaml").write_text(RECIPE)
    remote_log, local_log = files.root / "remote.jsonl", files.root / "local.jsonl"
    command, args = stdio_command("local_lookup", local_log, log_env=["DOCS_TOKEN"])
    assert Path(command).is_absolute() and command == sys.executable  # the nodes share this machine's files
    with start_remote("remote_lookup", remote_log, key_env="SERVER_KEY", env={"SERVER_KEY": REMOTE_KEY}) as remote:
        _write_mcp_providers(files.dd_home, remote.endpoint, command, args)
        env = {**files.env, "MCP_KEY": REMOTE_KEY, "MCP_DOCS_TOKEN": DOCS_TOKEN}
        submitted = cli_json(
            "submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env, outputs=OUTPUTS
        )
        run_dir = Path(submitted["run_dir"])
        assert calls(remote_log) == []  # submit listed the remote tools, and called none
        final = cli_json("wait", str(run_dir), "--json", env=env, outputs=OUTPUTS)
        assert final["state"] == "succeeded", final
    rows = pq.read_table(_collected(run_dir, env)).to_pylist()
    assert len(rows) == 4

    for row in rows:
        assert row["far"] == f"Tool result: remote_lookup says: Find {row['topic']}"
        assert row["near"] == f"Tool result: local_lookup says: Seek {row['topic']}"
    assert sorted(c["arguments"]["term"] for c in calls(remote_log)) == sorted(f"Find {r['topic']}" for r in rows)
    local = calls(local_log)
    assert sorted(c["arguments"]["term"] for c in local) == sorted(f"Seek {r['topic']}" for r in rows)
    # The stdio server, started by the client step on the node, got the token's value from that step's environment.
    assert {c["env_sha256"]["DOCS_TOKEN"] for c in local} == {hashlib.sha256(DOCS_TOKEN.encode()).hexdigest()}

    snapshot = (run_dir / "inputs" / "snapshot.json").read_text()
    assert '"api_key_env": "MCP_KEY"' in snapshot and '"DOCS_TOKEN": "MCP_DOCS_TOKEN"' in snapshot
    for secret in (REMOTE_KEY, DOCS_TOKEN, env["DEMO_HOSTED_API_KEY"]):
        assert scan_for_secret(run_dir, secret) == [], secret[:4]
        assert scan_for_secret(files.root, secret) == [], secret[:4]
        assert not any(secret in text for text in OUTPUTS)


MIXED_TOOLS_RECIPE = """\
data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [owls, bats]}}
  - {name: far, column_type: llm-text, model_alias: generator, prompt: "Find {{ topic }}", tool_alias: remote-tools}
  - {name: near, column_type: llm-text, model_alias: judge, prompt: "Seek {{ topic }}", tool_alias: local-tools}
  model_configs:
  - {alias: generator, model: qwen3-8b, provider: local, inference_parameters: {max_tokens: 64}}
  - {alias: judge, model: demo/judge-70b, provider: demo-hosted, inference_parameters: {max_tokens: 64}}
  tool_configs:
  - {tool_alias: remote-tools, providers: [remote], allow_tools: [remote_lookup], timeout_sec: 60}
  - {tool_alias: local-tools, providers: [local], timeout_sec: 60}
"""

EVERY_COMMAND_LINE = r"""
import json, pathlib
lines = []
for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
    try:
        lines.append(cmdline.read_bytes().decode(errors="replace"))
    except OSError:
        pass
print(json.dumps(lines))
"""


def test_a_mixed_run_with_mcp_tools_shows_no_key_to_another_user_on_any_command_line_or_in_any_file(
    make_run_files: Any, scan_for_secret: Any, tmp_path: Path
) -> None:
    """Issue 37: a mixed run (a local generator behind its proxy, a hosted judge behind the client's gate) whose
    columns call a remote and a stdio MCP server's tools. Held while every process of it is up (the hosted key's
    stand-in holds its answers once the first batch is on disk: servers, proxy, client, gate and the stdio server
    are all running), another user (``nobody``) reads every command line of the machine: none holds the hosted key,
    the MCP keys or any server token of the run; after it, no file the run left holds any of them."""
    from conftest import hosted_stand_in
    from tests.e2e import as_nobody, generator, until

    gate = tmp_path / "gate"
    set_gate(gate, "")
    with hosted_stand_in(tmp_path, "--fake-gate", str(gate)) as hosted:
        files = make_run_files("mixed-mcp", num_records=4, shards=1, buffer_size=2,
                               extra_run=generator(replicas=1) + "stages: single\n")  # fmt: skip
        (files.root / "recipe.yaml").write_text(MIXED_TOOLS_RECIPE)
        (files.dd_home / "model_providers.yaml").write_text(
            f"providers:\n- {{name: demo-hosted, endpoint: '{hosted.base_url}', api_key: DEMO_HOSTED_API_KEY}}\n"
        )
        remote_log, local_log = files.root / "remote.jsonl", files.root / "local.jsonl"
        command, args = stdio_command("local_lookup", local_log, log_env=["DOCS_TOKEN"])
        with start_remote("remote_lookup", remote_log, key_env="SERVER_KEY", env={"SERVER_KEY": REMOTE_KEY}) as remote:
            _write_mcp_providers(files.dd_home, remote.endpoint, command, args)
            env = {**files.env, "DEMO_HOSTED_API_KEY": hosted.api_key, "MCP_KEY": REMOTE_KEY,
                   "MCP_DOCS_TOKEN": DOCS_TOKEN}  # fmt: skip
            submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env,
                                 outputs=OUTPUTS)  # fmt: skip
            run_dir = Path(submitted["run_dir"])
            try:
                until(lambda: _rows_on_disk(run_dir) > 0, 300, "the first batch on disk")
                set_gate(gate, "hold")
                until(lambda: calls(local_log), 60, "the stdio MCP server's first call")
                tokens = _server_tokens(run_dir)
                assert any(k.startswith("VLLM_API_KEY@") for k in tokens), tokens.keys()  # the server's token
                seen = json.loads(as_nobody(EVERY_COMMAND_LINE))
            finally:
                set_gate(gate, "")
            final = cli_json("wait", str(run_dir), "--json", env=env, outputs=OUTPUTS)
        assert final["state"] == "succeeded", final
    secrets = {"hosted": hosted.api_key, "remote": REMOTE_KEY, "docs": DOCS_TOKEN, **tokens}
    assert any(str(run_dir) in line for line in seen)  # nobody did see the run's processes
    for name, secret in secrets.items():
        assert not any(secret in line for line in seen), name
        assert scan_for_secret(run_dir, secret) == [], name
        assert scan_for_secret(files.root, secret) == [], name
        assert not any(secret in text for text in OUTPUTS), name
    rows = pq.read_table(_collected(run_dir, env)).to_pylist()
    assert len(rows) == 4 and all(r["near"] == f"Tool result: local_lookup says: Seek {r['topic']}" for r in rows)


def _rows_on_disk(run_dir: Path) -> int:
    """The most rows any attempt's progress file says are on disk."""
    rows = 0
    for progress in run_dir.glob("shards/*/attempts/*/progress.json"):
        try:
            rows = max(rows, int(json.loads(progress.read_text()).get("rows", 0)))
        except (OSError, ValueError):
            continue  # being replaced
    return rows


def _collected(run_dir: Path, env: dict[str, str]) -> Path:
    """The run collected in this process (``collect --local``): its dataset."""
    return Path(cli_json("collect", str(run_dir), "--local", "--json", env=env, outputs=OUTPUTS)["dataset"])


def _server_tokens(run_dir: Path) -> dict[str, str]:
    """The token of every process of the run that holds one in its environment (the servers' ``VLLM_API_KEY``,
    the client's ``DDSLURM_LOCAL_TOKEN``), read as root: what no command line may show."""
    import contextlib

    from tests.e2e import processes

    found = {}
    for pid, argv in processes():
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            values = dict(e.decode(errors="replace").partition("=")[::2] for e in environ)
            if not any(str(run_dir) in v for v in values.values()) and str(run_dir) not in " ".join(argv):
                continue
            for name in ("VLLM_API_KEY", "DDSLURM_LOCAL_TOKEN"):
                if values.get(name):
                    found[f"{name}@{pid}"] = values[name]
    return found
