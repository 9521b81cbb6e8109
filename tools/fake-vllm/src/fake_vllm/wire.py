"""vLLM's (OpenAI's) shapes on the wire: error bodies, a chat request's body checked, the answer streamed as
server-sent events, the usage an answer reports."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fake_vllm.content import Reply
from fake_vllm.extras import BadRequest, validate_messages

MAX_N = 16


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's (OpenAI's) error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage_of(response: Response) -> dict[str, int]:
    """The token counts an answer's ``usage`` reports (none for an error or a body that is not JSON)."""
    try:
        usage = json.loads(bytes(response.body)).get("usage") if response.status_code == 200 else None
    except (ValueError, AttributeError, TypeError):
        return {}
    if not isinstance(usage, dict):
        return {}
    return {k: int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")}


def bad_request(exc: BadRequest) -> Response:
    return JSONResponse(error_body(str(exc), "BadRequestError", 400, exc.param), status_code=400)


async def read_json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from None


def validate_chat(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    validate_messages(body.get("messages"))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("`model` must be a string.", "model")
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N):
        raise BadRequest(f"`n` must be an integer between 1 and {MAX_N}.", "n")
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise BadRequest(f"`{key}` must be a positive integer.", key)
    return body


async def sse(
    completion_id: str, created: int, model: str, replies: list[Reply], n_prompt: int, *, include_usage: bool
) -> AsyncIterator[str]:
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
    for index, reply in enumerate(replies):
        delta: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(reply.tool_calls)]
        first = {"index": index, "delta": delta, "finish_reason": None}
        yield f"data: {json.dumps({**base, 'choices': [first]})}\n\n"
        last = {"index": index, "delta": {}, "finish_reason": reply.finish_reason}
        yield f"data: {json.dumps({**base, 'choices': [last]})}\n\n"
    if include_usage:
        generated = sum(r.completion_tokens for r in replies)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": generated, "total_tokens": n_prompt + generated}
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


async def http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "Internal Server Error"
    return JSONResponse({"detail": detail}, status_code=status)
