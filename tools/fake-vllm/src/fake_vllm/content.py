"""Deterministic chat replies: a pure function of the request (model, messages, sampling parameters).

The request body, minus transport-only keys, is canonicalised and hashed with sha256; the digest seeds a
``random.Random`` per choice. What is generated depends on what the request asks for:

1. ``response_format`` ``json_schema`` (or vLLM's ``guided_json`` / ``structured_outputs.json``): a bare JSON
   instance of that schema, as vLLM's guided decoding returns it.
2. ``guided_choice`` / ``structured_outputs.choice``: one of the choices.
3. ``response_format`` ``json_object``: a bare JSON object (an instance of the prompt's schema, if any).
4. A ``<response_schema>...</response_schema>`` JSON schema in the prompt (Data Designer's judge and
   structured columns): an instance wrapped in a ```` ```json ```` fence, which is what DD's parser reads.
5. "Your response must be code written in LANG." (DD's code columns): a small fenced ```` ```LANG ```` block.
6. Otherwise: plain sentences from a fixed vocabulary, cut to ``max_tokens`` (``finish_reason="length"``).

Tool calling comes first: a request that offers ``tools`` (and no ``tool_choice: none``) and whose conversation
holds no ``tool`` message yet is answered with one call of the first tool (``finish_reason="tool_calls"``), its
arguments an instance of the tool's parameter schema, string fields taken from the last user message; once a
``tool`` message is there, the answer is ``Tool result: <that message's text>`` (so a dataset shows what the
tool returned).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fake_vllm.schema_instance import SchemaError, instance_for
from fake_vllm.words import paragraph

# Keys that do not change what a real model would sample.
_TRANSPORT_KEYS = frozenset({"stream", "stream_options", "user", "metadata", "store", "request_id"})
_SCHEMA_TAG = re.compile(r"<response_schema>\s*(\{.*?\})\s*</response_schema>", re.DOTALL)
_CODE_LANG = re.compile(r"Your response must be code written in ([\w:+#.-]+?)\.\s")
_CODE_SNIPPETS = {
    "python": "def answer() -> int:\n    return 42",
    "sql": "SELECT 1 AS answer;",
    "bash": "echo answer",
    "javascript": "function answer() {\n  return 42;\n}",
    "typescript": "function answer(): number {\n  return 42;\n}",
}


@dataclass(frozen=True)
class Reply:
    """One generated choice."""

    content: str
    finish_reason: str
    completion_tokens: int
    tool_calls: tuple[dict[str, Any], ...] = ()
    """OpenAI ``tool_calls`` entries (``content`` is then empty)."""


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: one token per four characters, at least one for non-empty text."""
    return math.ceil(len(text) / 4)


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message whose ``content`` is a string or a list of ``{"type": "text"}`` parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Estimated prompt length: the text estimate plus four tokens of chat-template overhead per message."""
    return sum(estimate_tokens(message_text(m)) + 4 for m in messages)


def request_digest(body: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the request without transport-only keys."""
    relevant = {k: v for k, v in body.items() if k not in _TRANSPORT_KEYS}
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def generate_replies(body: Mapping[str, Any]) -> list[Reply]:
    """``n`` (default 1) deterministic choices for a validated chat-completion request body."""
    digest = request_digest(body)
    n = body.get("n") or 1
    return [_generate_one(body, random.Random(f"{digest}#{index}")) for index in range(int(n))]


def _generate_one(body: Mapping[str, Any], rng: random.Random) -> Reply:
    messages: list[Mapping[str, Any]] = list(body.get("messages") or [])
    tool = _tool_reply(body, messages, rng)
    if tool is not None:
        return tool
    guided = _guided_schema(body)
    if guided is not None:
        return _json_reply(guided, rng, fenced=False)
    choices = _guided_choices(body)
    if choices:
        text = str(rng.choice(choices))
        return Reply(text, "stop", estimate_tokens(text))
    prompt_schema = find_prompt_schema(messages)
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_object":
        schema = prompt_schema if prompt_schema is not None else {"properties": {"answer": {"type": "string"}}}
        return _json_reply(schema, rng, fenced=False)
    if prompt_schema is not None:
        return _json_reply(prompt_schema, rng, fenced=True)
    lang = _code_language(messages)
    if lang is not None:
        base = lang.split(":")[0]
        code = _sql_for(messages, rng) if base == "sql" else _CODE_SNIPPETS.get(base, f"// answer in {lang}")
        text = f"```{lang}\n{code}\n```"
        return Reply(text, "stop", estimate_tokens(text))
    return _text_reply(body, rng)


