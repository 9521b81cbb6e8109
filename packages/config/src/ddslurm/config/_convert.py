"""msgspec conversion that finds every problem of a tree, not only the first.

``msgspec.convert`` stops at the first error. :func:`convert_all` walks the tree against the struct's fields
instead: each field's value is converted on its own (nested structs, and sequences of structs, walked in turn),
unknown and missing fields are each a problem, and a struct whose own fields all convert is converted whole, so
that its ``__post_init__`` checks run too, with every field that had a problem taking its default. A
``__post_init__`` refuses several fields at once by raising :class:`Refusals`."""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")
Step = str | int

_GONE: Any = object()
"""A value with a problem (inside it or in it), taken out of the tree."""


class Refusals(msgspec.ValidationError):
    """Several fields a top-level struct's ``__post_init__`` refuses, each ``(path, message)`` (``submission.qos``,
    ``extra_sbatch[1]``: paths from the top of the file). msgspec passes a ValidationError raised there on as it is;
    its text is the first refusal in msgspec's own form (``message - at `$.path```)."""

    def __init__(self, refusals: Sequence[tuple[str, str]]) -> None:
        self.refusals = tuple(refusals)
        path, message = self.refusals[0]
        super().__init__(f"{message} - at `$.{path}`")

    def each(self) -> list[msgspec.ValidationError]:
        """One ValidationError per refusal, in msgspec's form."""
        return [msgspec.ValidationError(f"{message} - at `$.{path}`") for path, message in self.refusals]


