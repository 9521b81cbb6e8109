"""The server as a process (through fake_vllm.testing): start-up, health, crash, concurrency, env injection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fake_vllm.testing import ServerStartError, free_port, set_gate, start_server

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _gauge(text: str, name: str) -> float:
    found = re.search(rf'^{re.escape(name)}{{[^}}]*model_name="m"[^}}]*}} (\S+)$', text, re.MULTILINE)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


def test_health_is_503_during_startup_delay_then_200() -> None:
    with start_server(args=["--fake-startup-delay", "1.0"], wait="listening") as server:
        assert httpx.get(f"{server.root_url}/health").status_code == 503
        assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT).status_code == 503
        deadline = time.monotonic() + 60  # a bound on the wait for 200, not a measured time
        while httpx.get(f"{server.root_url}/health").status_code != 200:
            assert time.monotonic() < deadline, "/health never turned 200"
            time.sleep(0.05)
        assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT).status_code == 200
        log = server.log_text()
    assert "vLLM API server version fake-vllm" in log
    assert "Model loading took" in log


def test_models_and_deterministic_chat_across_processes() -> None:
    body = {**CHAT, "model": "served", "temperature": 0.3, "max_tokens": 64}
    contents = []
    for _ in range(2):
        with start_server("org/weights", args=["--served-model-name", "served", "--dtype", "auto"]) as server:
            assert server.base_url.endswith("/v1")
            models = httpx.get(f"{server.base_url}/models").json()
            assert [m["id"] for m in models["data"]] == ["served"]
            reply = httpx.post(f"{server.base_url}/chat/completions", json=body).json()
            contents.append(reply["choices"][0]["message"]["content"])
    assert contents[0] == contents[1]


def test_api_key_and_request_log_never_hold_the_key(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    key = "sk-very-secret-value"
    with start_server(api_key=key, args=["--fake-request-log", str(log_path)]) as server:
        assert key.encode() not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()  # by environment
        assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT).status_code == 401
        ok = httpx.post(f"{server.base_url}/chat/completions", json=CHAT, headers=server.headers)
        assert ok.status_code == 200
        assert httpx.get(f"{server.root_url}/metrics").status_code == 200
        server_log = server.log_text()
    entries = [json.loads(line) for line in log_path.read_text().splitlines()]
    chat = [(e["status"], e["authorized"]) for e in entries if e["path"] == "/v1/chat/completions"]
    assert chat == [(401, False), (200, True)]
    assert key not in log_path.read_text()
    assert key not in server_log
    assert "api_key_required=yes" in server_log


def test_vllm_api_key_env_and_fake_env_injection() -> None:
    env = {"VLLM_API_KEY": "k1", "FAKE_VLLM_ERROR_RATE": "1"}
    with start_server(env=env) as server:
        assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT).status_code == 401
        response = httpx.post(f"{server.base_url}/chat/completions", json=CHAT, headers={"Authorization": "Bearer k1"})
        assert response.status_code == 500


def test_crash_after_n_requests_kills_the_process() -> None:
    with start_server(args=["--fake-crash-after", "2"]) as server:
        for _ in range(2):
            assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{server.base_url}/chat/completions", json=CHAT)
        assert server.proc.wait(timeout=10) == 1
        assert "injected crash after answering 2 chat requests" in server.log_text()


def test_a_crashing_server_answers_its_first_requests_however_many_arrive_at_once() -> None:
    """Six requests at once against ``--fake-crash-after 2``: two are answered, then the process dies and the
    other four fail with it (none is answered, none crashes it before the first two have their answers)."""
    with start_server(args=["--fake-crash-after", "2", "--fake-latency", "0.2"]) as server:

        async def all_at_once() -> list[int | None]:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

                async def one() -> int | None:
                    try:
                        return (await client.post("/chat/completions", json=CHAT)).status_code
                    except httpx.TransportError:
                        return None

                return list(await asyncio.gather(*(one() for _ in range(6))))

        statuses = asyncio.run(all_at_once())
        assert sorted(statuses, key=str) == [200, 200, None, None, None, None], statuses
        assert server.proc.wait(timeout=10) == 1


def test_never_healthy_times_out_in_start_server() -> None:
    never = start_server(env={"FAKE_VLLM_NEVER_HEALTHY": "1"}, timeout=1.0)
    with pytest.raises(ServerStartError, match="not healthy"), never:
        pass
    with start_server(args=["--fake-never-healthy"], wait="listening") as server:
        for _ in range(3):
            assert httpx.get(f"{server.root_url}/health").status_code == 503
            time.sleep(0.1)


def test_fail_start_raises_start_error() -> None:
    with pytest.raises(ServerStartError, match="exited with status 1"), start_server(args=["--fake-fail-start"]):
        pass


@pytest.mark.parametrize("capacity_flag", ["--fake-capacity", "--max-num-seqs"])
def test_metrics_running_and_waiting_rise_beyond_capacity(capacity_flag: str) -> None:
    """At most ``capacity`` requests run at once, the rest wait: set by ``--fake-capacity`` or, as in vLLM, by
    ``--max-num-seqs``. The gauges are read once every request has arrived (a state polled for, not a moment
    slept to), before the first one is answered."""
    capacity, total, latency = 2, 6, 1.0

    async def scenario(server_root: str, base_url: str) -> tuple[float, float, list[int]]:
        async with httpx.AsyncClient(timeout=60) as client:
            requests = [
                asyncio.create_task(client.post(f"{base_url}/chat/completions", json={**CHAT, "seed": i}))
                for i in range(total)
            ]
            running = waiting = 0.0
            for _ in range(500):  # a bound on the wait for every request to have arrived, not a measured time
                metrics = (await client.get(f"{server_root}/metrics")).text
                running = _gauge(metrics, "vllm:num_requests_running")
                waiting = _gauge(metrics, "vllm:num_requests_waiting")
                if running + waiting == total:
                    break
                await asyncio.sleep(0.01)
            responses = await asyncio.gather(*requests)
        return running, waiting, [r.status_code for r in responses]

    args = [capacity_flag, str(capacity), "--fake-latency", str(latency)]
    with start_server(args=args) as server:
        running, waiting, statuses = asyncio.run(scenario(server.root_url, server.base_url))
        after = httpx.get(f"{server.root_url}/metrics").text
    assert (running, waiting) == (capacity, total - capacity)
    assert statuses == [200] * total
    assert _gauge(after, "vllm:num_requests_running") == 0
    assert _gauge(after, "vllm:num_requests_waiting") == 0
    assert 'vllm:request_success_total{finished_reason="stop",engine="0",model_name="m"}' in after
    assert 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 6.0' in after


def _listening_tcp_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (from /proc: its socket inodes in /proc/net/tcp and tcp6)."""
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
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_uds_serves_over_the_unix_socket_only(tmp_path: Path) -> None:
    path = tmp_path / "vllm.sock"
    umask = os.umask(0o022)
    os.umask(umask)
    with start_server(uds=path, api_key="k", args=["--fake-startup-delay", "0.2"]) as server:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask  # the umask's mode, as vLLM's bind gives it
        transport = httpx.HTTPTransport(uds=str(path))
        with httpx.Client(transport=transport, base_url=server.root_url) as client:
            assert client.get("/health").status_code == 200
            assert client.get("/v1/models").status_code == 401
            models = client.get("/v1/models", headers=server.headers)
            assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["m"]
            chat = client.post("/v1/chat/completions", json=CHAT, headers=server.headers)
            assert chat.status_code == 200
            assert client.post("/tokenize", json={"prompt": "hello"}).status_code == 200  # no key outside /v1
        assert _listening_tcp_ports(server.proc.pid) == []
        assert str(path) in Path("/proc/net/unix").read_text()
        log = server.log_text()
    assert f"Starting vLLM API server on unix:{path}" in log
    assert path.exists()  # like vLLM, nothing removes the socket file at exit


