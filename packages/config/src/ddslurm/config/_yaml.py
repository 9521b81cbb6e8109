"""Strict YAML/JSON loading into msgspec structs with ``file:line:col: field: message`` errors.

Bounded: a file is read up to ``max_bytes`` (1 MiB for run files and profiles, :data:`MAX_INPUT_BYTES`; 16 MiB
for any other YAML, :data:`MAX_YAML_BYTES`), collections nest at most :data:`MAX_DEPTH` levels, and anchors and
aliases are refused (``aliases=False``: run files and profiles) or may repeat at most :data:`MAX_ALIAS_NODES`
nodes in all (recipes, Data Designer's settings), so a "billion laughs" file is refused at once."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent

from ddslurm.config._convert import Problem, convert_all
from ddslurm.config._suggest import did_you_mean
from ddslurm.config.errors import ConfigFileError, ConfigFileErrors

T = TypeVar("T")

MAX_INPUT_BYTES = 1 << 20
"""The largest run file or cluster profile (1 MiB): hand-written settings are a few KiB."""
MAX_YAML_BYTES = 16 << 20
"""The largest other YAML or JSON file ddslurm parses (16 MiB): recipes, Data Designer's settings."""
MAX_DEPTH = 100
"""How deeply mappings and sequences may nest (a recipe's JSON schemas included)."""
MAX_ALIAS_NODES = 100_000
"""Where aliases are accepted, how many nodes they may repeat in all (each alias counts the nodes it stands for)."""

