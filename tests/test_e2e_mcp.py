"""MCP tools end to end on the local Slurm cluster: an LLM column calls a tool of a remote MCP server (its key by
variable name) and another a tool of a stdio server the client step starts (its token a ``${VAR}`` env value);
the servers log the calls, the rows carry what the tools returned, and no file of the run holds a secret."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from fake_vllm.mcp_server import calls, start_remote, stdio_command
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


def test_tools_of_a_remote_and_a_stdio_mcp_server_reach_the_rows(make_run_files: Any, scan_for_secret: Any) -> None:
    files = make_run_files("mcp", num_records=4, shards=2, buffer_size=2)
    (files.root / "recipe.yaml").write_text(RECIPE)
    remote_log, local_log = files.root / "remote.jsonl", files.root / "local.jsonl"
    command, args = stdio_command("local_lookup", local_log, log_env=["DOCS_TOKEN"])
    assert Path(command).is_absolute() and command == sys.executable  # the nodes share this machine's files
    with start_remote("remote_lookup", remote_log, key_env="SERVER_KEY", env={"SERVER_KEY": REMOTE_KEY}) as remote:
        (files.dd_home / "mcp_providers.yaml").write_text(
            "providers:\n"
            f"- {{name: remote, provider_type: streamable_http, endpoint: '{remote.endpoint}', api_key: MCP_KEY}}\n"
            f"- {{name: local, provider_type: stdio, command: '{command}', args: {args},\n"
            "   env: {DOCS_TOKEN: '${MCP_DOCS_TOKEN}', MODE: e2e}}\n"
        )
        env = {**files.env, "MCP_KEY": REMOTE_KEY, "MCP_DOCS_TOKEN": DOCS_TOKEN}
        submitted = cli_json(
            "submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env, outputs=OUTPUTS
        )
        run_dir = Path(submitted["run_dir"])
        assert calls(remote_log) == []  # submit listed the remote tools, and called none
        final = cli_json("wait", str(run_dir), "--json", env=env, outputs=OUTPUTS)
        assert final["state"] == "succeeded", final
    collected = cli_json("collect", str(run_dir), "--local", "--json", env=env, outputs=OUTPUTS)
    rows = pq.read_table(collected["dataset"]).to_pylist()
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
