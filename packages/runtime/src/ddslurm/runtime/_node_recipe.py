"""Data Designer's config builder for a recipe: the stored config (``inputs/recipe.yaml``, as ddslurm changed it for
the node: model configs, seed, stage), with the columns that do not survive the YAML round trip taken from the
builder's own config objects (:func:`ddslurm.runtime._builder.rebuilt_columns`).

Data Designer writes a custom column's ``generator_function`` as the function's name, leaves out fields a plugin
marks ``exclude=True`` (a lambda column's function) and turns a judge's integer option keys into strings: read back
from YAML, such a column is refused or is not the laptop's. :func:`round_trip_changes` finds them where the builder
runs at submit (the plan records them: ``RecipeSource.rebuild``); :func:`node_builder` puts them back.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from ddslurm.config import recipe_section
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


def _change(obj: Any, written: Mapping[str, Any] | None) -> str | None:
    """What reading ``written`` (the column as the YAML holds it) back makes of ``obj``; None: the same column."""
    if written is None:
        return "it is not in the written config"
    try:
        read = column_adapter().validate_python([copy.deepcopy(dict(written))])[0]
    except Exception as exc:  # pydantic's or Data Designer's own refusal
        first = str(exc).strip().splitlines()
        return "Data Designer cannot read it back" + (f": {first[-1].strip()}" if first else "")
    if read == obj:
        return None
    fields = [f for f in type(obj).model_fields if getattr(read, f, None) != getattr(obj, f, None)]
    if not fields:
        return "it reads back as another config"
    name = fields[0]
    return f"{name} {_short(getattr(obj, name))} reads back as {_short(getattr(read, name))}"


def round_trip_changes(value: Any, text: str) -> dict[str, str]:
    """The columns of ``value`` (what a builder returned) that its YAML ``text`` does not carry as they are, each
    with what the round trip changes in it."""
    from data_designer.config.utils.io_helpers import serialize_data, smart_load_yaml

    tree = json.loads(serialize_data(smart_load_yaml(text)))
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
