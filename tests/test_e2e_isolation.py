"""Isolation of an attempt's servers on a shared node, and secrets the model servers need.

- Every attempt's vLLM servers and proxies require its own random token: a request without it (another user's
  job on the node) gets 401. Only the steps' environments hold the token: no command line, no file of the run.
- The replicas listen on Unix-domain sockets in an owner-only directory (another user cannot connect); the proxy
  is the one TCP listener, and it wants the token on every route, vLLM's unauthenticated ones too.
- ``server.env`` refuses literal secrets; ``server.env_from`` passes a variable of the submitting shell (a gated
  model's ``HF_TOKEN``) by name to the server steps only (never the proxy or the client), and into no file.

The first tests run the submit side only (plan, snapshot, sbatch's export list); the last one is a mixed run on
the local Slurm cluster, checked from outside while it runs.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from ddslurm.config import Plan, RunLayout, SchedulerLimits, read_json
from ddslurm.launcher import prepare, write_run_dir
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.submission._arrays import submit_shards
from ddslurm.launcher.testing import InProcessHost
from tests.e2e import MIXED_RECIPE, as_nobody, processes, run_cli, vllm_stand_in

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""


def _deployment(*, replicas: int = 2, latency: str = "0.02", env_from: str = "[HF_TOKEN]", env: str = "") -> str:
    return (
        "deployments:\n  - model_alias: generator\n    model: Qwen/Qwen3-8B\n    served_model_name: qwen3-8b\n"
        f"    replicas: {replicas}\n    tensor_parallel: 1\n    server:\n      cpus: 1\n      startup_timeout: 120\n"
        f"      env: {{FAKE_VLLM_LATENCY: '{latency}'{env}}}\n      env_from: {env_from}\n"
        "stages: single\n"  # the client, servers and proxy of one allocation (the CPU stage has no servers)
    )


class RecordingSlurm(Slurm):
    """sbatch records what it was asked to export instead of submitting."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[tuple[str, ...]] = []

    def max_array_size(self) -> int:
        return 1001

    def limits(self, **_: Any) -> SchedulerLimits:
        return SchedulerLimits(1001)  # no scheduler asked: these tests run without a cluster

    def sbatch(self, script: str, *, export: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        self.exports.append(tuple(export))
        return str(100 + len(self.exports))


# --- the submit side ----------------------------------------------------------------------------------------


def test_server_env_from_is_planned_by_name_and_exported_only_by_name(make_run_files: Any) -> None:
    hf_value = "hf_" + secrets.token_hex(16)
    files = make_run_files("plan", num_records=4, shards=1, recipe=MIXED_RECIPE, extra_run=_deployment())
    env = {**files.env, "HF_TOKEN": hf_value}
    prepared = prepare(files.run_file, files.profile, env, datetime.now(UTC), host=HOST)
    plan = prepared.plan
    assert plan.server_secret_env == ("HF_TOKEN",)
    assert plan.serving is not None and plan.serving.deployments[0].env_from == ("HF_TOKEN",)
    # The hosted key is the client's; the local provider's key variable is the attempt's token, made on the node
    # (the submitting shell never has it, so it is neither required nor exported).
    assert plan.secret_env == ("DEMO_HOSTED_API_KEY",)
    local = [p for p in json.loads(prepared.snapshot_bytes)["providers"] if p["local"]]
    assert [p["api_key_env"] for p in local] == ["DDSLURM_LOCAL_TOKEN"]
    write_run_dir(prepared)
    slurm = RecordingSlurm()
    submit_shards(prepared.layout, plan, [0], slurm, env, datetime.now(UTC))
    assert slurm.exports == [("DEMO_HOSTED_API_KEY", "HF_TOKEN")]
    assert read_json(prepared.layout.plan, Plan).server_secret_env == ("HF_TOKEN",)
    leaks = [p for p in prepared.layout.root.rglob("*") if p.is_file() and hf_value.encode() in p.read_bytes()]
    assert leaks == []


def test_submit_refuses_a_server_variable_unset_in_the_shell(make_run_files: Any) -> None:
    files = make_run_files("unset", num_records=4, shards=1, recipe=MIXED_RECIPE, extra_run=_deployment())
    env = {k: v for k, v in files.env.items() if k != "HF_TOKEN"}
    prepared = prepare(files.run_file, files.profile, env, datetime.now(UTC), host=HOST)
    write_run_dir(prepared)
    slurm = RecordingSlurm()
    with pytest.raises(SubmitError, match=r"HF_TOKEN named by server\.env_from are unset"):
        submit_shards(prepared.layout, prepared.plan, [0], slurm, env, datetime.now(UTC))
    assert slurm.exports == []


def test_a_literal_secret_in_server_env_is_refused_before_anything_is_written(make_run_files: Any) -> None:
    hf_value = "hf_" + secrets.token_hex(16)
    extra = _deployment(env_from="[]", env=f", HF_TOKEN: {hf_value}")
    files = make_run_files("literal", num_records=4, shards=1, recipe=MIXED_RECIPE, extra_run=extra)
    done = run_cli("submit", str(files.run_file), "--profile", str(files.profile), env=files.env, timeout=120)
    assert done.returncode != 0
    line = files.run_file.read_text().splitlines().index("    server:") + 1
    where = f"{files.run_file}:{line}:5: deployments[0].server: env.HF_TOKEN: looks like a secret"
    assert where in done.stderr and "server.env_from" in done.stderr
    assert hf_value not in done.stdout + done.stderr
    assert not files.workspace.exists() or not any(files.workspace.rglob("*"))


# --- on the local cluster -----------------------------------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(p.split("=", 1) for p in pairs if "=" in p)


CONNECT = """
import socket, sys
sock = socket.socket(socket.AF_UNIX)
try:
    sock.connect(sys.argv[1]); print("connected")
except OSError as exc:
    print(exc.strerror)
"""


def _find(what: str, match: Any, timeout: float = 60) -> int:
    """The pid of the one process (never an ``srun`` that started it) whose argv ``match`` accepts."""
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid, argv in processes() if argv and Path(argv[0]).name != "srun" and match(argv)]
        if len(found) == 1:
            return found[0]
        assert time.monotonic() < deadline, f"{what}: {len(found)} processes"
        time.sleep(0.1)