# msgspec: "<msg> - at `$.a[0].b`" or, for a bad mapping key, "<msg> - at `key` in `$.a`"; `[...]` is a dict value
_AT = re.compile(r"^(?P<msg>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_NO_SUGGESTION = "(check the spelling; see the docs for the accepted keys)"
_DUPLICATE = re.compile(r'^found duplicate key "(?P<key>.*?)" with value', re.DOTALL)


class _Refused(MarkedYAMLError):
    """A limit of :class:`_BoundedComposer`, at the mark of the node or alias that passed it."""


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 and not limit % (1 << 20) else f"{limit} bytes"


class _BoundedComposer(Composer):
    """ruamel's composer with the limits above: nesting depth, and anchors and aliases refused or capped. Aliases
    share the node they refer to while parsing; the repetition is what :func:`to_builtins` would expand."""

    aliases = True
    """Whether anchors and aliases are accepted (:class:`_StrictComposer`: not)."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self._nesting = 0
        self._nodes = 0  # nodes composed so far, every alias counted as the nodes it stands for
        self._repeated = 0
        self._sizes: dict[Any, int] = {}  # anchor -> nodes it stands for
        self._open: set[Any] = set()  # anchors of collections still being composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        if isinstance(event, AliasEvent):
            return self._alias(event, parent, index)
        if event.anchor is not None and not self.aliases:
            raise _Refused(
                None,
                None,
                f"anchor &{event.anchor}: anchors and aliases (&name, *name, <<: *name) are not accepted in this file; "
                "write each value out",
                event.start_mark,
            )
        collection = isinstance(event, MappingStartEvent | SequenceStartEvent)
        if collection:
            self._nesting += 1
            if self._nesting > MAX_DEPTH:
                raise _Refused(
                    None, None, f"mappings and sequences nested deeper than {MAX_DEPTH} levels", event.start_mark
                )
        start, anchor = self._nodes, event.anchor
        self._nodes += 1
        if anchor is not None:
            self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            if collection:
                self._nesting -= 1
            if anchor is not None:
                self._open.discard(anchor)
                self._sizes[anchor] = self._nodes - start

    def _alias(self, event: AliasEvent, parent: Any, index: Any) -> Any:
        name = event.anchor
        if not self.aliases:
            raise _Refused(
                None,
                None,
                f"alias *{name}: anchors and aliases (&name, *name, <<: *name) are not accepted in this file; write "
                "each value out",
                event.start_mark,
            )
        if name in self._open:
            raise _Refused(None, None, f"alias *{name} refers to the node that contains it", event.start_mark)
        size = self._sizes.get(name, 0)  # an undefined alias: ruamel says so next
        self._nodes += size
        self._repeated += size
        if self._repeated > MAX_ALIAS_NODES:
            raise _Refused(
                None,
                None,
                f"alias *{name}: aliases repeat more than {MAX_ALIAS_NODES} nodes in all; write the file without "
                "them (an alias bomb?)",
                event.start_mark,
            )
        return super().compose_node(parent, index)


class _StrictComposer(_BoundedComposer):
    aliases = False


def read_text_file(path: Path, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The file's text, read once up to ``max_bytes`` (by default a run file's or profile's limit; a larger file is
    refused where it passes the limit, a file that is not UTF-8 where it stops being so): what :func:`read_yaml`
    parses, for a caller that keeps the text (``submit`` reads each input once)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:
        line, col = _position(data, max_bytes)
        raise ConfigFileError(
            path, f"the file is larger than {_size(max_bytes)}, the most ddslurm reads of it", line=line, col=col
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _position(data, exc.start)
        raise ConfigFileError(path, "not UTF-8 text", line=line, col=col) from None


def _position(data: bytes, offset: int) -> tuple[int, int]:
    """Line and column (1-based) of byte ``offset`` (columns count characters before it on its line)."""
    start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, len(data[start:offset].decode("utf-8", errors="replace")) + 1


def read_yaml(path: Path, *, text: str | None = None, max_bytes: int = MAX_YAML_BYTES, aliases: bool = True) -> Any:
    """Parse a YAML (or JSON) file into a round-trip tree that keeps line and column marks. ``text``: parse this
    instead of reading ``path`` (which errors then name). The limits: see the module's docstring."""
    if text is None:
        text = read_text_file(path, max_bytes)
    elif len(text) > max_bytes:
        raise ConfigFileError(path, f"larger than {_size(max_bytes)}, the most ddslurm parses")
    yaml = YAML(typ="rt")
    yaml.Composer = _BoundedComposer if aliases else _StrictComposer
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


def dump_yaml(obj: Any) -> str:
    """``obj`` (a Struct, or plain data) as block-style YAML 1.2, fields in their declared order and ``null`` for
    what is unset: what :func:`read_yaml` reads back to the same values."""
    import io

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.width = 1 << 16  # a long path or command stays on its line
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    out = io.StringIO()
    yaml.dump(msgspec.to_builtins(obj), out)
    return out.getvalue()


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


def _unknown_field(name: str, fields: tuple[str, ...]) -> str:
    suggestion = did_you_mean(name, fields)
    return f"unknown field{suggestion}" if suggestion else f"unknown field {_NO_SUGGESTION}"


def _file_error(path: Path, tree: Any, problem: Problem) -> ConfigFileError:
    match = _AT.match(str(problem.error))
    assert match is not None
    message = match.group("msg")
    steps = [*problem.steps, *_split_path(match.group("path") or "")]
    if unknown := _UNKNOWN.match(message):
        steps.append(unknown.group("name"))
        message = _unknown_field(unknown.group("name"), problem.fields)
    elif missing := _MISSING.match(message):
        steps.append(missing.group("name"))
        message = "required field is missing"
    else:
        message = _humanize(message)
        if match.group("key"):
            message += " (in a mapping key)"
    line, col = locate(tree, steps)
    return ConfigFileError(path, message, line=line, col=col, field=_field_text(steps))


def error_at(path: Path, tree: Any, exc: msgspec.ValidationError) -> ConfigFileError:
    """Translate a msgspec validation error into a ConfigFileError pointing into ``tree``."""
    return _file_error(path, tree, Problem((), exc))


def file_errors(path: Path, tree: Any, problems: list[Problem]) -> ConfigFileError:
    """One :class:`ConfigFileError` for ``problems`` (:func:`convert_all`'s): the problem itself when there is one,
    else :class:`ConfigFileErrors` of them all in the order of their place in the file."""
    errors = sorted((_file_error(path, tree, p) for p in problems), key=lambda e: (e.line or 0, e.col or 0))
    return errors[0] if len(errors) == 1 else ConfigFileErrors(errors)


def load_struct(
    path: Path,
    kind: type[T],
    *,
    prepare: Callable[[Any], Any] | None = None,
    dec_hook: Any = None,
    max_bytes: int = MAX_YAML_BYTES,
    aliases: bool = True,
    text: str | None = None,
) -> T:
    """Load ``path`` strictly into ``kind``, every problem of the file reported at once (:func:`file_errors`).
    ``prepare`` may normalise the plain tree before conversion; ``max_bytes``, ``aliases`` and ``text`` (the
    file's text, already read) as for :func:`read_yaml`."""
    tree = read_yaml(path, text=text, max_bytes=max_bytes, aliases=aliases)
    if tree is None:
        raise ConfigFileError(path, "file is empty", line=1, col=1)
    if not isinstance(tree, CommentedMap):
        line, col = (tree.lc.line + 1, tree.lc.col + 1) if isinstance(tree, CommentedSeq) else (1, 1)
        raise ConfigFileError(path, "the top level must be a mapping", line=line, col=col)
    plain = to_builtins(tree)
    if prepare is not None:
        plain = prepare(plain)
    value, problems = convert_all(plain, kind, dec_hook=dec_hook)
    if value is None:
        raise file_errors(path, tree, problems)
    return value
