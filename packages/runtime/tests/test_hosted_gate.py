"""The client's gate in front of a hosted key: requests relayed unchanged under the key's budget, 429s waited out
rather than passed on, every request counted as the provider counted it, and the key's value nowhere on disk."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import httpx
import msgspec

from ddslurm.config import HostedRequest, KeyBudgetState, SnapshotProvider, budget_key, read_json
from ddslurm.runtime._hosted_gate import HostedGate
from ddslurm.runtime._key_budget import Caps

KEY = "sk-gate-" + "4" * 24
CHAT = {"model": "demo/writer", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _journal(path: Path) -> tuple[dict[str, HostedRequest], dict[str, HostedRequest]]:
    """The gate's request record: the lines written as requests went, and as their answers came, by request id."""
    lines = [msgspec.json.decode(line, type=HostedRequest) for line in path.read_bytes().splitlines()]
    return {x.id: x for x in lines if x.status is None}, {x.id: x for x in lines if x.status is not None}


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
        journal = tmp_path / "hosted-requests.jsonl"
        gate = HostedGate([provider], budgets=tmp_path / "budgets", member="7-attempt-7", requests_file=journal)
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
    sent, answered = _journal(journal)
    assert {(line.key, line.model) for line in sent.values()} == {(budget_key(server.base_url, "DEMO_KEY"),
                                                                   "demo/writer")}  # fmt: skip
    assert sorted(sent) == sorted(answered) == sorted(c["client_request_id"] for c in chats)  # one line each
    assert {rid: a.status for rid, a in answered.items()} == {c["client_request_id"]: c["status"] for c in chats}
    assert sum(a.input_tokens for a in answered.values()) == sum(a.json()["usage"]["prompt_tokens"] for a in answers)
    assert sum(a.output_tokens for a in answered.values()) == sum(
        a.json()["usage"]["completion_tokens"] for a in answers
    )
    state = read_json(tmp_path / "budgets" / f"{budget_key(server.base_url, 'DEMO_KEY')}.json", KeyBudgetState)
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
                          caps=caps)  # fmt: skip
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
        gate = HostedGate([provider], models=[model], budgets=tmp_path / "b", member="9-attempt-9")
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


def test_the_gate_checks_each_hosted_alias_as_data_designer_would_and_says_why_one_fails(tmp_path: Path) -> None:
    """The start-up check in place of Data Designer's (under the key's budget, with no 180 s bound): one "Hello!"
    per chat alias behind the gate, sent with the key from the environment and the provider's extra headers; an
    image alias, an alias whose config skips the check and a local provider's alias are not sent. A 200 makes the
    alias checked; a model the provider does not serve is left to Data Designer's own check; a wrong key is
    ``key_refused`` naming its variable, never its value; a provider answering 500 is ``provider_unavailable``."""
    import pytest

    from ddslurm.config import ProviderSnapshot, SnapshotModel
    from ddslurm.runtime._engine import checked_aliases
    from ddslurm.runtime.errors import KeyRefusedError, ProviderUnavailableError
    from fake_vllm.testing import start_server

    log, outage = tmp_path / "requests.jsonl", tmp_path / "outage"
    args = ["--served-model-name", "demo/writer", "--fake-request-log", str(log), "--fake-outage", str(outage)]
    models = (
        SnapshotModel(alias="writer", model="demo/writer", provider="demo", inference_parameters={"max_tokens": 9}),
        SnapshotModel(alias="typo", model="demo/wirter", provider="demo"),
        SnapshotModel(alias="painter", model="demo/writer", provider="demo",
                      inference_parameters={"generation_type": "image"}),
        SnapshotModel(alias="trusted", model="demo/writer", provider="demo", skip_health_check=True),
        SnapshotModel(alias="local", model="m", provider="deployed"),
    )  # fmt: skip
    with start_server("demo", args=args, api_key=KEY) as server:
        provider = SnapshotProvider(name="demo", endpoint=server.base_url, api_key_env="DEMO_KEY",
                                    extra_headers={"X-Team": "gate-test"})  # fmt: skip
        local = SnapshotProvider(name="deployed", endpoint="", local=True)
        snapshot = ProviderSnapshot(providers=(provider, local), models=models)

        def check(run: str, models: tuple[SnapshotModel, ...], key: str) -> dict[str, int]:
            """The check of one client of run ``run`` (each run its own budget: nothing checked before)."""
            gate = HostedGate(snapshot.providers, models=models, budgets=tmp_path / run, member="5-attempt-5",
                              requests_file=tmp_path / "gate.jsonl")  # fmt: skip
            with gate.running():
                return gate.check(models, {"DEMO_KEY": key})

        answered = check("run-1", models, KEY)
        again = check("run-1", models, KEY)  # another client of the run: what was answered 200 is not asked again
        refused = check("run-2", models[:1], "sk-wrong-" + "0" * 20)
        outage.write_text("500")
        down = check("run-3", models[:1], KEY)
    assert again == answered
    assert answered == {"writer": 200, "typo": 404}
    assert checked_aliases(answered, snapshot) == {"writer"}
    with pytest.raises(KeyRefusedError, match="DEMO_KEY") as wrong:
        checked_aliases(refused, snapshot)
    assert refused == {"writer": 401} and "sk-wrong" not in wrong.value.message
    with pytest.raises(ProviderUnavailableError, match="HTTP 500") as unavailable:
        checked_aliases(down, snapshot)
    assert unavailable.value.provider == "demo" and unavailable.value.retryable
    received = [json.loads(line) for line in log.read_text().splitlines()]
    chats = [r for r in received if r["path"].endswith("/chat/completions")]
    assert [(r["model"], r["status"], r["n_messages"], r["auth_present"]) for r in chats] == [
        ("demo/writer", 200, 2, True), ("demo/wirter", 404, 2, True),  # the second client: the typo only
        ("demo/wirter", 404, 2, True), (None, 401, None, True),  # the key judged first
        ("demo/writer", 500, 2, True),
    ]  # fmt: skip
    sent, answered = _journal(tmp_path / "gate.jsonl")
    writer = sorted(a.status or 0 for rid, a in answered.items() if sent[rid].model == "demo/writer")
    assert writer == [200, 401, 500]  # the checks are requests, counted as any other


def test_a_connection_the_provider_closed_before_answering_is_sent_again_on_a_new_one(tmp_path: Path) -> None:
    """The provider closes the first connection without an answer (as a kept-alive connection it timed out is
    found closed): the gate sends the request again on a new connection, so the caller gets the answer, not a 502;
    the record says the first try never got there (the gate's 502) and the second was answered."""
    import socket
    import threading

    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for number in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                if number == 1:
                    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                    conn.sendall(head.encode() + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    provider = SnapshotProvider(name="demo", endpoint=f"http://127.0.0.1:{port}/v1", api_key_env="DEMO_KEY")
    journal = tmp_path / "gate.jsonl"
    gate = HostedGate([provider], budgets=tmp_path / "b", member="6-attempt-6", requests_file=journal)
    with gate.running() as endpoints:
        answer = httpx.post(f"{endpoints['demo']}/chat/completions", json=CHAT, timeout=30)
    thread.join(timeout=10)
    listener.close()
    assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == 3
    sent, answered = _journal(journal)
    assert len(sent) == 2 and sorted((a.status, a.gate) for a in answered.values()) == [(200, False), (502, True)]
