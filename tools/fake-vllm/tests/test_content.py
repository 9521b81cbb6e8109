from __future__ import annotations

import json
from typing import Any

import pytest

from fake_vllm.content import find_prompt_schema, generate_replies, request_digest

SCHEMA = {
    "type": "object",
    "properties": {"score": {"enum": [1, 2, 3]}, "why": {"type": "string"}},
    "required": ["score", "why"],
}


def _body(content: str = "Tell me about owls.", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def test_reply_is_a_pure_function_of_the_request() -> None:
    first = generate_replies(_body(temperature=0.7))
    assert generate_replies(_body(temperature=0.7)) == first
    assert generate_replies(_body(temperature=0.7, stream=True, user="x")) == first  # transport-only keys
    assert generate_replies(_body(temperature=0.2)) != first
    assert generate_replies(_body("Tell me about cats.", temperature=0.7)) != first
    assert generate_replies({**_body(temperature=0.7), "model": "other"}) != first


def test_digest_ignores_key_order() -> None:
    assert request_digest({"a": 1, "b": [1, 2]}) == request_digest({"b": [1, 2], "a": 1})


def test_n_choices_differ() -> None:
    replies = generate_replies(_body(n=3))
    assert len(replies) == 3
    assert len({r.content for r in replies}) == 3


def test_max_tokens_truncates_with_finish_reason_length() -> None:
    (reply,) = generate_replies(_body(max_tokens=3))
    assert reply.finish_reason == "length"
    assert reply.completion_tokens <= 3


def test_prompt_schema_gives_fenced_json() -> None:
    prompt = (
        "Judge it.\n\n* The JSON format is given as a JSON Schema description within <response_schema> markup tags."
        f"\n\n<response_schema>\n{json.dumps(SCHEMA)}\n</response_schema>"
    )
    (reply,) = generate_replies(_body(prompt))
    assert reply.content.startswith("```json\n") and reply.content.endswith("\n```")
    value = json.loads(reply.content.removeprefix("```json\n").removesuffix("\n```"))
    assert value["score"] in (1, 2, 3) and isinstance(value["why"], str)


def test_find_prompt_schema_prefers_newest_message() -> None:
    old = {"role": "user", "content": '<response_schema>{"type": "integer"}</response_schema>'}
    new = {
        "role": "user",
        "content": [{"type": "text", "text": '<response_schema>{"type": "string"}</response_schema>'}],
    }
    assert find_prompt_schema([old, new]) == {"type": "string"}
    assert find_prompt_schema([{"role": "user", "content": "no schema <response_schema> here"}]) is None


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}, id="rf"
        ),
        pytest.param({"guided_json": SCHEMA}, id="guided-json"),
        pytest.param({"structured_outputs": {"json": json.dumps(SCHEMA)}}, id="structured-outputs"),
    ],
)
def test_guided_json_is_bare_json(extra: dict[str, Any]) -> None:
    (reply,) = generate_replies(_body(**extra))
    value = json.loads(reply.content)
    assert value["score"] in (1, 2, 3)


def test_json_object_mode() -> None:
    (reply,) = generate_replies(_body(response_format={"type": "json_object"}))
    assert isinstance(json.loads(reply.content), dict)


def test_guided_choice() -> None:
    (reply,) = generate_replies(_body(guided_choice=["yes", "no"]))
    assert reply.content in ("yes", "no")


def test_code_prompt_gives_fenced_code() -> None:
    (reply,) = generate_replies(_body("Write a query.\n\n* Your response must be code written in sql.\n* More."))
    assert reply.content.startswith("```sql\n")


