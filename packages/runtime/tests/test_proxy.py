"""The per-model-alias reverse proxy in front of vLLM replicas (stand-ins and tiny inline aiohttp upstreams)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web

from ddslurm.runtime._log import new_logger
from ddslurm.runtime._proxy import Proxy, ProxyConfig, loop_factory, main, serve
from ddslurm.runtime._upstreams import parse_waiting

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
FAST = {"health_interval": 0.1, "metrics_interval": 0.1}


def _fake() -> ModuleType:
    """fake_vllm.testing (a dev dependency: absent when only the runtime's own dependencies are installed)."""
    return pytest.importorskip("fake_vllm.testing")


@contextlib.asynccontextmanager
async def running_proxy(upstreams: list[str], **overrides: Any) -> AsyncIterator[tuple[Proxy, str]]:
    config = ProxyConfig("127.0.0.1", 0, tuple(upstreams), **{**FAST, **overrides})
    proxy = Proxy(config, new_logger(io.BytesIO()))
    port = await proxy.start()
    try:
        yield proxy, f"http://127.0.0.1:{port}"
    finally:
        await proxy.stop()


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """An inline upstream on a free port; yields its base URL."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


class Inline:
    """A minimal vLLM-like upstream whose waiting queue and health the test sets."""

    def __init__(self, name: str, waiting: int = 0) -> None:
        self.name = name
        self.waiting = waiting
        self.chats = 0
        self.app = web.Application()
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_post("/v1/chat/completions", self.chat)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def metrics(self, request: web.Request) -> web.Response:
        # Two engines: the proxy has to sum the label sets.
        half = self.waiting // 2
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {float(half)}\n'
            f'vllm:num_requests_waiting{{engine="1",model_name="m"}} {float(self.waiting - half)}\n'
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 1000.0\n'
        )
        return web.Response(text=text)

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.chats += 1
        return web.json_response({"served_by": self.name})


class InlineSGLang(Inline):
    """The same upstream as SGLang exposes its queue."""

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f'sglang:num_queue_reqs{{model_name="m"}} {float(self.waiting)}\n')


async def _wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait (generously) for a condition of another process; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


async def _upstreams(session: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    async with session.get(f"{url}/ddslurm/upstreams") as response:
        assert response.status == 200
        data = await response.json()
    return {entry["url"]: entry for entry in data["upstreams"]}


def _sse_events(body: bytes) -> list[Any]:
    """The data of each SSE event, without the per-response id and timestamp."""
    events: list[Any] = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        if data == "[DONE]":
            events.append(data)
            continue
        event = json.loads(data)
        event.pop("id")
        event.pop("created")
        events.append(event)
    return events


# --- pure functions --------------------------------------------------------------------------------


def test_parse_waiting_sums_label_sets_and_ignores_lookalikes() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 40.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 30.0\n'
        'vllm:num_requests_waiting_by_reason{reason="x"} 99.0\n'
        "vllm:num_requests_running 5.0\n"
        "vllm:num_requests_waiting 2\n"
    )
    assert parse_waiting(text) == 72
    assert parse_waiting("") == 0


def test_parse_waiting_reads_sglangs_queue_as_vllms() -> None:
    """SGLang's gauge of queued requests is ``sglang:num_queue_reqs`` (per DP rank with ``--dp-size``)."""
    text = (
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue\n"
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="m",dp_rank="0"} 12.0\n'
        'sglang:num_queue_reqs{model_name="m",dp_rank="1"} 3.0\n'
        'sglang:num_queue_reqs_by_priority{model_name="m"} 500.0\n'
        'sglang:num_running_reqs{model_name="m"} 64.0\n'
    )
    assert parse_waiting(text) == 15


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="upstream"):
        ProxyConfig("127.0.0.1", 0, ())
    with pytest.raises(ValueError, match="duplicate"):
        ProxyConfig("127.0.0.1", 0, ("http://a:1", "http://a:1"))
    with pytest.raises(ValueError, match="http"):
        ProxyConfig("127.0.0.1", 0, ("a:1",))
    with pytest.raises(ValueError, match="unhealthy_interval"):
        ProxyConfig("127.0.0.1", 0, ("http://a:1",), unhealthy_interval=0)
    with pytest.raises(ValueError, match="one per upstream"):
        ProxyConfig("127.0.0.1", 0, ("http://a:1", "http://a:2"), busy_logs=(Path("busy-m-0.jsonl"),))


