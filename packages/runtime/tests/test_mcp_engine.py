"""MCP tools on the node: the real engine calls a remote (keyed) and a stdio MCP server built from the snapshot,
against the vLLM stand-in, and the rows carry what the tools returned."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddslurm.config import ProviderSnapshot, SnapshotMCPProvider, SnapshotModel, SnapshotProvider, encode
from ddslurm.runtime.testing import script_answer
from fake_vllm.mcp_server import calls, start_remote, stdio_command
from fake_vllm.testing import start_server

pytestmark = [pytest.mark.dd]

MODEL_KEY = "sk-model-" + "7f3a9c0d1e2b5548aa01"
REMOTE_KEY = "remote-mcp-key-Q81nVw0aa93Lkq77"
STDIO_TOKEN = "stdio-token-PLm02kfj2n4vB61x"

SCRIPT = """
import json, os, sys
from pathlib import Path
import msgspec
from ddslurm.config import ProviderSnapshot
from ddslurm.runtime._engine import EngineRequest, engine_environment, run_engine

tmp, recipe = Path(sys.argv[1]), json.loads(sys.argv[2])
snapshot = msgspec.json.decode(sys.argv[3], type=ProviderSnapshot)
os.environ.update(engine_environment(tmp / "home"))
result = run_engine(EngineRequest(
    recipe=recipe, snapshot=snapshot, endpoints={}, artifact_path=tmp / "out", scratch_home=tmp / "home",
    dataset_name="d", num_records=4, buffer_size=4, serving=None,
))
print(json.dumps({"rows": result.rows, "dir": str(result.dataset_dir)}))
"""

RECIPE = {
    "data_designer": {
        "columns": [
            {
                "name": "topic",
                "column_type": "sampler",
                "sampler_type": "category",
                "params": {"sampler_type": "category", "values": ["owls", "bats"]},
            },
            {"name": "far", "column_type": "llm-text", "model_alias": "writer", "prompt": "Find {{ topic }}",
             "tool_alias": "remote-tools"},
            {"name": "near", "column_type": "llm-text", "model_alias": "writer", "prompt": "Seek {{ topic }}",
             "tool_alias": "local-tools"},
        ],
        "model_configs": [{"alias": "writer", "model": "demo/writer-8b", "provider": "hosted"}],
        "tool_configs": [
            {"tool_alias": "remote-tools", "providers": ["remote"], "allow_tools": ["remote_lookup"]},
            {"tool_alias": "local-tools", "providers": ["local"], "timeout_sec": 60},
        ],
    }
}  # fmt: skip


def test_the_engine_calls_remote_and_stdio_tools_from_the_snapshot(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    remote_log, local_log = tmp_path / "remote.jsonl", tmp_path / "local.jsonl"
    command, args = stdio_command("local_lookup", local_log, log_env=["DOCS_TOKEN"])
    with (
        start_server("demo", args=["--served-model-name", "demo/writer-8b"], api_key=MODEL_KEY) as model,
        start_remote("remote_lookup", remote_log, key_env="SERVER_KEY", env={"SERVER_KEY": REMOTE_KEY}) as remote,
    ):
        snapshot = ProviderSnapshot(
            providers=(SnapshotProvider(name="hosted", endpoint=model.base_url, api_key_env="HOSTED_KEY"),),
            models=(SnapshotModel(alias="writer", model="demo/writer-8b", provider="hosted", skip_health_check=True),),
            mcp_providers=(
                SnapshotMCPProvider(
                    name="remote", provider_type="streamable_http", endpoint=remote.endpoint, api_key_env="REMOTE_KEY"
                ),
                SnapshotMCPProvider(
                    name="local",
                    provider_type="stdio",
                    command=command,
                    args=tuple(args),
                    env={"MODE": "test"},
                    env_from={"DOCS_TOKEN": "NODE_DOCS_TOKEN"},
                ),
            ),
        )
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "HOSTED_KEY": MODEL_KEY,
            "REMOTE_KEY": REMOTE_KEY,
            "NODE_DOCS_TOKEN": STDIO_TOKEN,
        }
        result = script_answer(SCRIPT, str(tmp_path), json.dumps(RECIPE), encode(snapshot).decode(), env=env)
    rows = pq.read_table(Path(result["dir"]) / "parquet-files").to_pylist()
    assert result["rows"] == len(rows) == 4
    for row in rows:
        assert row["far"] == f"Tool result: remote_lookup says: Find {row['topic']}"
        assert row["near"] == f"Tool result: local_lookup says: Seek {row['topic']}"
    assert sorted(c["arguments"]["term"] for c in calls(remote_log)) == sorted(f"Find {r['topic']}" for r in rows)
    local = calls(local_log)
    assert len(local) == 4
    # The stdio server got the ${VAR} value from the client's environment, under its own name.
    assert {c["env_sha256"]["DOCS_TOKEN"] for c in local} == {hashlib.sha256(STDIO_TOKEN.encode()).hexdigest()}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert REMOTE_KEY.encode() not in data and STDIO_TOKEN.encode() not in data, path


def test_a_remote_server_refuses_a_wrong_key(tmp_path: Path) -> None:
    """The test server's key check is real: Data Designer's client with another key lists nothing."""
    script = (
        "import sys\nfrom data_designer.config import MCPProvider\n"
        "from data_designer.engine.mcp.io import list_tool_names\n"
        "p = MCPProvider(name='r', endpoint=sys.argv[1], api_key=sys.argv[2], provider_type='streamable_http')\n"
        "try:\n    print(list_tool_names(p, timeout_sec=15))\nexcept BaseException as e:\n    print('refused')\n"
        "import os; sys.stdout.flush(); os._exit(0)\n"
    )
    with start_remote("t", tmp_path / "log.jsonl", key_env="K", env={"K": REMOTE_KEY}) as remote:
        answers = [
            subprocess.run(
                [sys.executable, "-c", script, remote.endpoint, key],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "DATA_DESIGNER_HOME": str(tmp_path / "home")},
                check=False,
            ).stdout.strip()
            for key in (REMOTE_KEY, "another-key-of-some-length")
        ]
    assert answers == ["['t']", "refused"]