def refuse_all(refusals: Sequence[tuple[str, str]]) -> None:
    """Raise :class:`Refusals` of ``refusals`` (from a top-level struct's ``__post_init__``), if there are any."""
    if refusals:
        raise Refusals(refusals)


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem of a tree: ``error`` (msgspec's, its ``- at `$...``` path relative to ``steps``), and for an
    unknown field the names the struct accepts (``fields``), for a "did you mean"."""

    steps: tuple[Step, ...]
    error: msgspec.ValidationError
    fields: tuple[str, ...] = ()


def convert_all(plain: Any, kind: type[T], *, dec_hook: Any = None) -> tuple[T | None, list[Problem]]:
    """``plain`` converted to ``kind`` (strictly) and no problems, or None and every problem found."""
    problems: list[Problem] = []
    _walk(plain, kind, (), dec_hook, problems)
    if problems:
        return None, problems
    return msgspec.convert(plain, kind, strict=True, dec_hook=dec_hook), []


def _bare(kind: Any) -> Any:
    while typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return kind


def _struct(kind: Any, value: Any) -> type[msgspec.Struct] | None:
    """The struct ``value`` is to become: ``kind`` itself, or the one struct of ``S | None`` when it is not None."""
    kind = _bare(kind)
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return kind
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and value is not None:
        members = [_bare(m) for m in typing.get_args(kind) if m is not type(None)]
        if len(members) == 1:
            return _struct(members[0], value)
    return None


def _items(kind: Any) -> Any:
    """The struct of ``tuple[S, ...]`` or ``list[S]``, or None."""
    kind = _bare(kind)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    sequence = (origin is tuple and len(args) == 2 and args[1] is Ellipsis) or (origin is list and len(args) == 1)
    if not sequence:
        return None
    item = _bare(args[0])
    return item if isinstance(item, type) and issubclass(item, msgspec.Struct) else None


def _values(kind: Any) -> Any:
    """The struct of ``dict[K, S]``, or None."""
    kind = _bare(kind)
    args = typing.get_args(kind)
    if typing.get_origin(kind) is not dict or len(args) != 2:
        return None
    item = _bare(args[1])
    return item if isinstance(item, type) and issubclass(item, msgspec.Struct) else None


def _walk(value: Any, kind: Any, steps: tuple[Step, ...], dec_hook: Any, out: list[Problem]) -> Any:
    """``value`` with every problem taken out (appended to ``out``), or :data:`_GONE` if it has any that cannot be
    taken out (its own type is wrong, a required field is missing or wrong, a check of the whole refuses it)."""
    struct = _struct(kind, value)
    if struct is not None and isinstance(value, dict):
        return _walk_struct(value, struct, steps, dec_hook, out)
    item = _items(kind)
    if item is not None and isinstance(value, list):
        walked = [_walk(v, item, (*steps, i), dec_hook, out) for i, v in enumerate(value)]
        return _GONE if any(v is _GONE for v in walked) else walked
    entry = _values(kind)
    if entry is not None and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        mapped = {k: _walk(v, entry, (*steps, k), dec_hook, out) for k, v in value.items()}  # problems at their key
        if any(v is _GONE for v in mapped.values()):
            return _GONE
        return _converted(mapped, kind, steps, dec_hook, out)  # the keys' own type
    return _converted(value, kind, steps, dec_hook, out)


def _converted(value: Any, kind: Any, steps: tuple[Step, ...], dec_hook: Any, out: list[Problem]) -> Any:
    try:
        msgspec.convert(value, kind, strict=True, dec_hook=dec_hook)
    except Refusals as exc:
        out.extend(Problem(steps, each) for each in exc.each())
        return _GONE
    except msgspec.ValidationError as exc:
        out.append(Problem(steps, exc))
        return _GONE
    return value


def _walk_struct(
    value: dict[Any, Any], struct: type[msgspec.Struct], steps: tuple[Step, ...], dec_hook: Any, out: list[Problem]
) -> Any:
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    forbid = struct.__struct_config__.forbid_unknown_fields
    kept: dict[Any, Any] = {}
    for key, item in value.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            if forbid:
                error = msgspec.ValidationError(f"Object contains unknown field `{key}`")
                out.append(Problem(steps, error, tuple(fields)))
            else:
                kept[key] = item
            continue
        walked = _walk(item, field.type, (*steps, key), dec_hook, out)
        if walked is _GONE:
            continue  # an optional field takes its default for the checks of the whole
        kept[key] = walked
    broken = {name for name, field in fields.items() if field.required and name not in kept}
    for name, field in fields.items():
        if field.required and name not in value:
            out.append(Problem(steps, msgspec.ValidationError(f"Object missing required field `{name}`")))
    if broken:
        _refusals_without(kept, struct, broken, steps, dec_hook, out)
        return _GONE
    return _converted(kept, struct, steps, dec_hook, out)


_STAND_INS: dict[Any, Any] = {str: "", int: 0, float: 0.0, bool: False}


@functools.cache
def _lenient(struct: type[msgspec.Struct], names: frozenset[str]) -> type[msgspec.Struct]:
    """``struct`` with the fields ``names`` of any type and not required: its ``__post_init__`` runs without them."""
    return msgspec.defstruct(
        f"Lenient{struct.__name__}", [(name, Any, None) for name in sorted(names)], bases=(struct,), kw_only=True
    )


def _refusals_without(
    kept: dict[Any, Any],
    struct: type[msgspec.Struct],
    broken: set[str],
    steps: tuple[Step, ...],
    dec_hook: Any,
    out: list[Problem],
) -> None:
    """The :class:`Refusals` of ``struct``'s ``__post_init__`` about its other fields, while required fields
    (``broken``) are missing or wrong: those take a stand-in (``""``, ``0``, None), and a refusal of one of them,
    or any other error of the check, is not reported (the field's own problem is)."""
    if not hasattr(struct, "__post_init__"):
        return
    kinds = {f.encode_name: _bare(f.type) for f in msgspec.structs.fields(struct)}
    stand_ins = {name: _STAND_INS.get(kinds[name]) for name in broken}
    try:
        msgspec.convert({**kept, **stand_ins}, _lenient(struct, frozenset(broken)), strict=True, dec_hook=dec_hook)
    except Refusals as exc:
        others = [(path, message) for path, message in exc.refusals if _head(path) not in broken]
        if others:
            out.extend(Problem(steps, each) for each in Refusals(others).each())
    except Exception:
        pass


def _head(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]