# --- 1. balancing ----------------------------------------------------------------------------------


def test_least_outstanding_sends_more_to_the_fast_replica(tmp_path: Path) -> None:
    """The slow replica answers nothing until the fast one has answered every other request (its gate holds: an
    event, not a latency), so its outstanding requests only grow. Least outstanding sends a request there only while
    it has no more in flight than the fast one: with 8 requests in flight at most, it gets fewer than 8 of the 120
    (round-robin would send it every other one, 60)."""
    fake = _fake()
    gate = tmp_path / "slow.gate"
    fake.set_gate(gate, "hold")
    with (
        fake.start_server("m", args=["--fake-gate", str(gate)]) as slow,
        fake.start_server("m") as fast,
    ):
        counts = asyncio.run(_balance(fake.free_port(), [slow.root_url, fast.root_url], release=(slow.root_url, gate)))
    assert counts[slow.root_url] + counts[fast.root_url] == 120
    assert 1 <= counts[slow.root_url] < 8, counts  # the first pick is the slow one (a tie), never as many as in flight


async def _waiting(session: aiohttp.ClientSession, root_url: str) -> int:
    """How many requests wait at the stand-in's gate (its ``/metrics``, as the proxy reads an engine's queue)."""
    async with session.get(f"{root_url}/metrics") as response:
        return parse_waiting(await response.text())


async def _balance(port: int, upstreams: list[str], *, release: tuple[str, Path]) -> dict[str, int]:
    """120 requests through a proxy over ``upstreams``, 8 at a time; the served count of each upstream. ``release``
    (an upstream and its gate file) is opened once every request is either answered or waiting at that upstream."""
    config = ProxyConfig("127.0.0.1", port, tuple(upstreams), **FAST)
    started, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, new_logger(io.BytesIO()), started=started, stop=stop))
    await asyncio.wait_for(started.wait(), 10)
    slots = asyncio.Semaphore(8)
    answered = 0

    async def one(session: aiohttp.ClientSession) -> int:
        nonlocal answered
        async with slots, session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT) as response:
            await response.read()
            answered += 1
            return response.status

    async def opener(session: aiohttp.ClientSession) -> None:
        root_url, gate = release
        while answered + await _waiting(session, root_url) < 120:
            await asyncio.sleep(0.05)
        _fake().set_gate(gate, "")

    async with aiohttp.ClientSession() as session:
        opening = asyncio.create_task(opener(session))
        statuses = await asyncio.wait_for(asyncio.gather(*(one(session) for _ in range(120))), 120)
        await opening
    assert set(statuses) == {200}
    stop.set()
    return await asyncio.wait_for(task, 10)


# --- 2. streaming ----------------------------------------------------------------------------------


def test_sse_is_streamed_chunk_by_chunk() -> None:
    asyncio.run(_sse_handshake())


