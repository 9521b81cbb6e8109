"""The server as a process (through fake_vllm.testing): start-up, health, crash, concurrency, env injection."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from fake_vllm.testing import ServerStartError, start_server

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _gauge(text: str, name: str) -> float:
    found = re.search(rf'^{re.escape(name)}{{[^}}]*model_name="m"[^}}]*}} (\S+)$', text, re.MULTILINE)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


def test_health_is_503_during_startup_delay_then_200() -> None:
    with start_server(args=["--fake-startup-delay", "1.0"], wait="listening") as server:
        started = time.monotonic()
        assert httpx.get(f"{server.root_url}/health").status_code == 503
        assert httpx.post(f"{server.base_url}/chat/completions", json=CHAT).status_code == 503
        while httpx.get(f"{server.root_url}/health").status_code != 200:
            assert time.monotonic() - started < 10
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
        assert "injected crash on chat request 3" in server.log_text()


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
    ``--max-num-seqs``."""
    capacity, total, latency = 2, 6, 0.5

    async def scenario(server_root: str, base_url: str) -> tuple[float, float, list[int], float]:
        async with httpx.AsyncClient(timeout=30) as client:
            started = time.monotonic()
            requests = [
                asyncio.create_task(client.post(f"{base_url}/chat/completions", json={**CHAT, "seed": i}))
                for i in range(total)
            ]
            await asyncio.sleep(latency / 2)
            metrics = (await client.get(f"{server_root}/metrics")).text
            responses = await asyncio.gather(*requests)
            elapsed = time.monotonic() - started
        running = _gauge(metrics, "vllm:num_requests_running")
        waiting = _gauge(metrics, "vllm:num_requests_waiting")
        return running, waiting, [r.status_code for r in responses], elapsed

    args = [capacity_flag, str(capacity), "--fake-latency", str(latency)]
    with start_server(args=args) as server:
        running, waiting, statuses, elapsed = asyncio.run(scenario(server.root_url, server.base_url))
        after = httpx.get(f"{server.root_url}/metrics").text
    assert (running, waiting) == (capacity, total - capacity)
    assert statuses == [200] * total
    # Three waves of two; the second of each pair runs 1.5x longer: about 3 * 0.75 s.
    assert elapsed >= 3 * latency * 1.5 - 0.1
    assert _gauge(after, "vllm:num_requests_running") == 0
    assert _gauge(after, "vllm:num_requests_waiting") == 0
    assert 'vllm:request_success_total{finished_reason="stop",engine="0",model_name="m"}' in after
    assert 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 6.0' in after
