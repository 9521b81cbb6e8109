"""Replicas over several nodes, on loopback: leader and followers as separate processes (both engines)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from fake_vllm.testing import (
    EngineName,
    Form,
    ServerStartError,
    child_environment,
    free_port,
    impersonation,
    rank_args,
    start_follower,
    start_joiner,
    start_replica,
    start_server,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
FORMS: list[tuple[EngineName, Form, dict[str, int]]] = [
    ("vllm", "nodes", {"tensor_parallel": 2, "pipeline_parallel": 3}),
    ("vllm", "data-parallel", {"tensor_parallel": 2, "data_parallel": 3}),
    ("sglang", "nodes", {"tensor_parallel": 3, "pipeline_parallel": 1}),
    ("sglang", "nodes", {"tensor_parallel": 3, "data_parallel": 3}),  # --enable-dp-attention
]


def _until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _listening_tcp_ports(pid: int) -> list[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.parametrize(
    ("engine", "form", "sizes"), FORMS, ids=[f"{e}-{f}-{'x'.join(map(str, z.values()))}" for e, f, z in FORMS]
)
def test_leader_is_healthy_only_once_every_follower_joined(
    engine: EngineName, form: Form, sizes: dict[str, int]
) -> None:
    port = free_port()

    def flags(rank: int) -> list[str]:
        return rank_args(engine, form=form, nodes=3, rank=rank, port=port, **sizes)  # type: ignore[arg-type]

    with start_server(args=flags(0), wait="listening", engine=engine) as leader:
        health = f"{leader.root_url}/health"
        assert httpx.get(health).status_code == 503
        with start_follower(args=flags(1), engine=engine) as first:
            _until(lambda: "(1/2 followers)" in leader.log_text(), what="the first follower to join")
            time.sleep(0.3)
            assert httpx.get(health).status_code == 503  # one follower still missing
            assert httpx.post(f"{leader.root_url}/v1/chat/completions", json=CHAT).status_code == 503
            with start_follower(args=flags(2), engine=engine) as second:
                _until(lambda: httpx.get(health).status_code == 200, what="the leader to become healthy")
                assert httpx.post(f"{leader.root_url}/v1/chat/completions", json=CHAT).status_code == 200
                for follower in (first, second):
                    assert follower.proc.poll() is None
                    assert _listening_tcp_ports(follower.proc.pid) == []  # headless: no HTTP
                    assert "joined the leader" in follower.log_text()
        log = leader.log_text()
    assert "waiting for 2 followers" in log
    assert "All 3 nodes joined the rendezvous" in log


@pytest.mark.parametrize(
    ("engine", "form", "sizes"), FORMS, ids=[f"{e}-{f}-{'x'.join(map(str, z.values()))}" for e, f, z in FORMS]
)
def test_a_follower_dying_kills_the_leader_at_once(engine: EngineName, form: Form, sizes: dict[str, int]) -> None:
    with start_replica(nodes=3, form=form, engine=engine, **sizes) as replica:  # type: ignore[arg-type]
        replica.followers[1].proc.kill()
        assert replica.leader.proc.wait(timeout=30) == 1  # the bound only keeps a leader that lives on from hanging
        assert re.search(r"ERROR .* died unexpectedly", replica.leader.log_text())
        survivor = replica.followers[0]
        assert survivor.proc.wait(timeout=5) == 1  # and the leader's death ends the other follower
        assert "closed the connection" in survivor.log_text()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_leader_dying_ends_every_follower(engine: EngineName) -> None:
    with start_replica(nodes=3, engine=engine, tensor_parallel=3) as replica:
        replica.leader.proc.kill()
        for follower in replica.followers:
            assert follower.proc.wait(timeout=5) == 1
            assert "closed the connection (it exited)" in follower.log_text()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        pytest.param(
            {"tensor_parallel": 4}, "tensor_parallel_size=4 but the leader has tensor_parallel_size=2", id="tp"
        ),
        pytest.param({"model": "other"}, "model='other' but the leader has model='m'", id="model"),
        pytest.param({"rank": 1}, "rank 1 joined twice", id="rank-twice"),
    ],
)
def test_a_mismatched_follower_is_refused_and_both_exit(change: dict[str, object], needle: str) -> None:
    port = free_port()
    model = str(change.get("model", "m"))
    tp = int(str(change.get("tensor_parallel", 2)))
    with start_server(args=rank_args("vllm", form="nodes", nodes=2, rank=0, port=port, tensor_parallel=2),
                      wait="listening") as leader:  # fmt: skip
        good = rank_args("vllm", form="nodes", nodes=2, rank=1, port=port, tensor_parallel=2)
        with contextlib.ExitStack() as stack:
            if "rank" in change:
                stack.enter_context(start_follower(args=good))
                _until(lambda: "(1/1 followers)" in leader.log_text(), what="rank 1 to join")
            bad = rank_args("vllm", form="nodes", nodes=2, rank=1, port=port, tensor_parallel=tp)
            follower = stack.enter_context(start_follower(model, args=bad))
            assert follower.proc.wait(timeout=10) == 1
            assert leader.proc.wait(timeout=10) == 1
            assert needle in follower.log_text() and "refused" in follower.log_text()
            assert needle in leader.log_text()


def test_a_taken_rendezvous_port_fails_the_leader_at_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = rank_args("vllm", form="nodes", nodes=2, rank=0, port=port, tensor_parallel=2)
        with pytest.raises(ServerStartError, match="exited with status 1") as error, start_server(args=args):
            pass
    assert "Address already in use" in str(error.value)
    assert f"rendezvous address 127.0.0.1:{port}" in str(error.value)


def test_a_follower_gives_up_after_the_join_timeout() -> None:
    args = rank_args("vllm", form="data-parallel", nodes=2, rank=1, port=free_port(), data_parallel=2)
    with start_follower(args=args, env={"FAKE_VLLM_JOIN_TIMEOUT": "0.5"}) as follower:
        assert follower.proc.wait(timeout=60) == 1  # far below the default join timeout (120 s) it would use else
        log = follower.log_text()
    assert "could not reach the leader" in log and "join timeout (0.5 s" in log


def _serve(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fake_vllm", "serve", "m", "--port", str(free_port()), *args],
        env=child_environment(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "visible"),
    [
        pytest.param(["-tp", "2", "-pp", "2"], "0,1,2", id="one-node-tp-x-pp"),
        pytest.param(["-tp", "2", "-dp", "2"], "0,1,2", id="one-node-tp-x-dp"),
        pytest.param(["-tp", "4", "-pp", "2", "--nnodes", "2", "--node-rank", "1", "--headless"], "0,1,2", id="nodes"),
        pytest.param(["-tp", "2", "-dp", "4", "-dpl", "2", "--headless", "-dpr", "2"], "0,1,2", id="data-parallel"),
    ],
)
def test_fewer_visible_gpus_than_the_ranks_need_is_an_engine_error(args: list[str], visible: str) -> None:
    proc = _serve(args, {"CUDA_VISIBLE_DEVICES": visible})
    assert proc.returncode == 1
    assert "need 4 GPU(s)" in proc.stderr and "shows 3" in proc.stderr
    assert "less than max local gpu count" in proc.stderr


def test_enough_gpus_pass_the_check() -> None:
    with start_server(args=["-tp", "2", "-dp", "2"], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) as server:
        assert httpx.get(f"{server.root_url}/health").status_code == 200


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(
            ["-tp", "2", "--nnodes", "2", "--node-rank", "1"], "run it with --headless", id="follower-not-headless"
        ),
        pytest.param(["--headless"], "headless ranks of a multi-node replica only", id="headless-alone"),
    ],
)
def test_roles_the_stand_in_does_not_model_are_usage_errors(args: list[str], needle: str) -> None:
    proc = _serve(args)
    assert proc.returncode == 2
    assert needle in proc.stderr


def test_world_size_not_divisible_by_nodes_is_refused() -> None:
    proc = _serve(["-tp", "3", "--nnodes", "2"])
    assert proc.returncode == 1
    assert "must be divisible by nnodes (2)" in proc.stderr


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_capacity_is_per_data_parallel_rank(engine: EngineName, tmp_path: Path) -> None:
    """``--max-num-seqs`` / ``--max-running-requests`` N per rank: with DP 2 the replica runs 2N at once."""
    per_rank, dp, latency = 2, 2, 0.6
    flag = "--max-num-seqs" if engine == "vllm" else "--max-running-requests"
    sizes = ["--data-parallel-size", str(dp)] if engine == "vllm" else ["--dp-size", str(dp)]
    request_log = tmp_path / "requests.jsonl"
    args = [*sizes, flag, str(per_rank), "--fake-latency", str(latency), "--fake-request-log", str(request_log)]

    async def burst(base: str, headers: dict[str, str]) -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            calls = [
                client.post(f"{base}/chat/completions", json={**CHAT, "seed": i}, headers=headers) for i in range(6)
            ]
            return [r.status_code for r in await asyncio.gather(*calls)]

    with start_server(args=args, engine=engine, api_key="k") as server:
        assert asyncio.run(burst(server.base_url, server.headers)) == [200] * 6
        assert "capacity=4" in server.log_text()
    entries = [json.loads(line) for line in request_log.read_text().splitlines()]
    admitted = sorted(e["admitted"] for e in entries if e["path"] == "/v1/chat/completions")
    first_wave = [a for a in admitted if a - admitted[0] < latency / 2]
    assert len(first_wave) == per_rank * dp  # 4 ran at once, the other 2 queued


NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # one another user can run (the project's venv may not be readable by it)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_another_user_who_reads_the_command_line_joins_as_rank_1_before_the_real_follower(engine: EngineName) -> None:
    """Issue 37, item 6, at the engine's level: the rendezvous has no secret, as the engines' own (torch's TCP store,
    vLLM's data-parallel handshake) have none. Another user reads the leader's command line (``ps``), joins as rank
    1 first and is counted: the leader serves with a stranger as its second node; the real follower is then
    refused, and the replica dies. Run as ``nobody`` when the tests run as root."""
    port = free_port()
    flags = rank_args(engine, form="nodes", nodes=2, rank=0, port=port, tensor_parallel=2)
    other = {"user": NOBODY, "python": SYSTEM_PYTHON} if os.getuid() == 0 and Path(SYSTEM_PYTHON).exists() else {}
    with start_server(args=flags, wait="listening", engine=engine) as leader:
        argv = Path(f"/proc/{leader.proc.pid}/cmdline").read_bytes().decode().split("\0")  # what ps shows
        with start_joiner("127.0.0.1", port, impersonation(argv), **other) as joiner:  # type: ignore[arg-type]
            assert joiner.said.get("reply") == {"ok": True}, joiner.said
            _until(lambda: httpx.get(f"{leader.root_url}/health").status_code == 200, what="the leader to be healthy")
            assert "node rank 1 joined (1/1 followers)" in leader.log_text()
            assert httpx.post(f"{leader.root_url}/v1/chat/completions", json=CHAT).status_code == 200
            with start_follower(args=rank_args(engine, form="nodes", nodes=2, rank=1, port=port, tensor_parallel=2),
                                engine=engine) as follower:  # fmt: skip
                assert follower.proc.wait(timeout=30) == 1
                assert "refused" in follower.log_text() and "rank 1 joined twice" in follower.log_text()
                assert leader.proc.wait(timeout=30) == 1


def _sglang_follower(port: int, api: int) -> list[str]:
    """An SGLang follower's arguments (node rank 1 of 2) with the leader's ``--host``/``--port`` ``api``."""
    return ["--host", "127.0.0.1", "--port", str(api), *rank_args("sglang", form="nodes", nodes=2, rank=1, port=port,
                                                                     tensor_parallel=2)]  # fmt: skip


def test_an_sglang_follower_serves_a_dummy_health_on_the_leader_port_of_its_own_host() -> None:
    """``--fake-follower-health``: once it joined, an SGLang follower serves ``/health`` on the leader's
    ``--host --port`` on its own host, as SGLang's followers do (``launch_dummy_health_check_server``)."""
    port, api = free_port(), free_port()
    leader_args = rank_args("sglang", form="nodes", nodes=2, rank=0, port=port, tensor_parallel=2)
    with start_server(args=leader_args, wait="listening", engine="sglang") as leader:
        follower_args = _sglang_follower(port, api)
        with start_follower(args=follower_args, engine="sglang", env={"FAKE_VLLM_FOLLOWER_HEALTH": "1"}) as follower:
            _until(lambda: "Dummy health server" in follower.log_text(), what="the follower's health server")
            assert httpx.get(f"http://127.0.0.1:{api}/health").status_code == 200
            assert follower.proc.poll() is None and leader.proc.poll() is None


def test_an_sglang_follower_whose_health_port_is_taken_on_its_host_dies_after_joining() -> None:
    """The collision nobody checked: the port is in use on the follower's host (here the leader's own listener,
    the local cluster's nodes sharing one host), and the follower dies once it joined, as uvicorn's bind failure
    ends SGLang's; without the setting (the default) it never binds it."""
    port = free_port()
    leader_args = rank_args("sglang", form="nodes", nodes=2, rank=0, port=port, tensor_parallel=2)
    with start_server(args=leader_args, wait="listening", engine="sglang") as leader:
        follower_args = _sglang_follower(port, leader.port)
        with start_follower(args=follower_args, engine="sglang", env={"FAKE_VLLM_FOLLOWER_HEALTH": "1"}) as follower:
            assert follower.proc.wait(timeout=30) == 1
            log = follower.log_text()
    assert "joined the leader" in log
    assert f"error while attempting to bind on address ('127.0.0.1', {leader.port}): address already in use" in log
    with start_server(args=leader_args, wait="listening", engine="sglang") as leader:
        follower_args = _sglang_follower(port, leader.port)
        with start_follower(args=follower_args, engine="sglang") as follower:
            _until(lambda: "joined the leader" in follower.log_text(), what="the follower to join")
            assert follower.proc.poll() is None and "Dummy health server" not in follower.log_text()