async def _sse_handshake() -> None:
    first_seen = asyncio.Event()
    outcome: dict[str, bool] = {}

    async def sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        # The second chunk is only sent once the client has seen the first: a buffering proxy deadlocks here.
        try:
            async with asyncio.timeout(5):
                await first_seen.wait()
            outcome["streamed"] = True
        except TimeoutError:
            outcome["streamed"] = False
        await response.write(b"data: two\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    upstream = Inline("sse")
    upstream.app.router.add_post("/v1/sse", sse)
    async with (
        serving(upstream.app) as url,
        running_proxy([url]) as (_, proxy_url),
        aiohttp.ClientSession() as session,
        session.post(f"{proxy_url}/v1/sse", json={**CHAT, "stream": True}) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        first = await response.content.readuntil(b"\n\n")
        first_seen.set()
        rest = await response.read()
    assert first == b"data: one\n\n"
    assert rest == b"data: two\n\ndata: [DONE]\n\n"
    assert outcome == {"streamed": True}


def test_streamed_chat_completion_equals_the_direct_one() -> None:
    fake = _fake()
    with fake.start_server("m") as server:
        asyncio.run(_stream_equal(server.root_url))


async def _stream_equal(root: str) -> None:
    body = {**CHAT, "stream": True, "n": 2, "stream_options": {"include_usage": True}}
    async with running_proxy([root]) as (_, url), aiohttp.ClientSession() as session:
        results = []
        for base in (root, url):
            async with session.post(f"{base}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                chunks = [chunk async for chunk, _ in response.content.iter_chunks()]
                results.append(b"".join(chunks))
    direct, proxied = (_sse_events(raw) for raw in results)
    assert proxied == direct
    assert len(direct) == 2 * 2 + 2  # two chunks per choice, usage, [DONE]


# --- 3. failures -----------------------------------------------------------------------------------


def test_crashed_replica_is_avoided_and_all_dead_gives_503() -> None:
    fake = _fake()
    with (
        fake.start_server("m", args=["--fake-crash-after", "5", "--fake-latency", "0.05"]) as crashing,
        fake.start_server("m", args=["--fake-latency", "0.05"]) as steady,
    ):
        asyncio.run(_crash(crashing, steady))


async def _crash(crashing: Any, steady: Any) -> None:
    gate = asyncio.Semaphore(6)
    async with (
        running_proxy([crashing.root_url, steady.root_url], unavailable_grace=0.3) as (_, url),
        aiohttp.ClientSession() as session,
    ):

        async def one() -> int:
            async with gate, session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
                await response.read()
                return response.status

        statuses = await asyncio.gather(*(one() for _ in range(40)))
        assert statuses == [200] * 40  # requests lost in the crash were retried on the other replica
        assert crashing.proc.wait(timeout=5) == 1
        state = await _upstreams(session, url)
        assert state[crashing.root_url]["healthy"] is False
        assert state[crashing.root_url]["failed"] >= 1
        assert state[crashing.root_url]["served"] <= 5
        assert state[steady.root_url]["healthy"] is True
        assert state[steady.root_url]["served"] >= 35

        # Later requests all go to the survivor.
        statuses = await asyncio.gather(*(one() for _ in range(10)))
        assert statuses == [200] * 10
        assert (await _upstreams(session, url))[steady.root_url]["served"] == 50 - state[crashing.root_url]["served"]

        steady.proc.terminate()
        steady.proc.wait(timeout=10)

        async def proxy_unhealthy() -> bool:
            async with session.get(f"{url}/health") as response:
                return response.status == 503

        await _wait_until(proxy_unhealthy)

        async def ask() -> tuple[int, dict[str, Any]]:
            async with session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
                return response.status, (await response.json())["error"]

        # Refused, not queued: a request that waited for an upstream would take admission_timeout (600 s).
        status, error = await asyncio.wait_for(ask(), timeout=60)
        assert status == 503
        assert error["type"] == "ServiceUnavailable"
        assert "no healthy upstream" in error["message"]


class Loading(Inline):
    """An upstream whose ``/health`` answers 503 until the test says it has loaded; counts its probes."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.loaded = False
        self.probes = 0

    async def health(self, request: web.Request) -> web.Response:
        self.probes += 1
        return web.Response(status=200 if self.loaded else 503)


def test_a_replica_that_loads_is_used_within_the_unhealthy_interval_not_the_health_interval() -> None:
    asyncio.run(_loads())


async def _loads() -> None:
    up = Loading("late")
    async with (
        serving(up.app) as base,
        running_proxy([base], health_interval=30.0, unhealthy_interval=0.1) as (_, url),
        aiohttp.ClientSession() as session,
    ):
        async with session.get(f"{url}/health") as response:
            assert response.status == 503  # nothing loaded yet
        up.loaded = True

        async def healthy() -> bool:
            return bool((await _upstreams(session, url))[base]["healthy"])

        # Within a bound below the 30 s health_interval: a proxy probing a loading replica at that interval fails it.
        await _wait_until(healthy, timeout=15.0)
        async with session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
            assert (await response.json())["served_by"] == "late"

        # Healthy now: its next probe waits health_interval, not unhealthy_interval (the proxy's own schedule says so).
        async def on_health_interval() -> bool:
            return bool((await _upstreams(session, url))[base]["probe_interval_s"] == 30.0)

        await _wait_until(on_health_interval, timeout=15.0)


def test_upstream_dying_mid_body_is_not_passed_off_as_complete() -> None:
    asyncio.run(_mid_body())


async def _mid_body() -> None:
    async def dies(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response

    upstream = Inline("dies")
    upstream.app.router.add_post("/v1/dies", dies)
    async with (
        serving(upstream.app) as upstream_url,
        running_proxy([upstream_url]) as (proxy, url),
        aiohttp.ClientSession() as session,
    ):
        async with session.post(f"{url}/v1/dies", json=CHAT) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
        assert proxy.describe()["upstreams"][0]["failed"] == 1


def test_bodies_of_known_length_pass_whole_and_a_short_one_gives_502() -> None:
    asyncio.run(_known_length())


async def _known_length() -> None:
    big = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB and a bit: longer than what is read whole, so streamed

    async def sized(request: web.Request) -> web.Response:
        size = int(request.query["size"])
        return web.Response(body=big[:size], headers={"X-Upstream": "kept"}, content_type="application/x-test")

    async def short(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b"x" * 10)
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()  # 990 bytes short
        return response

    upstream = Inline("sized")
    upstream.app.router.add_get("/v1/sized", sized)
    upstream.app.router.add_post("/v1/short", short)
    async with (
        serving(upstream.app) as upstream_url,
        running_proxy([upstream_url]) as (proxy, url),
        aiohttp.ClientSession(auto_decompress=False) as session,
    ):
        for size in (0, 1, 700, len(big)):
            async with session.get(f"{url}/v1/sized", params={"size": str(size)}) as response:
                assert response.status == 200
                assert await response.read() == big[:size]
                assert response.headers["X-Upstream"] == "kept"
                assert response.headers["Content-Type"] == "application/x-test"
                assert response.content_length == size
        async with session.post(f"{url}/v1/short", json=CHAT) as response:
            assert response.status == 502  # nothing was sent yet: an error, never a truncated body
            error = (await response.json())["error"]
        assert error["type"] == "BadGateway"
        assert upstream_url in error["message"]
        assert proxy.describe()["upstreams"][0]["failed"] == 1


def test_a_client_leaving_mid_body_closes_the_upstream_request() -> None:
    asyncio.run(_client_leaves())


async def _client_leaves() -> None:
    began, closed = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 1000
        await response.prepare(request)
        began.set()
        try:
            for _ in range(100):  # 10 bytes every 50 ms: 5 s for the whole body
                await response.write(b"x" * 10)
                await asyncio.sleep(0.05)
        except ConnectionError:
            closed.set()
        return response

    upstream = Inline("slow")
    upstream.app.router.add_post("/v1/slow", slow)
    async with (
        serving(upstream.app) as upstream_url,
        running_proxy([upstream_url]) as (proxy, url),
        aiohttp.ClientSession() as session,
    ):

        async def read() -> None:
            async with session.post(f"{url}/v1/slow", json=CHAT) as r:
                await r.read()

        # The client leaves once the upstream has begun its body (not after a fixed time: on a busy machine the
        # upstream might not have been reached by then).
        reading = asyncio.create_task(read())
        async with asyncio.timeout(5):
            await began.wait()
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        async with asyncio.timeout(3):
            await closed.wait()  # the proxy dropped its upstream connection instead of reading on
        entry = proxy.describe()["upstreams"][0]
        assert (entry["in_flight"], entry["failed"], entry["healthy"]) == (0, 0, True)


# --- 4. back-pressure ------------------------------------------------------------------------------


def test_saturated_upstream_is_skipped_and_requests_wait_for_capacity() -> None:
    asyncio.run(_backpressure())


async def _backpressure() -> None:
    busy, idle = Inline("busy", waiting=100), Inline("idle", waiting=0)
    async with (
        serving(busy.app) as busy_url,
        serving(idle.app) as idle_url,
        running_proxy([busy_url, idle_url], max_waiting=10, admission_timeout=1.0) as (proxy, url),
        aiohttp.ClientSession() as session,
    ):

        async def one() -> tuple[int, str]:
            async with session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
                text = await response.text()
                return response.status, text

        results = await asyncio.gather(*(one() for _ in range(30)))
        assert {status for status, _ in results} == {200}
        assert (busy.chats, idle.chats) == (0, 30)
        state = await _upstreams(session, url)
        assert state[busy_url]["saturated"] is True
        assert state[busy_url]["waiting"] == 100

        # Everything saturated: a request waits (not 503) until an upstream has room again.
        idle.waiting = 100

        async def all_saturated() -> bool:
            return all(entry["saturated"] for entry in (await _upstreams(session, url)).values())

        await _wait_until(all_saturated)
        pending = asyncio.create_task(one())

        async def admitting() -> bool:
            return bool(proxy.describe()["admitting"] == 1)

        await _wait_until(admitting)  # the proxy holds it (an event: its own count), neither 503 nor forwarded
        assert not pending.done() and (busy.chats, idle.chats) == (0, 30)
        busy.waiting = 0
        status, text = await asyncio.wait_for(pending, 30)
        assert status == 200
        assert json.loads(text) == {"served_by": "busy"}
        assert proxy.describe()["admitting"] == 0

        # ...and gives up with 503 after admission_timeout: the reason says it waited for room, in vain.
        busy.waiting = 100
        await _wait_until(all_saturated)
        status, text = await asyncio.wait_for(one(), 30)  # the bound only keeps a request that is never refused
        assert status == 503
        assert "every healthy upstream is saturated" in json.loads(text)["error"]["message"]
        assert json.loads(text)["error"]["type"] == "ServiceUnavailable"
        assert (busy.chats, idle.chats) == (1, 30)


def test_a_saturated_sglang_upstream_is_skipped() -> None:
    asyncio.run(_sglang_backpressure())


async def _sglang_backpressure() -> None:
    busy, idle = InlineSGLang("busy", waiting=100), InlineSGLang("idle", waiting=0)
    async with (
        serving(busy.app) as busy_url,
        serving(idle.app) as idle_url,
        running_proxy([busy_url, idle_url], max_waiting=10, admission_timeout=1.0) as (_, url),
        aiohttp.ClientSession() as session,
    ):
        for _ in range(10):
            async with session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
                assert response.status == 200
        assert (busy.chats, idle.chats) == (0, 10)
        state = await _upstreams(session, url)
        assert (state[busy_url]["saturated"], state[busy_url]["waiting"]) == (True, 100)


# --- 5. pass-through -------------------------------------------------------------------------------


def test_upstream_errors_pass_through_unchanged_and_are_not_retried(tmp_path: Path) -> None:
    fake = _fake()
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    with (
        fake.start_server("m", api_key="k", args=["--fake-error-rate", "1", "--fake-request-log", str(logs[0])]) as a,
        fake.start_server("m", api_key="k", args=["--fake-error-rate", "1", "--fake-request-log", str(logs[1])]) as b,
    ):
        asyncio.run(_pass_through([a.root_url, b.root_url], a.headers))
    chats = [
        entry
        for path in logs
        for entry in map(json.loads, path.read_text().splitlines())
        if entry["path"] == "/v1/chat/completions"
    ]
    # 1 unauthorised + 4 errors + 404 through the proxy + 404 direct: one upstream request each, no retries.
    assert sorted(entry["status"] for entry in chats) == [401, 404, 404, 500, 500, 500, 500]


async def _pass_through(upstreams: list[str], headers: dict[str, str]) -> None:
    async with running_proxy(upstreams) as (_, url), aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
            assert response.status == 401  # no key: the upstream's answer
            assert await response.json() == {"error": "Unauthorized"}
        for _ in range(4):
            async with session.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers) as response:
                assert response.status == 500
                assert (await response.json())["error"]["type"] == "InternalServerError"
        unknown = {**CHAT, "model": "nope"}
        async with session.post(f"{url}/v1/chat/completions", json=unknown, headers=headers) as response:
            assert response.status == 404
            proxied = await response.read()
        async with session.post(f"{upstreams[0]}/v1/chat/completions", json=unknown, headers=headers) as response:
            direct = await response.read()
        assert proxied == direct
        async with session.get(f"{url}/v1/models", headers=headers) as response:
            assert response.status == 200
            assert [m["id"] for m in (await response.json())["data"]] == ["m"]
        state = await _upstreams(session, url)
        assert all(entry["failed"] == 0 and entry["healthy"] for entry in state.values())
        assert sum(entry["served"] for entry in state.values()) == 7


# --- 6. the command --------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_main_stops_gracefully_on_sigterm(tmp_path: Path, loop: str) -> None:
    fake = _fake()
    log = tmp_path / "proxy.log"
    gate = tmp_path / "gate"
    with fake.start_server("m", args=["--fake-gate", str(gate)]) as server:
        port = fake.free_port()
        code = "import sys; from ddslurm.runtime._proxy import main; sys.exit(main(sys.argv[1:]))"
        command = [sys.executable, "-c", code, "--listen", f"127.0.0.1:{port}", "--upstream", server.base_url]
        command += ["--log", str(log), "--health-interval", "0.1", "--max-waiting", "8", "--loop", loop]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60  # a bound on the start, not a measured time
            while True:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200

            # A request in flight when SIGTERM arrives still completes: it waits at the server's gate until the
            # proxy has logged that it is stopping, then the gate opens (events, not latencies).
            fake.set_gate(gate, "hold")
            outcome: dict[str, int] = {}

            def in_flight() -> None:
                outcome["status"] = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=60).status_code

            thread = threading.Thread(target=in_flight)
            thread.start()
            _until(lambda: parse_waiting(httpx.get(f"{server.root_url}/metrics").text) == 1, "the request to wait")
            os.kill(proc.pid, signal.SIGTERM)
            _until(lambda: "proxy.stopping" in log.read_text(), "the proxy to log that it is stopping")
            fake.set_gate(gate, "")
            assert proc.wait(timeout=60) == 0
            thread.join(timeout=60)
            assert outcome == {"status": 200}
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0]["event"] == "proxy.started"
    expected = "uvloop" if loop == "auto" and loop_factory("auto") is not None else "asyncio"
    assert lines[0]["loop"].split(".")[0] == expected
    assert lines[-1]["event"] == "proxy.stopped"
    assert lines[-1]["served"] == {server.root_url: 2}  # the /v1 suffix is dropped from --upstream
    assert lines[-1]["component"] == "proxy"


def test_the_loop_is_uvloop_where_it_imports_and_asyncio_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert loop_factory("asyncio") is None
    if importlib.util.find_spec("uvloop") is not None:
        factory = loop_factory("auto")
        assert factory is not None and loop_factory("uvloop") is not None
        loop = factory()
        try:
            assert type(loop).__module__.startswith("uvloop")
        finally:
            loop.close()
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a platform without it: import fails
    assert loop_factory("auto") is None
    with pytest.raises(ImportError):
        loop_factory("uvloop")
    assert main(["--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--loop", "uvloop"]) == 2


def test_main_fails_when_the_port_is_taken(tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:9", "--log", str(log)]
        assert main(argv) == 1
    assert json.loads(log.read_text().splitlines()[-1])["event"] == "proxy.failed"


# --- 7. the attempt's token ------------------------------------------------------------------------

TOKEN = "attempt-token-" + "t" * 32


class Guarded(Inline):
    """An upstream that, like vLLM started with a key, needs ``Authorization: Bearer TOKEN`` on ``/v1/*``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.seen: list[str | None] = []

    async def chat(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await super().chat(request)


def test_the_proxy_refuses_requests_without_the_token_and_sends_it_upstream() -> None:
    async def scenario() -> None:
        upstream = Guarded("a")
        async with (
            serving(upstream.app) as base,
            running_proxy([base], token=TOKEN) as (_, url),
            aiohttp.ClientSession() as session,
        ):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                async with session.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers) as response:
                    assert response.status == 401, headers
                    assert (await response.json())["error"]["type"] == "Unauthorized"
                async with session.get(f"{url}/ddslurm/upstreams", headers=headers) as response:
                    assert response.status == 401
            assert upstream.seen == []  # refused by the proxy itself: nothing reached a replica
            async with session.get(f"{url}/health") as response:
                assert response.status == 200  # open, like vLLM's: the controller's liveness check needs no key
            good = {"Authorization": f"Bearer {TOKEN}"}
            async with session.post(f"{url}/v1/chat/completions", json=CHAT, headers=good) as response:
                assert response.status == 200 and await response.json() == {"served_by": "a"}
            assert upstream.seen == [f"Bearer {TOKEN}"]
            assert TOKEN not in repr(ProxyConfig("127.0.0.1", 0, (base,), token=TOKEN))

    asyncio.run(scenario())


def test_the_command_takes_the_token_from_its_environment(tmp_path: Path) -> None:
    async def scenario(port: int) -> None:
        upstream = Guarded("a")
        async with serving(upstream.app) as base:
            argv = ["--listen", f"127.0.0.1:{port}", "--upstream", base, "--log", str(tmp_path / "proxy.log")]
            code = "import sys; from ddslurm.runtime._proxy import main; sys.exit(main(sys.argv[1:]))"
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, *argv, env={**os.environ, "VLLM_API_KEY": TOKEN}
            )
            try:
                url = f"http://127.0.0.1:{port}"
                async with aiohttp.ClientSession() as session:
                    deadline = time.monotonic() + 60  # a bound on the start, not a measured time
                    while True:
                        with contextlib.suppress(aiohttp.ClientError):
                            async with session.get(f"{url}/health") as response:
                                if response.status == 200:
                                    break
                        assert proc.returncode is None and time.monotonic() < deadline
                        await asyncio.sleep(0.05)
                    assert TOKEN.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
                    async with session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
                        assert response.status == 401
                    headers = {"Authorization": f"Bearer {TOKEN}"}
                    async with session.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers) as response:
                        assert response.status == 200
            finally:
                proc.terminate()
                await proc.wait()
        assert TOKEN not in (tmp_path / "proxy.log").read_text()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    asyncio.run(scenario(port))


# --- the busy log ----------------------------------------------------------------------------------


class Held(Inline):
    """An upstream whose chat requests wait until the test releases them; each request's span is recorded."""

    def __init__(self) -> None:
        super().__init__("held")
        self.release = asyncio.Event()
        self.arrived: list[float] = []
        self.spans: list[tuple[float, float]] = []

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        arrived = time.time()
        self.arrived.append(arrived)
        await self.release.wait()
        self.spans.append((arrived, time.time()))
        return web.json_response({"served_by": self.name})


def test_each_upstreams_busy_log_holds_the_spans_it_had_a_request_in_flight(tmp_path: Path) -> None:
    import msgspec

    from ddslurm.config import BusySpan

    logs = (tmp_path / "busy-m-0.jsonl", tmp_path / "busy-m-1.jsonl")
    held, sent = asyncio.run(_busy_spans(logs))
    spans = [[(s.start, s.end) for s in (msgspec.json.decode(x, type=BusySpan) for x in log.read_text().splitlines())]
             for log in logs]  # fmt: skip
    # each log has one span per request its own upstream served (they did not touch), none of the other's:
    # begun after the client sent it, before the upstream got it; ended after the upstream answered, before the
    # client had the answer
    for log_spans, upstream in zip(spans, held, strict=True):
        assert len(log_spans) == len(upstream.spans) >= 1, (log_spans, upstream.spans)
        for (start, end), (arrived, answered) in zip(log_spans, sorted(upstream.spans), strict=True):
            bracket = next((a, b) for a, b in sent if a <= arrived and answered <= b)
            assert bracket[0] <= start <= arrived and answered <= end <= bracket[1]
    assert sorted(len(s) for s in spans) == [1, 2]  # the third request went to one of them only
    assert all((log.stat().st_mode & 0o777) == 0o600 for log in logs)


async def _busy_spans(logs: tuple[Path, Path]) -> tuple[tuple[Held, Held], list[tuple[float, float]]]:
    """A request held at one upstream, a second at the other (the first still in flight), the first answered
    before the second; then, both idle, a third. The upstreams, and each request's (sent, answered) at the client."""
    first, second = Held(), Held()
    sent: list[tuple[float, float]] = []
    async with (
        serving(first.app) as base_1,
        serving(second.app) as base_2,
        running_proxy([base_1, base_2], busy_logs=logs) as (_proxy, url),
        aiohttp.ClientSession() as session,
    ):

        async def chat() -> None:
            at = time.time()
            async with session.post(f"{url}/v1/chat/completions", json=CHAT) as response:
                assert response.status == 200
                await response.read()
            sent.append((at, time.time()))

        async def arrived(n: int) -> bool:
            return len(first.arrived) + len(second.arrived) == n

        one = asyncio.create_task(chat())
        await _wait_until(lambda: arrived(1))
        two = asyncio.create_task(chat())  # the first upstream has one in flight: the other one's
        await _wait_until(lambda: arrived(2))
        assert len(first.arrived) == len(second.arrived) == 1
        early, late = (first, second) if first.arrived[0] < second.arrived[0] else (second, first)
        early.release.set()
        await one
        late.release.set()
        await two
        three = asyncio.create_task(chat())
        await _wait_until(lambda: arrived(3))
        await three
    return (first, second), sent


# --- probes that never generate, and metrics behind the key (issue 41) ---------------------------------------


async def _guarded_upstreams(session: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    async with session.get(f"{url}/ddslurm/upstreams", headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status == 200
        data = await response.json()
    return {entry["url"]: entry for entry in data["upstreams"]}


def test_backpressure_holds_when_metrics_want_the_key_and_a_refused_scrape_is_shown(tmp_path: Path) -> None:
    """A replica whose /metrics wants the key (``--fake-metrics-auth``, a proposed vLLM change) still gives the
    proxy its waiting queue: the scrape carries the token. A scrape refused all the same (401) is shown
    (``metrics_refused``) and logged once, never read as an empty queue in silence."""
    fake = _fake()
    gate = tmp_path / "gate"
    fake.set_gate(gate, "hold")
    args = ["--fake-metrics-auth", "--fake-gate", str(gate)]
    with fake.start_server("m", api_key=TOKEN, args=args) as server:
        asyncio.run(_metrics_with_the_key(server.root_url, gate, fake))
    log, scrapes = io.BytesIO(), tmp_path / "scrapes.jsonl"
    refusing = [*args, "--fake-request-log", str(scrapes)]
    with fake.start_server("m", api_key="another-key", args=refusing) as server:
        asyncio.run(_metrics_refused(server.root_url, log, scrapes))
    events = [json.loads(line) for line in log.getvalue().decode().splitlines()]
    refused = [e for e in events if e["event"] == "proxy.metrics_refused"]
    assert [e["status"] for e in refused] == [401]


async def _metrics_with_the_key(upstream: str, gate: Path, fake: ModuleType) -> None:
    async with (
        running_proxy([upstream], token=TOKEN) as (_, url),
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session,
    ):
        held = [asyncio.create_task(session.post(f"{url}/v1/chat/completions", json=CHAT)) for _ in range(3)]

        async def three_waiting() -> bool:
            return (await _guarded_upstreams(session, url))[upstream]["waiting"] == 3

        await _wait_until(three_waiting, timeout=60)
        assert (await _guarded_upstreams(session, url))[upstream]["metrics_refused"] is None
        fake.set_gate(gate, "")
        for response in await asyncio.gather(*held):
            assert response.status == 200
            response.release()


async def _metrics_refused(upstream: str, log: io.BytesIO, scrapes: Path) -> None:
    config = ProxyConfig("127.0.0.1", 0, (upstream,), token=TOKEN, **FAST)
    proxy = Proxy(config, new_logger(log))
    port = await proxy.start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:

            async def five_refused_scrapes() -> bool:
                lines = scrapes.read_text().splitlines() if scrapes.exists() else []
                logged = [json.loads(line) for line in lines]
                return sum(r["path"] == "/metrics" and r["status"] == 401 for r in logged) >= 5

            await _wait_until(five_refused_scrapes, timeout=60)
            assert (await _guarded_upstreams(session, url))[upstream]["metrics_refused"] == 401
    finally:
        await proxy.stop()


def test_an_sglang_upstream_is_probed_without_generating(tmp_path: Path) -> None:
    """The proxy probes an SGLang replica on /v1/models with the token (``--engine sglang``), never on its /health,
    a one-token generation: a replica whose generation is held (its /health 503) stays in rotation."""
    fake = _fake()
    gate, requests = tmp_path / "gate", tmp_path / "requests.jsonl"
    args = ["--fake-gate", str(gate), "--fake-request-log", str(requests)]
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "0.1"}
    with fake.start_server("m", engine="sglang", api_key=TOKEN, args=args, env=env) as server:
        fake.set_gate(gate, "hold")
        asyncio.run(_sglang_probed(server.root_url, requests))


async def _sglang_probed(upstream: str, requests: Path) -> None:
    async with (
        running_proxy([upstream], token=TOKEN, engine="sglang") as (_, url),
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session,
    ):

        async def probed() -> bool:
            lines = requests.read_text().splitlines() if requests.exists() else []
            return sum('"/v1/models"' in line for line in lines) >= 5

        await _wait_until(probed, timeout=60)
        assert (await _guarded_upstreams(session, url))[upstream]["healthy"]
        async with aiohttp.ClientSession() as plain, plain.get(f"{upstream}/health") as response:
            assert response.status == 503  # what a /health probe would have seen meanwhile
    probes = [json.loads(line) for line in requests.read_text().splitlines()]
    assert all(p["authorized"] for p in probes if p["path"] == "/v1/models")
    assert [p for p in probes if p["path"] == "/health" and p["auth_present"]] == []
