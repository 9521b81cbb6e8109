"""A tune allocation's proxy records the chat completion bodies it forwards, never a header or the token."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import aiohttp
import pytest

from ddslurm.runtime._log import new_logger
from ddslurm.runtime._prompts import PromptRecorder, read_prompts
from ddslurm.runtime._proxy import Proxy, ProxyConfig

TOKEN = "the-allocations-own-token-" + "q" * 24


def _chat(n: int) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": f"prompt number {n}\nsecond line"}], "max_tokens": 8}


async def _through_proxy(base: str, record: Path, requests: int) -> list[int]:
    config = ProxyConfig("127.0.0.1", 0, (base,), token=TOKEN, record_prompts=record, health_interval=0.1)
    proxy = Proxy(config, new_logger(io.BytesIO()))
    port = await proxy.start()
    url = f"http://127.0.0.1:{port}"
    statuses = []
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
            for n in range(requests):
                async with session.post(f"{url}/v1/chat/completions", json=_chat(n)) as response:
                    statuses.append(response.status)
                    await response.read()
            async with session.get(f"{url}/v1/models") as response:  # not a chat completion: not recorded
                statuses.append(response.status)
    finally:
        await proxy.stop()
    return statuses


def test_the_proxy_records_each_chat_body_and_no_header(tmp_path: Path) -> None:
    fake = pytest.importorskip("fake_vllm.testing")
    record = tmp_path / "prompts-gen.jsonl"
    with fake.start_server("m", api_key=TOKEN) as server:
        statuses = asyncio.run(_through_proxy(server.root_url, record, 3))
    assert statuses == [200] * 4
    text = record.read_text()
    assert [json.loads(line) for line in text.splitlines()] == [_chat(n) for n in range(3)]
    assert TOKEN not in text and "Bearer" not in text and "uthorization" not in text
    assert record.stat().st_mode & 0o777 == 0o600


def test_at_most_the_limit_is_recorded_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "prompts-gen.jsonl"
    first = PromptRecorder(path, limit=3)
    for n in range(2):
        first.record("/v1/chat/completions", json.dumps(_chat(n)).encode())
    first.record("/v1/completions", b"{}")  # another path
    first.record("/v1/chat/completions", b"not json")
    first.close()
    again = PromptRecorder(path, limit=3)  # a restarted proxy counts what is there
    for n in range(2, 6):
        again.record("/v1/chat/completions", json.dumps(_chat(n)).encode())
    again.close()
    assert [json.loads(b) for b in read_prompts(path)] == [_chat(n) for n in range(3)]