def _tool_reply(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], rng: random.Random) -> Reply | None:
    """A call of the first offered tool, or the answer that quotes the last tool result; None without tools."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    results = [m for m in messages if m.get("role") == "tool"]
    if results:
        text = f"Tool result: {message_text(results[-1])}"
        return Reply(text, "stop", estimate_tokens(text))
    function = tools[0].get("function") if isinstance(tools[0], Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        return None
    arguments = json.dumps(_tool_arguments(function.get("parameters"), messages, rng), ensure_ascii=False)
    call = {
        "id": f"call_{rng.getrandbits(64):016x}",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
    return Reply("", "tool_calls", estimate_tokens(arguments) + 1, (call,))


_PLAIN_STRING_KEYS = frozenset({"type", "title", "description"})


def _tool_arguments(schema: Any, messages: Sequence[Mapping[str, Any]], rng: random.Random) -> Any:
    """An instance of a tool's parameter schema; each top-level plain string property holds the start of the last
    user message (so the call follows from the prompt)."""
    if not isinstance(schema, Mapping) or not schema:
        return {}
    try:
        value = instance_for(schema, rng)
    except SchemaError:
        return {}
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    prompt = " ".join((users[-1] if users else "").split())[:80]
    properties = schema.get("properties")
    if isinstance(value, dict) and isinstance(properties, Mapping) and prompt:
        for name, spec in properties.items():
            if isinstance(spec, Mapping) and spec.get("type") == "string" and set(spec) <= _PLAIN_STRING_KEYS:
                value[name] = prompt
    return value


_TABLE = re.compile(r"\b([A-Za-z_]\w*)\(([A-Za-z_][\w, ]*)\)")


def _sql_for(messages: Sequence[Mapping[str, Any]], rng: random.Random) -> str:
    """A plausible query over the tables the prompt names as ``table(col, col, ...)``, deterministic per prompt."""
    text = "\n".join(message_text(m) for m in messages)
    tables = [(name, [c.strip() for c in cols.split(",") if c.strip()]) for name, cols in _TABLE.findall(text)]
    if not tables:
        return _CODE_SNIPPETS["sql"]
    table, columns = tables[0]
    group = rng.choice(columns[1:] or columns)
    if len(tables) > 1:
        other, other_cols = tables[1]
        key = next((c for c in other_cols if c.endswith("_id")), other_cols[0])
        return (
            f"SELECT t.{group}, COUNT(*) AS n\nFROM {table} AS t\nJOIN {other} AS o ON o.{key} = t.{columns[0]}\n"
            f"GROUP BY t.{group}\nORDER BY n DESC\nLIMIT {rng.choice([5, 10, 20])};"
        )
    return f"SELECT {group}, COUNT(*) AS n\nFROM {table}\nGROUP BY {group}\nORDER BY n DESC;"


def _text_reply(body: Mapping[str, Any], rng: random.Random) -> Reply:
    text = paragraph(rng, 12, 60)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 and estimate_tokens(text) > limit:
        cut = text[: limit * 4]
        cut = cut.rsplit(" ", 1)[0] if " " in cut else cut
        return Reply(cut, "length", estimate_tokens(cut))
    return Reply(text, "stop", estimate_tokens(text))


def _json_reply(schema: Mapping[str, Any], rng: random.Random, *, fenced: bool) -> Reply:
    try:
        value = instance_for(schema, rng)
    except SchemaError as exc:
        text = f"I cannot produce JSON for this schema: {exc}"
        return Reply(text, "stop", estimate_tokens(text))
    serialized = json.dumps(value, ensure_ascii=False)
    text = f"```json\n{serialized}\n```" if fenced else serialized
    return Reply(text, "stop", estimate_tokens(text))


def find_prompt_schema(messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The last ``<response_schema>`` JSON object found in the messages, searching from the newest."""
    for message in reversed(messages):
        for match in reversed(_SCHEMA_TAG.findall(message_text(message))):
            try:
                schema = json.loads(match)
            except ValueError:
                continue
            if isinstance(schema, Mapping):
                return schema
    return None


def _code_language(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for message in reversed(messages):
        found = _CODE_LANG.search(message_text(message) + "\n")
        if found:
            return found.group(1)
    return None


def _guided_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        if isinstance(spec, Mapping):
            schema = spec.get("schema", spec.get("json_schema"))
            return schema if isinstance(schema, Mapping) else {}
        return {}
    candidates = [body.get("guided_json")]
    structured = body.get("structured_outputs")
    if isinstance(structured, Mapping):
        candidates.append(structured.get("json"))
    for candidate in candidates:
        if isinstance(candidate, str):
            try:
                candidate = json.loads(candidate)
            except ValueError:
                continue
        if isinstance(candidate, Mapping):
            return candidate
    return None


def _guided_choices(body: Mapping[str, Any]) -> list[Any]:
    structured = body.get("structured_outputs")
    choice = body.get("guided_choice")
    if isinstance(structured, Mapping) and structured.get("choice"):
        choice = structured.get("choice")
    return list(choice) if isinstance(choice, list) else []