@pytest.mark.dd
@pytest.mark.parametrize("kind", ["judge", "structured", "code", "text"])
def test_data_designer_parsers_accept_replies(kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """DD's own prompt renderer and response parser (no engine run) accept what the server generates."""
    monkeypatch.setenv("DATA_DESIGNER_HOME", str(tmp_path))
    monkeypatch.setenv("NEMO_TELEMETRY_ENABLED", "false")
    dd = pytest.importorskip("data_designer.config")
    renderer = pytest.importorskip("data_designer.engine.column_generators.utils.prompt_renderer")
    common = {"name": "col", "model_alias": "gen", "prompt": "Consider {{ topic }}."}
    column = {
        "judge": lambda: dd.LLMJudgeColumnConfig(
            **common,
            scores=[
                dd.Score(name="Accuracy", description="d", options={1: "bad", 5: "good"}),
                dd.Score(name="Style", description="d", options={"A": "x", "B": "y", 3: "z"}),
            ],
        ),
        "structured": lambda: dd.LLMStructuredColumnConfig(**common, output_format=SCHEMA),
        "code": lambda: dd.LLMCodeColumnConfig(**common, code_lang="python"),
        "text": lambda: dd.LLMTextColumnConfig(**common),
    }[kind]()
    recipe = renderer.create_response_recipe(column)
    prompt = renderer.RecordBasedPromptRenderer(recipe).render(
        prompt_template=column.prompt, record={"topic": "owls"}, prompt_type=renderer.PromptType.USER_PROMPT
    )
    for temperature in (0.1, 0.5, 0.9):
        (reply,) = generate_replies(_body(prompt, temperature=temperature))
        parsed = recipe.parse(reply.content)
        if kind == "judge":
            assert parsed.Accuracy.score in (1, 5)
            assert parsed.Style.score in ("A", "B", 3)


@pytest.mark.parametrize(
    ("prompt", "needles"),
    [
        pytest.param("Tables: orders(id, customer_id, total)\nWrite a query", ["FROM orders", "GROUP BY"], id="one"),
        pytest.param(
            "Tables: customers(id, name); orders(id, customer_id, total)\nWrite a query",
            ["FROM customers AS t", "JOIN orders AS o ON o.customer_id = t.id"],
            id="join",
        ),
        pytest.param("Write a query", ["SELECT 1 AS answer;"], id="no-tables"),
    ],
)
def test_sql_code_columns_get_a_query_over_the_prompts_tables(prompt: str, needles: list[str]) -> None:
    body = {
        "messages": [{"role": "user", "content": f"{prompt}\nYour response must be code written in sql:postgres. "}]
    }
    text = generate_replies(body)[0].content
    assert text.startswith("```sql:postgres\n") and text.endswith("\n```")
    for needle in needles:
        assert needle in text


_LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a term up.",
        "parameters": {
            "type": "object",
            "properties": {"term": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 3}},
            "required": ["term", "limit"],
        },
    },
}
_OTHER = {"type": "function", "function": {"name": "other", "parameters": {"type": "object", "properties": {}}}}


def test_tools_without_a_result_get_one_call_of_the_first_tool() -> None:
    (reply,) = generate_replies(_body("Find owls in the archive.", tools=[_LOOKUP, _OTHER]))
    assert reply.finish_reason == "tool_calls" and reply.content == ""
    (call,) = reply.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == "lookup"
    arguments = json.loads(call["function"]["arguments"])
    assert arguments["term"] == "Find owls in the archive."  # from the prompt
    assert isinstance(arguments["limit"], int) and 1 <= arguments["limit"] <= 3  # valid against the schema
    assert generate_replies(_body("Find owls in the archive.", tools=[_LOOKUP, _OTHER])) == [reply]


def test_a_tool_result_is_quoted_and_ends_the_loop() -> None:
    messages = [
        {"role": "user", "content": "Find owls."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "OWL-42"}]},
    ]
    (reply,) = generate_replies({"model": "m", "messages": messages, "tools": [_LOOKUP]})
    assert reply.content == "Tool result: OWL-42" and reply.finish_reason == "stop" and not reply.tool_calls


def test_tool_choice_none_answers_as_without_tools() -> None:
    (reply,) = generate_replies(_body("Find owls.", tools=[_LOOKUP], tool_choice="none"))
    assert not reply.tool_calls and reply.content
