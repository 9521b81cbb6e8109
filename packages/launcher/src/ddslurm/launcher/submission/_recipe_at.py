"""Where in the recipe a refusal is about: a seed setting, or the Jinja template of a column that Data Designer
refuses (a syntax error, a variable no column or seed column provides).

A config file (YAML or JSON) names the field at its line and column (``recipe.yaml:14:5:
data_designer.columns[1].prompt``); a builder script, which has no place for the config's fields, names the
script and the column (``build.py: column 'q' (prompt)``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from ddslurm.config import ConfigError, locate, read_yaml, recipe_section

Step = str | int
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_COLUMN = re.compile(r"^column '(?P<name>[^']+)': ")
_QUOTED = re.compile(r"'([^']+)'")
_TEMPLATE = ("{{", "{%")


def _steps_text(steps: Sequence[Step]) -> str:
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def recipe_field_at(recipe_path: Path, steps: Sequence[Step], shown: str | None = None) -> str:
    """``recipe.yaml:LINE:COL: FIELD`` of the field at ``steps`` under the recipe's Data Designer section
    (``data_designer:`` of a full config, or the top level of a shorthand one), ``shown`` as its name if given
    (else the field's path in the file); for a builder script, or a file that does not parse, the file alone."""
    text = shown if shown is not None else _steps_text(steps)
    if recipe_path.suffix.lower() not in CONFIG_SUFFIXES:
        return f"{recipe_path}: {text}"
    try:
        tree = read_yaml(recipe_path)
    except ConfigError:
        return f"{recipe_path}: {text}"
    section: list[Step] = ["data_designer"] if isinstance(tree, Mapping) and "data_designer" in tree else []
    line, col = locate(tree, [*section, *steps])
    if shown is None:
        text = _steps_text([*section, *steps])
    return f"{recipe_path}:{line}:{col}: {text}" if line is not None else f"{recipe_path}: {text}"


def _templates(node: Any, steps: tuple[Step, ...] = ()) -> Iterator[tuple[tuple[Step, ...], str]]:
    """Every string of a column's config that is a Jinja template, with its path in the column."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _templates(value, (*steps, str(key)))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _templates(item, (*steps, index))
    elif isinstance(node, str) and any(mark in node for mark in _TEMPLATE):
        yield steps, node


def _broken(template: str) -> bool:
    try:
        jinja2.Environment(autoescape=False).parse(template)
    except jinja2.TemplateSyntaxError:
        return True
    return False


def _refused_field(problem: str, columns: Sequence[Any]) -> tuple[int, str, tuple[Step, ...]] | None:
    """The column (index, name) and the field of it that ``problem`` is about: the column it names and its template
    that holds a name the problem quotes (the missing variable), or the first template whose syntax is broken."""
    named = _COLUMN.match(problem)
    quoted = set(_QUOTED.findall(problem))
    for index, column in enumerate(columns):
        if not isinstance(column, Mapping):
            continue
        name = str(column.get("name", ""))
        templates = list(_templates(column))
        if named is not None and named.group("name") == name:
            quoted.discard(name)
            hit = next((steps for steps, text in templates if any(word in text for word in quoted)), None)
            if hit is None and templates:
                hit = templates[0][0]
            return index, name, hit if hit is not None else ("name",)
        if named is None and "Jinja2 template" in problem:
            hit = next((steps for steps, text in templates if _broken(text)), None)
            if hit is not None:
                return index, name, hit
    return None


def place_refusal(problem: str, recipe_path: Path, recipe: Mapping[str, Any]) -> str:
    """``problem`` (one of Data Designer's refusals of the recipe) prefixed with the place of the template it is
    about: ``recipe.yaml:LINE:COL: data_designer.columns[I].FIELD: ...`` for a config file, ``build.py: column
    'NAME' (FIELD): ...`` for a builder script; as it is when it is about no column's template."""
    found = _refused_field(problem, recipe_section(recipe).get("columns") or [])
    if found is None:
        return problem
    index, name, steps = found
    if recipe_path.suffix.lower() in CONFIG_SUFFIXES:
        return f"{recipe_field_at(recipe_path, ['columns', index, *steps])}: {problem}"
    said = "" if _COLUMN.match(problem) else f"column {name!r} ({_steps_text(steps)}): "
    return f"{recipe_path}: {said}{problem}"