@pytest.mark.parametrize("leftover", ["socket", "file"])
def test_uds_fails_when_the_path_exists(tmp_path: Path, leftover: str) -> None:
    path = tmp_path / "vllm.sock"
    if leftover == "socket":
        with start_server(uds=path):
            pass  # a stopped server leaves its socket file behind
    else:
        path.write_text("")
    started = start_server(uds=path, timeout=10)
    with pytest.raises(ServerStartError, match="exited with status 1") as error, started:
        pass
    assert "Address already in use" in str(error.value)
    assert "does not remove an existing file" in str(error.value)
    assert path.exists()


def test_tcp_port_in_use_fails_at_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = start_server(port=port, timeout=10)
        with pytest.raises(ServerStartError, match="Address already in use"), busy:
            pass


def test_a_free_port_is_below_the_kernels_ephemeral_range_and_free() -> None:
    low, _ = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    if low <= 20000:
        pytest.skip(f"the kernel's ephemeral range starts at {low}: no room below it (free_port takes the kernel's)")
    ports = [free_port() for _ in range(8)]
    assert all(20000 <= port < low for port in ports), (ports, low)  # no outgoing connection's source port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", ports[0]))  # nothing held it


def test_the_gate_file_says_how_many_chat_requests_are_answered(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    set_gate(gate, "2")
    with start_server(args=["--fake-gate", str(gate)]) as server, httpx.Client(timeout=60) as client:
        from concurrent.futures import ThreadPoolExecutor

        def waiting() -> float:
            return _gauge(client.get(f"{server.root_url}/metrics").text, "vllm:num_requests_waiting")

        def until(predicate: Any, what: str) -> None:
            deadline = time.monotonic() + 60
            while not predicate():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                time.sleep(0.05)

        with ThreadPoolExecutor(4) as pool:
            answers = [pool.submit(client.post, f"{server.base_url}/chat/completions", json=CHAT) for _ in range(4)]
            until(lambda: sum(a.done() for a in answers) == 2 and waiting() == 2, "2 answered and 2 held")
            set_gate(gate, "3")
            until(lambda: sum(a.done() for a in answers) == 3 and waiting() == 1, "a third answer")
            set_gate(gate, "")  # open
            assert all(a.result(timeout=60).status_code == 200 for a in answers)
        assert waiting() == 0


def test_a_gate_reads_open_a_number_or_hold(tmp_path: Path) -> None:
    from fake_vllm.gate import Gate

    gate = Gate(tmp_path / "gate")
    assert gate._limit() is None  # no file: open
    (tmp_path / "gate").write_text("\n")
    assert gate._limit() is None  # empty: open
    (tmp_path / "gate").write_text("7\n")
    assert gate._limit() == 7
    gate.passed = 5
    (tmp_path / "gate").write_text("hold")
    assert gate._limit() == 5  # none more than have passed
    (tmp_path / "gate").write_text("soon")
    with pytest.raises(ValueError, match="soon"):
        gate._limit()


def test_a_gate_for_one_model_lets_the_others_pass(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    set_gate(gate, "0")
    args = ["--served-model-name", "writer", "judge", "--fake-gate", str(gate), "--fake-gate-model", "writer"]
    with start_server(args=args) as server, httpx.Client(timeout=60) as client:
        from concurrent.futures import ThreadPoolExecutor

        url = f"{server.base_url}/chat/completions"
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(client.post, url, json={**CHAT, "model": "writer"})
            deadline = time.monotonic() + 60
            while _gauge_of(client.get(f"{server.root_url}/metrics").text, "writer") != 1:
                assert time.monotonic() < deadline, "the writer's request never waited"
                time.sleep(0.05)
            assert client.post(url, json={**CHAT, "model": "judge"}).status_code == 200  # not gated
            assert not held.done()
            set_gate(gate, "")
            assert held.result(timeout=60).status_code == 200


def _gauge_of(text: str, model: str) -> float:
    found = re.search(rf'^vllm:num_requests_waiting{{[^}}]*model_name="{model}"[^}}]*}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0
