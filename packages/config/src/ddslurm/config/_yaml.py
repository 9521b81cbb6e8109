"""Strict YAML/JSON loading into msgspec structs with ``file:line:col: field: message`` errors."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError

from ddslurm.config.errors import ConfigFileError

T = TypeVar("T")

# msgspec: "<msg> - at `$.a[0].b`" or, for a bad mapping key, "<msg> - at `key` in `$.a`"; `[...]` is a dict value
_AT = re.compile(r"^(?P<msg>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_DUPLICATE = re.compile(r'^found duplicate key "(?P<key>.*?)" with value', re.DOTALL)


def read_yaml(path: Path) -> Any:
    """Parse a YAML (or JSON) file into a round-trip tree that keeps line and column marks."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        return yaml.load(text)
    except DuplicateKeyError as exc:  # ruamel's message repeats both values, which may be keys: never show them
        mark, start = exc.problem_mark, exc.context_mark
        found = _DUPLICATE.match(exc.problem or "")
        key = repr(found.group("key")) if found else "key"
        where = f" in the mapping that starts at line {start.line + 1}" if start is not None else ""
        raise ConfigFileError(
            path,
            f"duplicate key {key}{where}; keep one (values not shown)",
            line=mark.line + 1 if mark is not None else None,
            col=mark.column + 1 if mark is not None else None,
        ) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigFileError(path, problem, line=line, col=col) from exc
    except Exception as exc:  # ruamel raises a few unmarked errors (e.g. duplicate keys in flow style)
        raise ConfigFileError(path, f"invalid YAML: {exc}") from exc


def to_builtins(node: Any) -> Any:
    """Turn a ruamel round-trip tree into plain dicts, lists and scalars (msgspec rejects ruamel subclasses)."""
    if isinstance(node, dict):
        return {str(k) if not isinstance(k, (int, float, bool)) else k: to_builtins(v) for k, v in node.items()}
    if isinstance(node, list):
        return [to_builtins(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def locate(tree: Any, steps: list[str | int]) -> tuple[int | None, int | None]:
    """Line and column (1-based) of the deepest node of ``steps`` that exists in ``tree``."""
    line: int | None = None
    col: int | None = None
    node = tree
    for step in steps:
        if isinstance(node, CommentedMap) and isinstance(step, str) and step in node:
            ln, cl = node.lc.key(step)
            line, col = ln + 1, cl + 1
            node = node[step]
        elif isinstance(node, CommentedSeq) and isinstance(step, int) and 0 <= step < len(node):
            ln, cl = node.lc.item(step)
            line, col = ln + 1, cl + 1
            node = node[step]
        else:
            break
    if line is None and isinstance(tree, CommentedMap | CommentedSeq):
        line, col = tree.lc.line + 1, tree.lc.col + 1
    return line, col


def _split_path(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for name, index in _STEP.findall(path):
        steps.append(int(index) if index else name)
    return steps


def _field_text(steps: list[str | int]) -> str:
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def _humanize(message: str) -> str:
    message = message.replace("`", "")
    return message[:1].lower() + message[1:]


def error_at(path: Path, tree: Any, exc: msgspec.ValidationError) -> ConfigFileError:
    """Translate a msgspec validation error into a ConfigFileError pointing into ``tree``."""
    match = _AT.match(str(exc))
    assert match is not None
    message = match.group("msg")
    steps = _split_path(match.group("path") or "")
    if unknown := _UNKNOWN.match(message):
        steps.append(unknown.group("name"))
        message = "unknown field (check the spelling; see the docs for the accepted keys)"
    elif missing := _MISSING.match(message):
        steps.append(missing.group("name"))
        message = "required field is missing"
    else:
        message = _humanize(message)
        if match.group("key"):
            message += " (in a mapping key)"
    line, col = locate(tree, steps)
    return ConfigFileError(path, message, line=line, col=col, field=_field_text(steps))


def load_struct(path: Path, kind: type[T], *, prepare: Callable[[Any], Any] | None = None, dec_hook: Any = None) -> T:
    """Load ``path`` strictly into ``kind``. ``prepare`` may normalise the plain tree before conversion."""
    tree = read_yaml(path)
    if tree is None:
        raise ConfigFileError(path, "file is empty", line=1, col=1)
    if not isinstance(tree, CommentedMap):
        line, col = (tree.lc.line + 1, tree.lc.col + 1) if isinstance(tree, CommentedSeq) else (1, 1)
        raise ConfigFileError(path, "the top level must be a mapping", line=line, col=col)
    plain = to_builtins(tree)
    if prepare is not None:
        plain = prepare(plain)
    try:
        return msgspec.convert(plain, kind, strict=True, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise error_at(path, tree, exc) from exc
