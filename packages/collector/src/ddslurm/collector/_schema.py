"""One schema for every batch file, and each batch conformed to it by name. Linear in the number of columns."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ddslurm.collector.errors import SchemaConflictError

_UNIFY_ERRORS = (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError)
_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


def _decoded(t: Any, cache: dict[Any, Any]) -> Any:
    """``t`` with every dictionary encoding replaced by its value type (decoding loses nothing)."""
    hit = cache.get(t)
    if hit is not None:
        return hit
    out = t
    if pa.types.is_dictionary(t):
        out = _decoded(t.value_type, cache)
    elif pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        new = [f.with_type(_decoded(f.type, cache)) for f in fields]
        if any(n.type != f.type for n, f in zip(new, fields, strict=True)):
            out = pa.struct(new)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        value = t.value_field
        decoded = _decoded(value.type, cache)
        if decoded != value.type:
            item = value.with_type(decoded)
            if pa.types.is_list(t):
                out = pa.list_(item)
            elif pa.types.is_large_list(t):
                out = pa.large_list(item)
            else:
                out = pa.list_(item, t.list_size)
    elif pa.types.is_map(t):
        key, item = _decoded(t.key_type, cache), _decoded(t.item_type, cache)
        if key != t.key_type or item != t.item_type:
            out = pa.map_(key, item, t.keys_sorted)
    cache[t] = out
    return out


def _merge(name: str, a: Any, b: Any) -> Any:
    merged = pa.unify_schemas(
        [pa.schema([pa.field(name, a)]), pa.schema([pa.field(name, b)])], promote_options="permissive"
    )
    return merged.field(0).type


def _unify_column(name: str, types: dict[Any, Path]) -> Any:
    """The one type of column ``name`` given its distinct types in first-seen order (each with the first file
    that has it). A conflict names the two files whose types do not unify, never a null-only one."""
    seen = list(types.items())
    acc = seen[0][0]
    for i in range(1, len(seen)):
        t, path = seen[i]
        try:
            acc = _merge(name, acc, t)
        except _UNIFY_ERRORS as exc:
            other_type, other_path = _first_conflict(name, seen[:i], t)
            raise SchemaConflictError(
                f"column {name!r} has types that cannot be unified: {other_type} in {other_path} and "
                f"{t} in {path} ({exc})",
                (other_path, path),
            ) from exc
    return acc


def _first_conflict(name: str, earlier: list[tuple[Any, Path]], t: Any) -> tuple[Any, Path]:
    """The earliest type that does not unify with ``t`` on its own; failing that (the conflict only arises from
    a combination), the earliest type that is not null."""
    for other, path in earlier:
        try:
            _merge(name, other, t)
        except _UNIFY_ERRORS:
            return other, path
    return next(((o, p) for o, p in earlier if not pa.types.is_null(o)), earlier[0])


def unified_schema(schemas: list[tuple[Path, pa.Schema]]) -> pa.Schema:
    """One schema for all files: columns in first-seen order, dictionary-encoded columns decoded, types unified
    without changing values (struct fields by name, null-only and empty-list columns take the type seen
    elsewhere, numeric widening). Linear in the total number of columns: types are compared per distinct type,
    and only columns with more than one distinct type are unified."""
    columns: dict[str, dict[Any, Path]] = {}
    cache: dict[Any, Any] = {}
    for path, schema in schemas:
        names = schema.names
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SchemaConflictError(f"column {dup!r} appears more than once in {path}", (path,))
        for name, t in zip(names, schema.types, strict=True):
            types = columns.get(name)
            if types is None:
                columns[name] = {_decoded(t, cache): path}
            else:
                types.setdefault(_decoded(t, cache), path)
    return pa.schema([pa.field(name, _unify_column(name, types), nullable=True) for name, types in columns.items()])


def conform(table: pa.Table, schema: pa.Schema, path: Path) -> pa.Table:
    """Select by name into the unified order (never by position), add missing columns as nulls, cast safely:
    a cast that would change a value (an int too large for a float, say) is a conflict, not a rounding."""
    if table.schema.equals(schema, check_metadata=False):
        return table
    index = {name: i for i, name in enumerate(table.schema.names)}
    columns = []
    for field in schema:
        i = index.get(field.name)
        if i is None:
            columns.append(pa.nulls(table.num_rows, type=field.type))
            continue
        column = table.column(i)
        if column.type == field.type:
            columns.append(column)
            continue
        try:
            columns.append(column.cast(field.type, safe=True))
        except _CAST_ERRORS as exc:
            raise SchemaConflictError(
                f"column {field.name!r} in {path} ({column.type}) cannot become {field.type} without changing "
                f"values: {exc}",
                (path,),
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)


def in_order(schema: pa.Schema, order: Sequence[str] | None, schemas: list[tuple[Path, pa.Schema]]) -> pa.Schema:
    """``schema`` with its columns in ``order`` (the plan's ``column_order``, by name; None: unchanged). Every
    file must hold exactly those columns: one that does not is a :class:`SchemaConflictError` naming it."""
    if order is None:
        return schema
    wanted = set(order)
    for path, file_schema in schemas:
        names = set(file_schema.names)
        if names != wanted:
            extra, missing = sorted(names - wanted), sorted(wanted - names)
            raise SchemaConflictError(
                f"{path} does not hold the run's columns: "
                + "; ".join(
                    part
                    for part in (
                        f"not expected {', '.join(map(repr, extra))}" if extra else "",
                        f"missing {', '.join(map(repr, missing))}" if missing else "",
                    )
                    if part
                ),
                (path,),
            )
    return pa.schema([schema.field(name) for name in order])
