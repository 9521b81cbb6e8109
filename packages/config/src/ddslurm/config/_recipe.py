"""Reading a Data Designer recipe (a plain mapping, as its YAML or JSON decodes) without Data Designer: where its
sections are, which of its columns call a model. The submit host, the planner and the node read recipes the same
way through these functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LLM_COLUMN_TYPES = frozenset({"llm-text", "llm-code", "llm-structured", "llm-judge"})
"""Data Designer's column types that ask a model for each cell."""


def recipe_section(recipe: Mapping[str, Any]) -> Any:
    """The ``data_designer`` section of a full config, or the recipe itself in Data Designer's shorthand form (the
    object itself, not a copy: a caller that changes it changes the recipe)."""
    inner = recipe.get("data_designer")
    return inner if isinstance(inner, Mapping) else recipe


def llm_columns(recipe: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the recipe's LLM columns (text, code, structured, judge), in recipe order."""
    columns = recipe_section(recipe).get("columns")
    if not isinstance(columns, list):
        return ()
    return tuple(
        c["name"]
        for c in columns
        if isinstance(c, dict) and c.get("column_type") in LLM_COLUMN_TYPES and isinstance(c.get("name"), str)
    )


def recipe_processors(recipe: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recipe's processors (copies), in recipe order."""
    return [dict(p) for p in recipe_section(recipe).get("processors") or [] if isinstance(p, Mapping)]


def is_drop_processor(processor: Mapping[str, Any]) -> bool:
    """A ``drop_columns`` processor: it removes the columns it names (globs against the batch's columns)."""
    return str(processor.get("processor_type")) == "drop_columns"
