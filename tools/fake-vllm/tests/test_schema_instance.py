from __future__ import annotations

import random
from typing import Any

import pytest

from fake_vllm.schema_instance import SchemaError, instance_for

jsonschema = pytest.importorskip("jsonschema")

# What pydantic's model_json_schema() produces for DD's judge output model (two Score rubrics).
JUDGE_SCHEMA: dict[str, Any] = {
    "$defs": {
        "Relevance": {
            "properties": {
                "reasoning": {"type": "string", "title": "Reasoning"},
                "score": {"$ref": "#/$defs/RelevanceEnum", "description": "Score Descriptions:\n* 1: bad"},
            },
            "required": ["reasoning", "score"],
            "title": "Relevance",
            "type": "object",
        },
        "RelevanceEnum": {"enum": [1, 2, 3], "title": "RelevanceEnum", "type": "integer"},
        "Tone": {
            "properties": {"reasoning": {"type": "string"}, "score": {"$ref": "#/$defs/ToneEnum"}},
            "required": ["reasoning", "score"],
            "type": "object",
        },
        "ToneEnum": {"enum": ["Poor", "Good"], "type": "string"},
    },
    "properties": {"Relevance": {"$ref": "#/$defs/Relevance"}, "Tone": {"$ref": "#/$defs/Tone"}},
    "required": ["Relevance", "Tone"],
    "title": "JudgeStructuredOutput",
    "type": "object",
}

TREE_SCHEMA: dict[str, Any] = {
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["name", "children"],
        }
    },
    "$ref": "#/$defs/Node",
}


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(JUDGE_SCHEMA, id="dd-judge"),
        pytest.param({"type": "string", "minLength": 30, "maxLength": 40}, id="string-length"),
        pytest.param({"type": "string", "maxLength": 3}, id="string-short"),
        pytest.param({"type": "integer", "minimum": 5, "maximum": 7}, id="integer-range"),
        pytest.param({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, id="integer-exclusive"),
        pytest.param({"type": "integer", "minimum": 1, "maximum": 100, "multipleOf": 7}, id="integer-multiple"),
        pytest.param({"type": "integer", "minimum": 1000}, id="integer-min-only"),
        pytest.param({"type": "number", "minimum": -1.5, "maximum": 1.5}, id="number-range"),
        pytest.param({"type": "number", "exclusiveMinimum": 0.0, "exclusiveMaximum": 0.1}, id="number-exclusive"),
        pytest.param({"type": "boolean"}, id="boolean"),
        pytest.param({"type": "null"}, id="null"),
        pytest.param({"enum": ["a", 2, None]}, id="enum-mixed"),
        pytest.param({"const": {"fixed": True}}, id="const"),
        pytest.param({"type": ["string", "null"]}, id="type-list"),
        pytest.param({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}, id="optional-anyof"),
        pytest.param({"oneOf": [{"type": "string", "format": "email"}]}, id="oneof-email"),
        pytest.param(
            {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"required": ["b"]}]},
            id="allof-merge",
        ),
        pytest.param(
            {"type": "array", "items": {"enum": [1, 2, 3, 4]}, "minItems": 3, "maxItems": 4, "uniqueItems": True},
            id="array-unique",
        ),
        pytest.param({"type": "array", "items": {"type": "string"}, "minItems": 5}, id="array-min"),
        pytest.param(
            {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": False},
            id="array-prefix",
        ),
        pytest.param({"type": "object", "additionalProperties": {"type": "integer"}}, id="dict-values"),
        pytest.param(
            {
                "type": "object",
                "properties": {
                    "when": {"type": "string", "format": "date-time"},
                    "day": {"type": "string", "format": "date"},
                    "id": {"type": "string", "format": "uuid"},
                    "site": {"type": "string", "format": "uri"},
                },
                "required": ["when", "day", "id", "site"],
                "additionalProperties": False,
            },
            id="formats",
        ),
        pytest.param(
            {
                "type": "object",
                "properties": {"item": {"$ref": "#/definitions/Item", "description": "sibling keyword"}},
                "required": ["item"],
                "definitions": {"Item": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}},
            },
            id="definitions-ref",
        ),
        pytest.param(TREE_SCHEMA, id="recursive"),
        pytest.param({}, id="empty-schema"),
    ],
)
def test_instance_validates(schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for seed in range(25):
        value = instance_for(schema, random.Random(seed))
        errors = [error.message for error in validator.iter_errors(value)]
        assert not errors, (seed, value, errors)


def test_instance_is_deterministic_per_seed() -> None:
    first = [instance_for(JUDGE_SCHEMA, random.Random(seed)) for seed in range(10)]
    again = [instance_for(JUDGE_SCHEMA, random.Random(seed)) for seed in range(10)]
    assert first == again
    assert len({str(v) for v in first}) > 1


def test_judge_scores_cover_allowed_values() -> None:
    scores = {instance_for(JUDGE_SCHEMA, random.Random(seed))["Relevance"]["score"] for seed in range(50)}
    assert scores == {1, 2, 3}


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"$ref": "#/$defs/Missing"}, id="missing-ref"),
        pytest.param({"$ref": "https://example.com/schema.json"}, id="remote-ref"),
        pytest.param({"enum": []}, id="empty-enum"),
        pytest.param({"type": "integer", "minimum": 5, "maximum": 4}, id="empty-range"),
        pytest.param({"type": "string", "minLength": 5, "maxLength": 2}, id="bad-lengths"),
        pytest.param({"type": "object", "properties": {"x": False}}, id="false-property"),
    ],
)
def test_unsatisfiable_schema_raises(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaError):
        instance_for(schema, random.Random(0))