@pytest.mark.slurm
@pytest.mark.dd
def test_a_mixed_run_serves_only_requests_with_the_attempts_token(
    make_run_files: Any, tmp_path: Path, scan_for_secret: Any
) -> None:
    hf_value = "hf_" + secrets.token_hex(16)  # planted: the servers must get it, nothing else may
    files = make_run_files(
        "isolated",
        num_records=12,
        shards=1,
        buffer_size=6,
        recipe=MIXED_RECIPE,
        extra_run=_deployment(latency="3"),  # slow answers keep the attempt alive while it is probed
        vllm_executable=vllm_stand_in(tmp_path, record_env=True),
    )
    env = {**files.env, "HF_TOKEN": hf_value}
    done = run_cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = Path(json.loads(done.stdout)["run_dir"])
    attempts = RunLayout(run_dir).shard(0).attempts
    deadline = time.monotonic() + 180
    while not list(attempts.glob("attempt-*/endpoints.json")):
        assert time.monotonic() < deadline, "the attempt never got its endpoints"
        time.sleep(0.2)
    [attempt] = list(attempts.glob("attempt-*"))
    serving = json.loads((attempt / "serving.json").read_text())
    sockets = [Path(r["socket"]) for r in serving["replicas"]]
    [proxy] = [url.removesuffix("/v1") for url in json.loads((attempt / "endpoints.json").read_text()).values()]
    assert len(sockets) == 2 and all(r["port"] is None for r in serving["replicas"])

    # The replicas listen on Unix-domain sockets in a directory only this user can enter: another user on the node
    # cannot even connect (vLLM serves /invocations, /tokenize, /pooling... without its API key).
    (directory,) = {path.parent for path in sockets}
    assert directory.stat().st_mode & 0o777 == 0o700 and directory.stat().st_uid == os.getuid()
    for path in sockets:
        assert as_nobody(CONNECT, str(path)) == "Permission denied"
    # What another user's job could do at the proxy, the only TCP listener: without the token, nothing but /health
    # answers, on vLLM's unauthenticated routes too.
    chat = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    for headers in ({}, {"Authorization": "Bearer guessed"}):
        assert httpx.get(f"{proxy}/v1/models", headers=headers, timeout=10).status_code == 401
        assert httpx.post(f"{proxy}/v1/chat/completions", json=chat, headers=headers, timeout=10).status_code == 401
        for route in ("/invocations", "/tokenize", "/pooling", "/score"):
            assert httpx.post(f"{proxy}{route}", json=chat, headers=headers, timeout=10).status_code == 401, route
    assert httpx.get(f"{proxy}/health", timeout=10).status_code == 200
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sockets[0]))) as owner:  # the owner reaches a replica
        assert owner.post("http://localhost/tokenize", json={"prompt": "hi"}, timeout=10).status_code == 200

    # The token, from a server step's environment (readable by the job's owner only).
    where = str(sockets[0])
    server_pid = _find("server", lambda a: "serve" in a and "--uds" in a and a[a.index("--uds") + 1] == where)
    server_env = _environ(server_pid)
    token = server_env["VLLM_API_KEY"]
    assert len(token) >= 32 and server_env["HF_TOKEN"] == hf_value
    assert "DEMO_HOSTED_API_KEY" not in server_env and "DDSLURM_LOCAL_TOKEN" not in server_env
    good = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{proxy}/v1/models", headers=good, timeout=10).status_code == 200
    assert httpx.post(f"{proxy}/tokenize", json={"prompt": "hi"}, headers=good, timeout=10).status_code == 200

    # The proxy holds the token but neither the server-only variable nor the hosted key; the client holds the
    # token as the local provider's key and the hosted key, never the server-only variable.
    proxy_pid = _find("proxy", lambda a: "proxy" in a and "--listen" in a and any(str(run_dir) in x for x in a))
    proxy_env = _environ(proxy_pid)
    assert proxy_env["VLLM_API_KEY"] == token
    assert not {"HF_TOKEN", "DEMO_HOSTED_API_KEY", "DDSLURM_LOCAL_TOKEN"} & set(proxy_env)
    client_pid = _find("client", lambda a: "client" in a and "--run-dir" in a and str(run_dir) in a)
    client_env = _environ(client_pid)
    assert (
        client_env["DDSLURM_LOCAL_TOKEN"] == token and client_env["DEMO_HOSTED_API_KEY"] == env["DEMO_HOSTED_API_KEY"]
    )
    assert "HF_TOKEN" not in client_env and "VLLM_API_KEY" not in client_env
    # No command line on the node shows the token or the server-only value (`ps` shows them to every user).
    for pid, argv in processes():
        assert token not in " ".join(argv) and hf_value not in " ".join(argv), (pid, argv)

    final = run_cli("wait", str(run_dir), "--json", env=env, timeout=400)
    assert json.loads(final.stdout)["state"] == "succeeded", (attempt / "client.out").read_text()[-3000:]
    # Every generator request the replicas served came with the token.
    served = [json.loads(line) for f in tmp_path.glob("requests-*.jsonl") for line in f.read_text().splitlines()]
    chats = [r for r in served if r["path"] == "/v1/chat/completions"]
    assert sum(r["authorized"] for r in chats) >= 12
    assert all(r["status"] == 401 for r in chats if not r["authorized"])  # only this test's own probes
    # Once the allocation is torn down, no file the run left holds the token or the server-only value.
    deadline = time.monotonic() + 180
    while "proxy.stopped" not in (attempt / "proxy-generator.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    for secret in (token, hf_value):
        assert scan_for_secret(files.root, secret) == []
