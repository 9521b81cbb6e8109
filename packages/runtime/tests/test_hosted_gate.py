"""The client's gate in front of a hosted key: requests relayed unchanged under the key's budget, 429s waited out
rather than passed on, every request counted as the provider counted it, and the key's value nowhere on disk."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import httpx

from ddslurm.config import HostedUsage, KeyBudgetState, SnapshotProvider, budget_key, read_json
from ddslurm.runtime._hosted_gate import HostedGate
from ddslurm.runtime._key_budget import Caps

KEY = "sk-gate-" + "4" * 24
CHAT = {"model": "demo/writer", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _send_all(base: str, n: int) -> list[httpx.Response]:
    async def all_at_once() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=base, timeout=120, headers=headers) as client:
            return list(await asyncio.gather(*(client.post("/chat/completions", json=CHAT) for _ in range(n))))

    return asyncio.run(all_at_once())


def test_a_key_that_admits_two_at_once_answers_every_request_through_the_gate(tmp_path: Path) -> None:
    """20 requests at once against a key of 2 at a time: the gate starts at 4 at once, the key answers 429s, the
    gate cuts its share, waits as told and sends again: every request gets its 200; what the gate counted is what
    the key's own log says it received; its budget file and counts hold the key's name, never its value."""
    from fake_vllm.testing import start_server

    log = tmp_path / "requests.jsonl"
    args = ["--served-model-name", "demo/writer", "--fake-latency", "0.2", "--fake-rate-limit-in-flight", "2",
            "--fake-request-log", str(log)]  # fmt: skip
    with start_server("demo", args=args, api_key=KEY) as server:
        provider = SnapshotProvider(name="demo", endpoint=server.base_url, api_key_env="DEMO_KEY")
        usage_file = tmp_path / "hosted-usage.json"
        gate = HostedGate([provider], budgets=tmp_path / "budgets", member="7-attempt-7", usage_file=usage_file)
        with gate.running() as endpoints:
            answers = _send_all(endpoints["demo"], 20)
            unauthorized = httpx.post(f"{endpoints['demo']}/chat/completions", json=CHAT, timeout=60)
            stranger = httpx.post(endpoints["demo"].replace(endpoints["demo"].split("/")[3], "guess") + "/x")
    assert [a.status_code for a in answers] == [200] * 20
    assert unauthorized.status_code == 401  # the provider judges the key, as without the gate
    assert stranger.status_code == 404  # without the gate's path secret, nothing is relayed
    received = [json.loads(line) for line in log.read_text().splitlines()]
    chats = [r for r in received if r["path"].endswith("/chat/completions")]
    statuses = [r["status"] for r in chats]
    assert statuses.count(200) == 20 and statuses.count(429) >= 1, statuses  # it did meet the key's limit
    [counted] = read_json(usage_file, HostedUsage).keys
    assert counted.key == budget_key(server.base_url, "DEMO_KEY") and counted.model == "demo/writer"
    assert (counted.requests, counted.succeeded, counted.limited, counted.failed) == (
        len(chats), 20, statuses.count(429), statuses.count(401)
    )  # fmt: skip
    assert counted.input_tokens == sum(a.json()["usage"]["prompt_tokens"] for a in answers)
    assert counted.output_tokens == sum(a.json()["usage"]["completion_tokens"] for a in answers)
    state = read_json(tmp_path / "budgets" / f"{counted.key}.json", KeyBudgetState)
    assert state.limited == statuses.count(429) and state.members == {}  # the gate gave its share back
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_a_request_data_designer_gave_up_on_holds_no_slot(tmp_path: Path) -> None:
    """A model that never answers: the caller times out and goes; its request is cancelled in the gate and gives
    back the key's one slot, so the next request (another model of the key, answered at once) is sent at once; it
    would wait for the hung one otherwise."""
    from fake_vllm.testing import start_server

    gate_file = tmp_path / "gate"
    gate_file.write_text("hold")  # the stand-in holds every request for demo/hung
    args = ["--served-model-name", "demo/writer", "demo/hung", "--fake-gate", str(gate_file),
            "--fake-gate-model", "demo/hung"]  # fmt: skip
    with start_server("demo", args=args, api_key=KEY) as server:
        provider = SnapshotProvider(name="demo", endpoint=server.base_url, api_key_env="DEMO_KEY")
        caps = {"demo": Caps(in_flight=1)}  # one request at once: the hung one would hold it
        gate = HostedGate([provider], budgets=tmp_path / "budgets", member="8-attempt-8",
                          usage_file=tmp_path / "usage.json", caps=caps)  # fmt: skip
        with gate.running() as endpoints:
            url, headers = f"{endpoints['demo']}/chat/completions", {"Authorization": f"Bearer {KEY}"}
            with contextlib.suppress(httpx.TimeoutException):
                httpx.post(url, json={**CHAT, "model": "demo/hung"}, headers=headers, timeout=1.0)
            answer = httpx.post(url, json=CHAT, headers=headers, timeout=10.0)
    assert answer.status_code == 200


def test_the_provider_answer_gets_the_aliass_own_timeout_then_504(tmp_path: Path) -> None:
    """Data Designer waits its own timeout plus the gate's hold for a hosted answer; the gate applies the alias's
    own timeout to the provider's answer, so a hung provider is a 504 after it, as it was a timeout before."""
    from ddslurm.config import ProviderSnapshot, SnapshotModel, recipe_with_models
    from ddslurm.runtime._hosted_gate import MAX_WAIT_S
    from fake_vllm.testing import start_server

    gate_file = tmp_path / "gate"
    gate_file.write_text("hold")
    args = ["--served-model-name", "demo/writer", "--fake-gate", str(gate_file)]
    model = SnapshotModel(alias="writer", model="demo/writer", provider="demo", inference_parameters={"timeout": 1})
    with start_server("demo", args=args, api_key=KEY) as server:
        provider = SnapshotProvider(name="demo", endpoint=server.base_url, api_key_env="DEMO_KEY")
        gate = HostedGate([provider], models=[model], budgets=tmp_path / "b", member="9-attempt-9",
                          usage_file=tmp_path / "usage.json")  # fmt: skip
        with gate.running() as endpoints:
            answer = httpx.post(f"{endpoints['demo']}/chat/completions", json=CHAT,
                                headers={"Authorization": f"Bearer {KEY}"}, timeout=60)  # fmt: skip
    assert answer.status_code == 504 and "within 1 s" in answer.json()["error"]["message"]
    snapshot = ProviderSnapshot(providers=(provider,), models=(model,))
    recipe = {"data_designer": {"columns": [], "model_configs": []}}
    [config] = recipe_with_models(recipe, snapshot, None, hosted_wait_s=MAX_WAIT_S)["data_designer"]["model_configs"]
    assert config["inference_parameters"]["timeout"] == 1 + MAX_WAIT_S
    [plain] = recipe_with_models(recipe, snapshot, None)["data_designer"]["model_configs"]
    assert plain["inference_parameters"] == {"timeout": 1}  # no gate: the recipe's own
