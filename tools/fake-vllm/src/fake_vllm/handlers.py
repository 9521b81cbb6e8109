"""The request handlers: vLLM's OpenAI-compatible endpoints (and SGLang's) plus the stand-in behaviours.

Capacity model: with ``capacity`` C > 0 at most C chat requests are processed at once; the rest wait in a
FIFO queue (``vllm:num_requests_waiting``). A request admitted while k others are running takes
``latency * (1 + k / C)`` seconds, so one request alone takes ``latency`` and a full server about twice that:
throughput rises with concurrency and saturates near ``C / (2 * latency)`` requests/s. With C = 0 there is no
limit and every request takes ``latency``. C is ``--fake-capacity``, else vLLM's ``--max-num-seqs``.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from fake_vllm.content import Reply, generate_replies, prompt_tokens
from fake_vllm.extras import MAX_MODEL_LEN, BadRequest, Builder
from fake_vllm.faults import Fault
from fake_vllm.metrics import CONTENT_TYPE
from fake_vllm.request_log import RequestLogEntry, now
from fake_vllm.sglang_health import health_generate
from fake_vllm.state import ServerState
from fake_vllm.version import version
from fake_vllm.wire import bad_request, error_body, read_json, sse, usage_of, validate_chat


class Handlers:
    """The endpoints of one server, over its per-process :class:`~fake_vllm.state.ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.settings = state.settings

    # -- helpers ----------------------------------------------------------------------------------

    def _auth(self, request: Request) -> tuple[bool, bool]:
        header = request.headers.get("authorization")
        if header is None:
            return False, False
        if not self.settings.requires_key:
            return True, True
        return True, any(header == f"Bearer {key}" for key in self.settings.api_keys)

    def _finish(
        self,
        request: Request,
        response: Response,
        *,
        model: str | None = None,
        n_messages: int | None = None,
        admitted: float | None = None,
        match: str | None = None,
    ) -> Response:
        if self.state.request_log is not None:
            present, valid = self._auth(request)
            self.state.request_log.write(
                RequestLogEntry(
                    time=now(),
                    method=request.method,
                    path=request.url.path,
                    status=response.status_code,
                    model=model,
                    auth_present=present,
                    authorized=valid,
                    n_messages=n_messages,
                    admitted=admitted,
                    match=match,
                    client_request_id=request.headers.get("x-client-request-id"),
                    **usage_of(response),
                )
            )
        return response

    def _match(self, messages: list[Any]) -> str | None:
        """``--fake-log-match``: its first match in the messages' text (group 1 if it has one), for the log."""
        if self.settings.log_match is None:
            return None
        text = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        found = re.search(self.settings.log_match, text)
        if found is None:
            return None
        return found.group(1) if found.re.groups else found.group(0)

    def _reject_v1(self, request: Request) -> Response | None:
        """The API-key middleware, then the loading check. vLLM's guards only /v1 paths; SGLang's every path but
        ``/health*`` and ``/metrics*``, whose handlers never call this."""
        if self.settings.requires_key and not self._auth(request)[1]:
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return self._reject_loading()

    def _reject_loading(self) -> Response | None:
        """503 while the model loads (every model route, with or without the key check)."""
        if not self.state.ready:
            return JSONResponse(
                error_body("The model is still loading.", "ServiceUnavailableError", 503), status_code=503
            )
        return None

    def _unknown_model(self, model: str) -> Response | None:
        if model in self.settings.served_model_names or self.settings.engine == "sglang":  # SGLang ignores it
            return None
        return JSONResponse(
            error_body(f"The model `{model}` does not exist.", "NotFoundError", 404, "model"), status_code=404
        )

    # -- endpoints ------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return self._finish(request, Response(status_code=200 if self.state.ready else 503))

    async def sglang_health(self, request: Request) -> Response:
        """SGLang's ``/health`` and ``/health_generate``: a one-token generation (:mod:`fake_vllm.sglang_health`)."""
        status = await health_generate(self.state, request.url.path)
        return self._finish(request, Response(status_code=status))

    async def version(self, request: Request) -> Response:
        return self._finish(request, JSONResponse({"version": version()}))

    async def get_model_info(self, request: Request) -> Response:
        """SGLang's ``GET /get_model_info`` (behind its API key)."""
        rejected = self._reject_v1(request)
        if rejected is not None:
            return self._finish(request, rejected)
        info = {"model_path": self.settings.model, "tokenizer_path": self.settings.model, "is_generation": True}
        return self._finish(request, JSONResponse(info))

    async def metrics(self, request: Request) -> Response:
        if self.settings.metrics_auth and self.settings.requires_key and not self._auth(request)[1]:
            return self._finish(request, JSONResponse({"error": "Unauthorized"}, status_code=401))
        body = self.state.metrics.render()
        return self._finish(request, PlainTextResponse(body, media_type=CONTENT_TYPE))

    async def models(self, request: Request) -> Response:
        rejected = self._reject_v1(request)
        if rejected is not None:
            return self._finish(request, rejected)
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.state.created,
                "owned_by": self.settings.engine,
                "root": self.settings.model,
                "parent": None,
                "max_model_len": MAX_MODEL_LEN,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_URL, name).hex}",
                        "object": "model_permission",
                        "created": self.state.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.settings.served_model_names
        ]
        return self._finish(request, JSONResponse({"object": "list", "data": data}))

    async def _decoded(self, request: Request, rejected: Response | None) -> tuple[Any, Response | None]:
        """The request's JSON body, or the (logged) response that ends the request: ``rejected`` (the key or
        loading check's answer) or a 400 for a body that is not JSON."""
        if rejected is not None:
            return None, self._finish(request, rejected)
        try:
            return await read_json(request), None
        except BadRequest as exc:
            return None, self._finish(request, bad_request(exc))

    async def chat_completions(self, request: Request) -> Response:
        raw, done = await self._decoded(request, self._reject_v1(request))
        if done is not None:
            return done
        return await self._chat(request, raw)

    async def invocations(self, request: Request) -> Response:
        """SageMaker's ``POST /invocations`` (no API key, like every path outside /v1): a chat body (one with
        ``messages``) is answered exactly as ``/v1/chat/completions`` answers it; the stand-in has no other
        handler, so anything else is vLLM's 400 "Cannot find suitable handler"."""
        raw, done = await self._decoded(request, self._reject_loading())
        if done is not None:
            return done
        if isinstance(raw, dict) and "messages" in raw:
            return await self._chat(request, raw)
        message = "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest']"
        return self._finish(request, bad_request(BadRequest(message)))

    def extra(self, builder: Builder, *, v1: bool = False) -> Callable[[Request], Awaitable[Response]]:
        """A handler for one of vLLM's routes outside /v1 (``extras.BUILDERS``): no API key, like vLLM; or, with
        ``v1``, under /v1 (``extras.V1_BUILDERS``): the key checked first. Then the loading check, the body (400)
        and the model name (404), then the builder's deterministic answer."""

        async def handle(request: Request) -> Response:
            body, done = await self._decoded(request, self._reject_v1(request) if v1 else self._reject_loading())
            if done is not None:
                return done
            n_messages: int | None = None
            model: str | None = None
            try:
                if not isinstance(body, dict):
                    raise BadRequest("The request body must be a JSON object.")
                if isinstance(body.get("messages"), list):
                    n_messages = len(body["messages"])
                model = body.get("model") or self.settings.primary_name
                if not isinstance(model, str):
                    raise BadRequest("`model` must be a string.", "model")
                unknown = self._unknown_model(model)
                if unknown is not None:
                    return self._finish(request, unknown, model=model, n_messages=n_messages)
                payload = builder(body, model)
            except BadRequest as exc:
                model = model if isinstance(model, str) else None
                return self._finish(request, bad_request(exc), model=model, n_messages=n_messages)
            return self._finish(request, JSONResponse(payload), model=model, n_messages=n_messages)

        return handle

    async def _chat(self, request: Request, raw: Any) -> Response:
        """A chat completion for a decoded body, after the route's own checks (key, loading)."""
        try:
            body = validate_chat(raw)
        except BadRequest as exc:
            return self._finish(request, bad_request(exc))
        n_messages = len(body["messages"])
        match = self._match(body["messages"])
        model = body.get("model") or self.settings.primary_name
        unknown = self._unknown_model(model)
        if unknown is not None:
            return self._finish(request, unknown, model=model, n_messages=n_messages)

        limiter = self.state.limiter
        if limiter is None:
            return await self._admitted(request, body, model=model, n_messages=n_messages, match=match)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        admission = limiter.admit(prompt_tokens(body["messages"]) + int(max_tokens))
        if not admission.admitted:
            limited = JSONResponse(
                error_body(
                    f"fake-vllm: rate limit reached for {admission.reason} (--fake-rate-limit-*)",
                    "rate_limit_exceeded",
                    429,
                ),
                status_code=429,
                headers=admission.headers,
            )
            return self._finish(request, limited, model=model, n_messages=n_messages)
        try:
            response = await self._admitted(request, body, model=model, n_messages=n_messages, match=match)
        finally:
            limiter.done()
        response.headers.update(limiter.headers() if response.status_code != 429 else {})
        return response

    async def _admitted(
        self, request: Request, body: dict[str, Any], *, model: str, n_messages: int, match: str | None
    ) -> Response:
        """A chat request past the key's rate limit: the outage file, the gate, the fault draw, the answer."""
        down = _outage(self.settings.outage)
        if down == 429:
            limited = JSONResponse(
                error_body("fake-vllm: rate limit exceeded (outage file)", "RateLimitError", 429),
                status_code=429,
                headers={"Retry-After": "1"},
            )
            return self._finish(request, limited, model=model, n_messages=n_messages)
        if down == 500:
            failing = JSONResponse(
                error_body("fake-vllm: internal server error (outage file)", "InternalServerError", 500),
                status_code=500,
            )
            return self._finish(request, failing, model=model, n_messages=n_messages)
        gated = self.settings.gate_model is None or model == self.settings.gate_model
        if self.state.gate is not None and gated:
            self.state.metrics.waiting += 1
            try:
                await self.state.gate.admit()
            finally:
                self.state.metrics.waiting -= 1
        fault = self.state.faults.next_chat_request()
        if fault is Fault.CRASH:  # the server dies once the requests before this one have their answers
            await self.state.doomed.wait()
        response: Response | None = None
        try:
            response = await self._answer(request, body, fault, model=model, n_messages=n_messages, match=match)
            return response
        finally:
            self.state.answer_counted(response)

    async def _answer(
        self, request: Request, body: dict[str, Any], fault: Fault, *, model: str, n_messages: int, match: str | None
    ) -> Response:
        """The answer to an admitted chat request whose fault is decided: an injected error or the completion."""
        if fault is Fault.ERROR_500:
            response = JSONResponse(
                error_body("fake-vllm: injected internal server error", "InternalServerError", 500),
                status_code=500,
            )
            return self._finish(request, response, model=model, n_messages=n_messages)
        if fault is Fault.ERROR_429:
            response = JSONResponse(
                error_body("fake-vllm: injected rate limit", "RateLimitError", 429), status_code=429
            )
            return self._finish(request, response, model=model, n_messages=n_messages)

        replies, seconds, admitted = await self._process({**body, "model": model})
        self.state.produced()
        if fault is Fault.NO_CHOICES:
            replies = []  # a 200 answer whose body has no `choices` (a broken gateway or server)
        n_prompt = prompt_tokens(body["messages"])
        n_generated = sum(r.completion_tokens for r in replies)
        for reply in replies:
            self.state.metrics.record_success(
                finish_reason=reply.finish_reason,
                prompt=n_prompt,
                generated=reply.completion_tokens,
                seconds=seconds,
            )
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            stream = sse(completion_id, created, model, replies, n_prompt, include_usage=include_usage)
            streaming = StreamingResponse(stream, media_type="text/event-stream")
            return self._finish(request, streaming, model=model, n_messages=n_messages, admitted=admitted, match=match)
        payload = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": index,
                    "message": {
                        "role": "assistant",
                        "content": None if reply.tool_calls else reply.content,
                        "tool_calls": list(reply.tool_calls),
                    },
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                    "stop_reason": None,
                }
                for index, reply in enumerate(replies)
            ],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_generated,
                "total_tokens": n_prompt + n_generated,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
        }
        if fault is Fault.NO_CHOICES:
            del payload["choices"]
        return self._finish(
            request, JSONResponse(payload), model=model, n_messages=n_messages, admitted=admitted, match=match
        )

    async def _process(self, body: Mapping[str, Any]) -> tuple[list[Reply], float, float]:
        """Queue for a slot, hold it for the modelled latency; return the replies, the e2e seconds and when the
        request got its slot (epoch s: the request runs from then until the log's ``time``)."""
        metrics = self.state.metrics
        slots = self.state.slots
        started = time.monotonic()
        metrics.waiting += 1
        try:
            if slots is not None:
                await slots.acquire()
        finally:
            metrics.waiting -= 1
        admitted = now()
        others = metrics.running
        metrics.running += 1
        try:
            replies = generate_replies(body)
            capacity = self.settings.capacity
            delay = self.settings.latency * (1 + others / capacity) if capacity > 0 else self.settings.latency
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            metrics.running -= 1
            if slots is not None:
                slots.release()
        return replies, time.monotonic() - started, admitted


def _outage(path: Path | None) -> int | None:
    """The status ``--fake-outage``'s file says every chat request gets now (500 or 429), or None."""
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text in {"500", "429"} else None
