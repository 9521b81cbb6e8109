"""Where in the recipe a refusal is about: a seed setting, or the Jinja template of a column that Data Designer
refuses (a syntax error, a variable no column or seed column provides).

A config file (YAML or JSON) names the field at its line and column (``recipe.yaml:14:5:
data_designer.columns[1].prompt``); a builder script, which has no place for the config's fields, names the line
of the script that made the column (its ``add_column`` call, as the build recorded it) and the column
(``build.py:27: column 'q' (prompt)``). A variable no column provides gets a "did you mean" among the names a
template can use (the recipe's columns, the seed dataset's)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from ddslurm.config import ConfigError, closest, locate, read_yaml, recipe_section

Step = str | int
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_COLUMN = re.compile(r"^column '(?P<name>[^']+)': ")
_QUOTED = re.compile(r"'([^']+)'")
_TEMPLATE = ("{{", "{%")
_UNKNOWN_REFERENCES = re.compile(
    r"(?:columns? that do(?:es)? not exist: |references missing column )(?P<names>'[^']+'(?:, '[^']+')*)"
)
"""Data Designer's words for a template's variable no column provides: a prompt's (``references a column that does
not exist: 'a'``, ``references 2 columns that do not exist: 'a', 'b'``) and an expression's (``references missing
column 'a'``)."""


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


def suggest_references(problem: str, names: Collection[str]) -> str:
    """``problem`` with a "did you mean" for each variable it says no column provides (:data:`_UNKNOWN_REFERENCES`)
    that is close to one of ``names``; as it is otherwise."""
    match = _UNKNOWN_REFERENCES.search(problem)
    if match is None:
        return problem
    unknown = _QUOTED.findall(match.group("names"))
    close = [(name, found) for name in unknown if (found := closest(name, names)) is not None]
    if not close:
        return problem
    if len(unknown) == 1:
        hint = f"did you mean {close[0][1]!r}?"
    else:
        hint = "did you mean " + ", ".join(f"{found!r} for {name!r}" for name, found in close) + "?"
    return f"{problem.rstrip().removesuffix('.')}; {hint}"


def place_refusal(
    problem: str,
    recipe_path: Path,
    recipe: Mapping[str, Any],
    *,
    columns_at: Mapping[str, str] | None = None,
    names: Collection[str] = (),
) -> str:
    """``problem`` (one of Data Designer's refusals of the recipe) prefixed with the place of the template it is
    about: ``recipe.yaml:LINE:COL: data_designer.columns[I].FIELD: ...`` for a config file, ``build.py:LINE: column
    'NAME' (FIELD): ...`` for a builder script (``columns_at``: where its code made each column, by name; the
    script alone where it is not known); as it is when it is about no column's template. A variable no column
    provides gets a "did you mean" among ``names`` (the recipe's columns are always among them)."""
    columns = recipe_section(recipe).get("columns") or []
    known = {str(c["name"]) for c in columns if isinstance(c, Mapping) and "name" in c} | set(names)
    suggested = suggest_references(problem, known)
    found = _refused_field(problem, columns)
    if found is None:
        return suggested
    index, name, steps = found
    if recipe_path.suffix.lower() in CONFIG_SUFFIXES:
        return f"{recipe_field_at(recipe_path, ['columns', index, *steps])}: {suggested}"
    said = "" if _COLUMN.match(problem) else f"column {name!r} ({_steps_text(steps)}): "
    where = (columns_at or {}).get(name, str(recipe_path))
    return f"{where}: {said}{suggested}"
