"""The Data Designer plugins a recipe uses, found as Data Designer finds them (entry points of the
``data_designer.plugins`` group of this environment: the profile's ``python_env`` at submit, the same on the node).

At submit (``ddslurm-runtime inspect``): every column, processor and seed type the recipe names must be built into
this Data Designer or come from one of its plugins (:func:`unknown_types`), and the plugins it uses are recorded
with their distribution and version (:func:`used_plugins`, the plan's ``plugins``). On the node,
:func:`check_plugins` refuses to run the recipe with any other.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, get_args

from ddslurm.config import PluginRecord, UnknownType, recipe_processors, recipe_section
from ddslurm.runtime.errors import RecipeError

PLUGIN_GROUP = "data_designer.plugins"
_KINDS = (("column", "column_type"), ("processor", "processor_type"), ("seed dataset", "seed_type"))


def recipe_types(recipe: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(where, field, type)`` for each column, processor and seed source of ``recipe``: ``("column 'q'",
    "column_type", "llm-text")``."""
    section = recipe_section(recipe)
    for column in section.get("columns") or []:
        if isinstance(column, dict) and column.get("column_type") is not None:
            yield f"column {column.get('name')!r}", "column_type", str(column["column_type"])
    for processor in recipe_processors(recipe):
        if processor.get("processor_type") is not None:
            yield f"processor {processor.get('name')!r}", "processor_type", str(processor["processor_type"])
    seed = section.get("seed_config")
    source = seed.get("source") if isinstance(seed, dict) else None
    if isinstance(source, dict) and source.get("seed_type") is not None:
        yield "the seed dataset", "seed_type", str(source["seed_type"])


def _discriminators(union: Any, field: str) -> set[str]:
    names = set()
    for cls in get_args(union):
        fields = getattr(cls, "model_fields", {})
        if field in fields and isinstance(fields[field].default, str):
            names.add(fields[field].default)
        names |= _discriminators(cls, field)  # nested unions and Annotated[...]
    return names


def known_types() -> dict[str, set[str]]:
    """The column, processor and seed types this Data Designer reads, its plugins' included, by field."""
    from data_designer.config.column_types import ColumnConfigT
    from data_designer.config.processor_types import ProcessorConfigT
    from data_designer.config.seed_source_types import SeedSourceT

    return {
        "column_type": _discriminators(ColumnConfigT, "column_type"),
        "processor_type": _discriminators(ProcessorConfigT, "processor_type"),
        "seed_type": _discriminators(SeedSourceT, "seed_type"),
    }


def unknown_types(recipe: Mapping[str, Any]) -> tuple[UnknownType, ...]:
    """The recipe's types that neither this Data Designer nor any of its plugins provides."""
    known = known_types()
    return tuple(
        UnknownType(where=where, field=field, type=kind)
        for where, field, kind in recipe_types(recipe)
        if kind not in known[field]
    )


def _plugins() -> dict[str, tuple[str, str, str]]:
    """Each plugin Data Designer loaded here: its name → (plugin type, distribution, version)."""
    from data_designer.plugins.plugin import PluginType
    from data_designer.plugins.registry import PluginRegistry

    registry = PluginRegistry()
    loaded = {id(p) for kind in PluginType for p in registry.get_plugins(kind)}
    found = {}
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            plugin = ep.load()
        except Exception:  # Data Designer logged it and left it out
            continue
        if id(plugin) in loaded and ep.dist is not None:
            found[plugin.name] = (plugin.plugin_type.value, ep.dist.name, ep.dist.version)
    return found


def used_plugins(recipe: Mapping[str, Any]) -> tuple[PluginRecord, ...]:
    """The plugins ``recipe`` uses, sorted by name."""
    plugins = _plugins()
    used = {kind for _, _, kind in recipe_types(recipe)} & plugins.keys()
    return tuple(
        PluginRecord(name=name, plugin_type=plugins[name][0], distribution=plugins[name][1], version=plugins[name][2])
        for name in sorted(used)
    )


def check_plugins(records: Sequence[PluginRecord]) -> None:
    """Refuse (:class:`RecipeError`) to run where a plugin of the plan is missing, fails to load, or comes from
    another distribution or version than at submit."""
    if not records:
        return
    plugins = _plugins()
    for record in records:
        planned = f"{record.distribution} {record.version}"
        try:
            version: str | None = importlib.metadata.version(record.distribution)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version != record.version:
            here = "not installed" if version is None else f"at version {version}"
            raise RecipeError(
                f"plugin {record.name!r}: the run was planned with {planned} in python_env; here it is {here}"
            )
        if record.name not in plugins:
            raise RecipeError(f"plugin {record.name!r} ({planned}) is installed here but Data Designer did not load it")
