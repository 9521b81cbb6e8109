"""In-process tests of the Starlette app (no subprocess): protocol shapes, errors, auth, the fault draws."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
from starlette.applications import Starlette

from fake_vllm.app import create_app
from fake_vllm.settings import Settings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0.5}


class Crashed(Exception):
    pass


def _crash(reason: str) -> NoReturn:
    raise Crashed(reason)


class AppClient:
    """A synchronous in-process client: httpx's ASGI transport on a private event loop, with the app's
    lifespan entered (starlette's own TestClient now warns about httpx)."""

    def __init__(self, app: Starlette) -> None:
        self._app = app
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake")
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] = app.router.lifespan_context(app)

    def __enter__(self) -> AppClient:
        self._loop.run_until_complete(self._lifespan.__aenter__())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._loop.run_until_complete(self._lifespan.__aexit__(None, None, None))
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._client.request(method, url, **kwargs))

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)


def _client(**overrides: Any) -> AppClient:
    settings = Settings(**{"model": "org/model", "served_model_names": ("m", "alias"), **overrides})
    return AppClient(create_app(settings, crash=_crash))


@pytest.fixture
def client() -> Iterator[AppClient]:
    with _client() as c:
        yield c


def test_chat_completion_shape(client: AppClient) -> None:
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int)
    assert body["model"] == "m"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_tool_call_answer_shape(client: AppClient) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    body = client.post("/v1/chat/completions", json={**CHAT, "tools": [tool]}).json()
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["function"] == {"name": "lookup", "arguments": "{}"}


def test_alias_and_missing_model_use_served_names(client: AppClient) -> None:
    content = client.post("/v1/chat/completions", json={**CHAT, "model": "alias"}).json()
    assert content["model"] == "alias"
    no_model = {k: v for k, v in CHAT.items() if k != "model"}
    assert client.post("/v1/chat/completions", json=no_model).json()["model"] == "m"


def test_unknown_model_is_404_like_vllm(client: AppClient) -> None:
    response = client.post("/v1/chat/completions", json={**CHAT, "model": "org/model-x"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "NotFoundError" and error["code"] == 404
    assert "org/model-x" in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"model": "m"}, id="no-messages"),
        pytest.param({"model": "m", "messages": []}, id="empty-messages"),
        pytest.param({"model": "m", "messages": ["hi"]}, id="message-not-object"),
        pytest.param({**CHAT, "n": 0}, id="bad-n"),
        pytest.param({**CHAT, "max_tokens": -5}, id="bad-max-tokens"),
        pytest.param([1, 2], id="not-an-object"),
    ],
)
def test_bad_requests_are_400(client: AppClient, body: Any) -> None:
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"


def test_invalid_json_is_400(client: AppClient) -> None:
    response = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400


def test_models_list(client: AppClient) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["m", "alias"]
    assert all(m["object"] == "model" and m["owned_by"] == "vllm" and m["root"] == "org/model" for m in body["data"])


def test_unknown_route_is_json_404(client: AppClient) -> None:
    response = client.get("/v1/nothing")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not Found"}


