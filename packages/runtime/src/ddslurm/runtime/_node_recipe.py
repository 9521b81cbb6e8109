"""Data Designer's config builder for a recipe: the stored config (``inputs/recipe.yaml``, as ddslurm changed it for
the node: model configs, seed, stage), with the columns that do not survive the YAML round trip taken from the
builder's own config objects (:func:`ddslurm.runtime._builder.rebuilt_columns`).

Data Designer writes a custom column's ``generator_function`` as the function's name, leaves out fields a plugin
marks ``exclude=True`` (a lambda column's function) and turns a judge's integer option keys into strings; by default
it also sorts every mapping's keys (ddslurm writes a builder's config in its own order, but a YAML could still
reorder): read back from YAML, such a column is refused or does not send the laptop's requests.
:func:`round_trip_changes` finds them where the builder runs at submit, comparing each column as the node reads it
back with the builder's, every field as an ordered, typed structure (:func:`request_difference`: an output schema's
field order is in the prompt a structured column sends, a judge's options in its scores); the plan records them
and why (``RecipeSource.rebuild``, ``reasons``); :func:`node_builder` puts them back.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddslurm.config import read_yaml, recipe_section, to_builtins
from ddslurm.runtime._columns import column_adapter
from ddslurm.runtime.errors import RecipeError

_SHOWN = 70


def config_columns(value: Any) -> list[Any]:
    """The column config objects of what a builder returned: a ``DataDesignerConfigBuilder``, a
    ``DataDesignerConfig`` or a ``BuilderConfig``."""
    import data_designer.config as dd
    from data_designer.config.config_builder import BuilderConfig

    if isinstance(value, dd.DataDesignerConfigBuilder):
        return list(value.get_column_configs())
    if isinstance(value, BuilderConfig):
        return list(value.data_designer.columns)
    if isinstance(value, dd.DataDesignerConfig):
        return list(value.columns)
    raise TypeError(f"not a Data Designer config: {type(value).__name__}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _keys(keys: Sequence[Any]) -> str:
    text = ", ".join(repr(k) for k in keys)
    return (text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...") if keys else "none"


def _key_at(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return _at(path, key)
    return f"{path}[{key!r}]"


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _model_fields(obj: Any) -> list[str]:
    """A pydantic model's fields in their declared order, then its extra fields (a plugin's ``extra="allow"``)."""
    names = list(type(obj).model_fields)
    extra = getattr(obj, "model_extra", None) or {}
    return names + [str(k) for k in extra if k not in names]


def request_difference(made: Any, read: Any, path: str = "") -> str | None:
    """Where ``read`` (a column config as the node reads it back) differs from ``made`` (the builder's own), as
    Data Designer would send it: every field of the config, compared as an ordered, typed structure (a mapping's
    key order and key types, a value's type: an output schema's field order is in the prompt Data Designer sends,
    a judge's integer option keys are in its scores); functions and classes by identity. None: the same."""
    where = path or "the column"
    from pydantic import BaseModel

    if isinstance(made, BaseModel) or isinstance(read, BaseModel):
        if type(made) is not type(read):
            return f"{where}: {type(made).__name__} reads back as {type(read).__name__}"
        fields, back = _model_fields(made), _model_fields(read)
        if fields != back:
            return f"{where}: fields {_keys(fields)} read back as {_keys(back)}"
        for name in fields:
            found = request_difference(getattr(made, name, None), getattr(read, name, None), _at(path, name))
            if found is not None:
                return found
        return None
    if isinstance(made, Mapping) and isinstance(read, Mapping) and type(made) is type(read):
        mine, theirs = list(made), list(read)
        if mine != theirs or [type(k) for k in mine] != [type(k) for k in theirs]:
            if set(mine) == set(theirs) and [type(k) for k in mine] == [type(theirs[theirs.index(k)]) for k in mine]:
                return f"{where}: its keys in the order {_keys(mine)} read back in the order {_keys(theirs)}"
            return f"{where}: keys {_keys(mine)} read back as {_keys(theirs)}"
        for key in mine:
            found = request_difference(made[key], read[key], _key_at(path, key))
            if found is not None:
                return found
        return None
    if isinstance(made, list | tuple) and type(made) is type(read):
        if len(made) != len(read):
            return f"{where}: {len(made)} items read back as {len(read)}"
        for index, (a, b) in enumerate(zip(made, read, strict=True)):
            found = request_difference(a, b, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if callable(made) or callable(read):  # a function, a class (a pydantic model given as a type)
        return None if made is read else f"{where}: {_short(made)} reads back as {_short(read)}"
    # Data Designer's configs keep an enum's value (use_enum_values) but a default as the member: the same value
    made, read = _plain(made), _plain(read)
    if type(made) is not type(read):
        return f"{where}: {_short(made)} ({type(made).__name__}) reads back as {_short(read)} ({type(read).__name__})"
    try:
        same = bool(made == read) or (_is_nan(made) and _is_nan(read))
    except Exception:  # an object whose equality is not a truth value (an array)
        same = repr(made) == repr(read)
    return None if same else f"{where}: {_short(made)} reads back as {_short(read)}"


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _change(obj: Any, written: Mapping[str, Any] | None) -> str | None:
    """What reading ``written`` (the column as the node's YAML holds it) back makes of ``obj``; None: the same
    column, sending the same requests."""
    if written is None:
        return "it is not in the written config"
    try:
        read = column_adapter().validate_python([copy.deepcopy(dict(written))])[0]
    except Exception as exc:  # pydantic's or Data Designer's own refusal
        first = str(exc).strip().splitlines()
        return "Data Designer cannot read it back" + (f": {first[-1].strip()}" if first else "")
    return request_difference(obj, read)


def round_trip_changes(value: Any, text: str) -> dict[str, str]:
    """The columns of ``value`` (what a builder returned) that its YAML ``text``, read as the node reads the run's
    stored recipe (ddslurm's YAML reader), does not carry as they are, each with what the round trip changes in
    it (:func:`request_difference`)."""
    tree = to_builtins(read_yaml(Path("recipe.yaml"), text=text))
    written = {c.get("name"): c for c in recipe_section(tree).get("columns") or [] if isinstance(c, dict)}
    changes = {}
    for obj in config_columns(value):
        change = _change(obj, written.get(obj.name))
        if change is not None:
            changes[obj.name] = change
    return changes


def node_builder(recipe: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> Any:
    """Data Designer's config builder for ``recipe`` (a full config or the shorthand), each column named in
    ``rebuilt`` being that config object (its ``drop`` as the recipe has it: a stage keeps some). Raises
    :class:`RecipeError` when Data Designer refuses the config."""
    import data_designer.config as dd
    from data_designer.config.config_builder import BuilderConfig

    tree = copy.deepcopy(dict(recipe))
    if "columns" in tree and "data_designer" not in tree:
        tree = {"data_designer": tree}
    section = tree["data_designer"]
    raw = [c for c in section.get("columns") or [] if isinstance(c, dict)]
    section["columns"] = [c for c in raw if c.get("name") not in rebuilt]
    try:
        config = BuilderConfig.model_validate(tree)
        parsed = {c.name: c for c in config.data_designer.columns}
        columns = []
        for c in raw:
            name = str(c.get("name"))
            if name in rebuilt:
                obj = rebuilt[name]
                columns.append(obj.model_copy(update={"drop": bool(c.get("drop", False))}))
            else:
                columns.append(parsed[name])
        inner = config.data_designer.model_copy(update={"columns": columns})
        return dd.DataDesignerConfigBuilder.from_config(config.model_copy(update={"data_designer": inner}))
    except RecipeError:
        raise
    except Exception as exc:
        raise RecipeError(f"the recipe is not a valid Data Designer config: {exc}") from exc
