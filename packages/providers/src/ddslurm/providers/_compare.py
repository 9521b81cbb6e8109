"""Whether two model configs are the same one, as Data Designer reads them.

DD's library (``write_config``) writes every key, with explicit nulls; its CLI (``ModelRepository``) leaves null
keys out; defaults may be written or not. Both are validated with DD's own ``ModelConfig`` and the validated
models compared, so only a difference DD would act on counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _without_nulls(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _without_nulls(v) for k, v in tree.items() if v is not None}
    if isinstance(tree, list | tuple):
        return [_without_nulls(v) for v in tree]
    return tree


def same_model_config(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """True if Data Designer's ``ModelConfig`` validates ``a`` and ``b`` into equal models. When either does not
    validate, they are the same only if they are equal once null values are dropped."""
    from data_designer.config import ModelConfig  # imported when needed: loading DD costs time

    top_a = {k: v for k, v in a.items() if v is not None}
    top_b = {k: v for k, v in b.items() if v is not None}
    try:
        equal: bool = ModelConfig.model_validate(top_a) == ModelConfig.model_validate(top_b)
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return bool(_without_nulls(a) == _without_nulls(b))
    return equal