def test_streaming(client: AppClient) -> None:
    response = client.post(
        "/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    plain = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
    assert streamed == plain
    assert chunks[-1]["usage"]["total_tokens"] > 0


def test_api_key_required_on_v1_only(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with _client(api_keys=("s3cret-key",), request_log=log) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 401
        wrong = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong.json() == {"error": "Unauthorized"}
        assert client.get("/v1/models").status_code == 401
        good = {"Authorization": "Bearer s3cret-key"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=good).status_code == 200
        assert client.get("/v1/models", headers=good).status_code == 200
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
    text = log.read_text()
    assert "s3cret-key" not in text and "Bearer" not in text and "nope" not in text
    entries = [json.loads(line) for line in text.splitlines()]
    chat = [(e["status"], e["auth_present"], e["authorized"]) for e in entries if e["path"] == "/v1/chat/completions"]
    assert chat == [(401, False, False), (401, True, False), (200, True, True)]
    first = entries[0]
    keys = {
        "time",
        "method",
        "path",
        "status",
        "model",
        "auth_present",
        "authorized",
        "n_messages",
        "admitted",
        "match",
        "client_request_id",
        "prompt_tokens",
        "completion_tokens",
    }
    assert set(first) == keys and first["admitted"] is None
    assert entries[2]["n_messages"] is None
    ok = next(e for e in entries if e["status"] == 200 and e["path"] == "/v1/chat/completions")
    assert ok["model"] == "m" and ok["n_messages"] == 1 and ok["prompt_tokens"] > 0 and ok["completion_tokens"] > 0
    assert ok["admitted"] is not None and ok["admitted"] <= ok["time"]  # it ran from admitted until time


def _statuses(n: int, **overrides: Any) -> list[int]:
    with _client(**overrides) as client:
        return [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(n)]


def test_error_and_429_rates_are_deterministic_given_seed() -> None:
    statuses = _statuses(150, error_rate=0.2, rate_429=0.1, seed=7)
    assert set(statuses) == {200, 429, 500}
    assert 15 <= statuses.count(500) <= 45  # expected 30
    assert 5 <= statuses.count(429) <= 30  # expected 15
    assert _statuses(150, error_rate=0.2, rate_429=0.1, seed=7) == statuses
    assert _statuses(150, error_rate=0.2, rate_429=0.1, seed=8) != statuses


def test_error_body_shapes() -> None:
    with _client(error_rate=1.0) as client:
        response = client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "InternalServerError"
    with _client(rate_429=1.0) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 429


def test_no_choices_rate_answers_200_without_choices() -> None:
    """A broken gateway's answer: HTTP 200, a chat-completion body, but no `choices` (streamed: no chunks)."""
    with _client(no_choices_rate=1.0) as client:
        response = client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        body = response.json()
        assert body["object"] == "chat.completion" and "choices" not in body
        assert body["usage"]["completion_tokens"] == 0
        streamed = client.post("/v1/chat/completions", json={**CHAT, "stream": True}).text
        assert streamed.strip() == "data: [DONE]"
    statuses = _statuses(60, no_choices_rate=0.5, seed=3)
    assert statuses == [200] * 60
    with _client(no_choices_rate=0.5, seed=3) as client:
        answers = ["choices" in client.post("/v1/chat/completions", json=CHAT).json() for _ in range(60)]
    assert 15 <= answers.count(False) <= 45  # expected 30
    with _client(no_choices_rate=0.5, seed=3) as client:
        again = ["choices" in client.post("/v1/chat/completions", json=CHAT).json() for _ in range(60)]
    assert again == answers


def test_crash_after_n_requests_calls_crash() -> None:
    with _client(crash_after=2) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        # the second answer's background task ends the process once the answer is sent (the test client raises it)
        with pytest.raises(Crashed, match="after answering 2 chat requests"):
            client.post("/v1/chat/completions", json=CHAT)


def test_never_healthy() -> None:
    with _client(never_healthy=True) as client:
        assert client.get("/health").status_code == 503
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 503
        assert client.get("/metrics").status_code == 200


def test_metrics_counts_tokens_and_successes(client: AppClient) -> None:
    usage = client.post("/v1/chat/completions", json=CHAT).json()["usage"]
    text = client.get("/metrics").text
    assert f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {float(usage["prompt_tokens"])}' in text
    assert f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {float(usage["completion_tokens"])}' in text
    assert 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1.0' in text
    successes = [line for line in text.splitlines() if line.startswith("vllm:request_success_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in successes) == 1.0


def test_log_match_records_which_record_a_request_came_from(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with _client(request_log=log, log_match=r"\(#(\d+)\)") as client:
        tagged = {**CHAT, "messages": [{"role": "user", "content": "Question: how many? (#17)"}]}
        assert client.post("/v1/chat/completions", json=tagged).status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["match"] for e in entries] == ["17", None]


# -- vLLM's routes outside /v1: no API key (vLLM's key guards only /v1 paths) -------------------------------

KEY = "s3cret-key"
TEXT = {"input": "a short text"}
EXTRA_BODIES: dict[str, dict[str, Any]] = {
    "/invocations": CHAT,
    "/tokenize": {"prompt": "hello world"},
    "/detokenize": {"tokens": [1, 2, 3]},
    "/pooling": TEXT,
    "/classify": TEXT,
    "/score": {"text_1": "query", "text_2": ["one", "two"]},
    "/rerank": {"query": "query", "documents": ["one", "two", "three"]},
}
EXTRA_BAD_BODIES: list[tuple[str, Any]] = [
    ("/invocations", {"prompt": "no messages"}),
    ("/invocations", {"messages": []}),
    ("/tokenize", {"tokens": [1]}),
    ("/tokenize", {"messages": "hi"}),
    ("/detokenize", {"tokens": ["a"]}),
    ("/detokenize", {"tokens": [-1]}),
    ("/pooling", {"input": 5}),
    ("/pooling", {"input": []}),
    ("/classify", {"text": "wrong key"}),
    ("/score", {"text_1": "only one side"}),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
    ("/rerank", {"query": "q"}),
    ("/rerank", {"query": "q", "documents": ["d"], "top_n": -1}),
    ("/tokenize", [1, 2]),
    ("/score", {"model": 5, "text_1": "a", "text_2": "b"}),
]


@pytest.fixture
def keyed() -> Iterator[AppClient]:
    with _client(api_keys=(KEY,)) as c:
        yield c


@pytest.mark.parametrize("path", list(EXTRA_BODIES))
def test_routes_outside_v1_answer_without_the_key(keyed: AppClient, path: str) -> None:
    assert keyed.post(path, json=EXTRA_BODIES[path]).status_code == 200
    wrong = keyed.post(path, json=EXTRA_BODIES[path], headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 200  # like vLLM: no header check at all outside /v1
    assert keyed.post("/v1/chat/completions", json=CHAT).status_code == 401
    assert keyed.get("/v1/models").status_code == 401


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_is_health_without_the_key(keyed: AppClient, method: str) -> None:
    response = keyed.request(method, "/ping")
    assert response.status_code == 200 and response.content == b""
    with _client(api_keys=(KEY,), never_healthy=True) as loading:
        assert loading.request(method, "/ping").status_code == 503


@pytest.mark.parametrize("path", list(EXTRA_BODIES))
def test_routes_outside_v1_are_503_while_loading(path: str) -> None:
    with _client(api_keys=(KEY,), never_healthy=True) as client:
        response = client.post(path, json=EXTRA_BODIES[path])
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "ServiceUnavailableError"


@pytest.mark.parametrize(("path", "body"), EXTRA_BAD_BODIES)
def test_routes_outside_v1_reject_bad_bodies(keyed: AppClient, path: str, body: Any) -> None:
    response = keyed.post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"


@pytest.mark.parametrize("path", list(EXTRA_BODIES))
def test_routes_outside_v1_reject_invalid_json_and_unknown_models(keyed: AppClient, path: str) -> None:
    invalid = keyed.post(path, content=b"{not json", headers={"content-type": "application/json"})
    assert invalid.status_code == 400
    unknown = keyed.post(path, json={**EXTRA_BODIES[path], "model": "other"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "NotFoundError"


def _comparable(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reply.items() if k not in ("id", "created")}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(CHAT, id="text"),
        pytest.param({**CHAT, "n": 2, "max_tokens": 5}, id="n-and-max-tokens"),
        pytest.param(
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}},
            id="json-schema",
        ),
    ],
)
def test_invocations_answers_like_chat_completions(keyed: AppClient, body: dict[str, Any]) -> None:
    chat = keyed.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    invocation = keyed.post("/invocations", json=body)
    assert chat.status_code == invocation.status_code == 200
    assert invocation.json()["object"] == "chat.completion"
    assert _comparable(invocation.json()) == _comparable(chat.json())
    streamed = keyed.post("/invocations", json={**body, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.rstrip().endswith("data: [DONE]")


def test_invocations_is_a_chat_request_for_log_metrics_and_faults(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with _client(api_keys=(KEY,), request_log=log, crash_after=2) as client:
        assert client.post("/invocations", json=CHAT).status_code == 200
        assert client.post("/invocations", json={**CHAT, "model": "nope"}).status_code == 404
        assert client.post("/tokenize", json={"messages": CHAT["messages"]}).status_code == 200
        metrics = client.get("/metrics").text
        assert 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1.0' in metrics
        with pytest.raises(Crashed, match="after answering 2 chat requests"):
            client.post("/invocations", json=CHAT)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    rows = [(e["path"], e["status"], e["model"], e["n_messages"], e["auth_present"]) for e in entries]
    assert rows[:3] == [
        ("/invocations", 200, "m", 1, False),
        ("/invocations", 404, "nope", 1, False),
        ("/tokenize", 200, "m", 1, False),
    ]
    assert entries[0]["admitted"] is not None and entries[2]["admitted"] is None


def test_tokenize_and_detokenize_shapes(client: AppClient) -> None:
    prompt = client.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True}).json()
    assert set(prompt) == {"count", "max_model_len", "tokens", "token_strs"}
    assert prompt["count"] == len(prompt["tokens"]) == 3  # one token per four characters
    assert prompt["token_strs"] == ["hell", "o wo", "rld"]
    assert prompt["max_model_len"] == 4096
    assert all(isinstance(t, int) and 0 <= t < 32000 for t in prompt["tokens"])
    again = client.post("/tokenize", json={"model": "alias", "prompt": "hello world"}).json()
    assert again["tokens"] == prompt["tokens"] and again["token_strs"] is None
    chat = client.post("/tokenize", json={"messages": CHAT["messages"]}).json()
    usage = client.post("/v1/chat/completions", json=CHAT).json()["usage"]
    assert chat["count"] == len(chat["tokens"]) == usage["prompt_tokens"]  # as the chat route counts them
    text = client.post("/detokenize", json={"tokens": prompt["tokens"]}).json()
    assert set(text) == {"prompt"} and len(text["prompt"].split()) == 3
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


def test_pooling_and_classify_shapes(client: AppClient) -> None:
    pooled = client.post("/pooling", json={"input": ["one", "two"]}).json()
    assert pooled["object"] == "list" and pooled["model"] == "m" and pooled["id"].startswith("pool-")
    assert [d["index"] for d in pooled["data"]] == [0, 1]
    assert all(d["object"] == "pooling" for d in pooled["data"])
    vector = pooled["data"][0]["data"]
    assert len(vector) == 16 and abs(sum(x * x for x in vector) - 1) < 1e-4
    assert client.post("/pooling", json={"input": "one"}).json()["data"][0]["data"] == vector
    assert pooled["usage"]["prompt_tokens"] == pooled["usage"]["total_tokens"] == 2
    assert len(client.post("/pooling", json={"messages": CHAT["messages"]}).json()["data"]) == 1
    classified = client.post("/classify", json={"model": "alias", "input": ["one", "two"]}).json()
    assert classified["object"] == "list" and classified["model"] == "alias"
    for index, item in enumerate(classified["data"]):
        assert item["index"] == index and item["num_classes"] == 2
        assert abs(sum(item["probs"]) - 1) < 1e-6
        assert item["label"] == ("LABEL_0" if item["probs"][0] >= item["probs"][1] else "LABEL_1")


def test_score_and_rerank_shapes(client: AppClient) -> None:
    scored = client.post("/score", json={"text_1": "query", "text_2": ["one", "two", "three"]}).json()
    assert scored["object"] == "list" and scored["model"] == "m"
    assert [(d["index"], d["object"]) for d in scored["data"]] == [(0, "score"), (1, "score"), (2, "score")]
    scores = [d["score"] for d in scored["data"]]
    assert all(0 <= s < 1 for s in scores)
    pairwise = client.post("/score", json={"queries": ["query", "query"], "documents": ["one", "two"]}).json()
    assert [d["score"] for d in pairwise["data"]] == scores[:2]
    reranked = client.post("/rerank", json={"query": "query", "documents": ["one", "two", "three"]}).json()
    assert set(reranked) == {"id", "model", "usage", "results"}
    results = reranked["results"]
    assert [r["relevance_score"] for r in results] == sorted(scores, reverse=True)
    assert all(r["document"]["text"] == ["one", "two", "three"][r["index"]] for r in results)
    assert all(scores[r["index"]] == r["relevance_score"] for r in results)  # the same as /score
    top = client.post("/rerank", json={"query": "query", "documents": ["one", "two", "three"], "top_n": 1})
    assert top.json()["results"] == results[:1]
    assert reranked["usage"]["total_tokens"] > 0


def test_embeddings_are_deterministic_and_need_the_key() -> None:
    with _client(api_keys=(KEY,)) as keyed:
        assert keyed.post("/v1/embeddings", json={"model": "m", "input": ["one"]}).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        body = keyed.post("/v1/embeddings", json={"model": "alias", "input": ["one", "two"]}, headers=auth).json()
        assert body["object"] == "list" and body["model"] == "alias" and body["id"].startswith("embd-")
        assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "embedding"), (1, "embedding")]
        one = keyed.post("/v1/embeddings", json={"model": "m", "input": "one"}, headers=auth).json()
        assert one["data"][0]["embedding"] == body["data"][0]["embedding"] != body["data"][1]["embedding"]
        pooled = keyed.post("/pooling", json={"input": "one"}).json()["data"][0]["data"]
        assert one["data"][0]["embedding"] == pooled  # the text's one vector, whichever route asks
        assert keyed.post("/v1/embeddings", json={"model": "x", "input": "one"}, headers=auth).status_code == 404
        assert keyed.post("/v1/embeddings", json={"model": "m", "input": []}, headers=auth).status_code == 400


def test_a_rate_limited_key_answers_429_with_its_headers_and_headers_on_every_answer() -> None:
    with _client(rate_limit_rpm=2) as client:
        first, second, third = (client.post("/v1/chat/completions", json=CHAT) for _ in range(3))
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
    assert first.headers["x-ratelimit-limit-requests"] == "2" and first.headers["x-ratelimit-remaining-requests"] == "1"
    assert third.headers["retry-after"] == "30" and third.headers["x-ratelimit-remaining-requests"] == "0"
    assert third.json()["error"]["code"] == 429 and "requests" in third.json()["error"]["message"]
    with _client(rate_limit_in_flight=1, rate_headers="none") as client:
        answer = client.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200 and not any(h.startswith("x-ratelimit") for h in answer.headers)
