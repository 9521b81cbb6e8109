"""A recipe's columns as Data Designer's own config types read them: the facts (:class:`ddslurm.config.RecipeColumn`)
the planner splits stages on and orders the dataset's columns by. Run where the node's Data Designer (and its
plugins' column types) is installed: at submit, in ``ddslurm-runtime inspect`` in the profile's ``python_env``."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from ddslurm.config import RecipeColumn, recipe_section
from ddslurm.runtime.errors import RecipeError


@functools.cache
def column_adapter() -> Any:
    """Pydantic's reader of a list of Data Designer column configs (every column type of this environment, plugins'
    included; Data Designer is imported here, not when the runtime is)."""
    from typing import Annotated

    from data_designer.config.column_types import ColumnConfigT
    from pydantic import Field, TypeAdapter

    return TypeAdapter(list[Annotated[ColumnConfigT, Field(discriminator="column_type")]])


def _parse_columns(recipe: Mapping[str, Any]) -> list[Any]:
    """The recipe's column configs as Data Designer's own config objects."""
    from data_designer.errors import DataDesignerError
    from pydantic import ValidationError

    raw = recipe_section(recipe).get("columns") or []
    try:
        return list(column_adapter().validate_python(copy.deepcopy(list(raw))))
    except (ValidationError, DataDesignerError) as exc:  # DD's own validators raise DataDesignerError as it is
        raise RecipeError(f"the recipe's columns are not valid Data Designer column configs: {exc}") from exc


def column_facts(configs: Iterable[Any]) -> tuple[RecipeColumn, ...]:
    """The facts of Data Designer column config objects, in their order."""
    columns = []
    for config in configs:
        skip = getattr(config, "skip", None)
        required = tuple(config.required_columns)
        get_aliases = getattr(config, "get_model_aliases", None)
        alias = getattr(config, "model_alias", None)
        aliases = tuple(get_aliases()) if callable(get_aliases) else ((alias,) if alias is not None else ())
        sampler_type = getattr(config, "sampler_type", None)
        columns.append(
            RecipeColumn(
                name=config.name,
                column_type=str(config.column_type),
                aliases=aliases,
                refs=required + (tuple(skip.columns) if skip is not None else ()),
                required=required,
                side_effects=tuple(config.side_effect_columns),
                drop=bool(config.drop),
                skips=skip is not None,
                propagate_skip=bool(getattr(config, "propagate_skip", True)),
                sampler_type=None if sampler_type is None else str(getattr(sampler_type, "value", sampler_type)),
            )
        )
    return tuple(columns)


def recipe_columns(recipe: Mapping[str, Any]) -> tuple[RecipeColumn, ...]:
    """The columns of ``recipe`` (a full config or DD's shorthand), in recipe order; :class:`RecipeError` when Data
    Designer refuses them."""
    return column_facts(_parse_columns(recipe))
