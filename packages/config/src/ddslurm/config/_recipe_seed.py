"""A shard's block of the seed dataset, as a recipe change (Data Designer's ``IndexRange`` selection)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ddslurm.config._plan import ShardSpec
from ddslurm.config._recipe import recipe_section


def partition_seed(recipe: Mapping[str, Any], spec: ShardSpec) -> Mapping[str, Any]:
    """The recipe reading exactly the shard's block of the seed dataset (``IndexRange`` from the plan).

    The planner chose the block so that the shard uses the seed rows an unsharded run would use for the same
    records (:func:`~ddslurm.config.shard_seed_rows`); a shard without a block (no seed dataset) is left as it is.
    """
    seed = recipe_section(recipe).get("seed_config")
    rows = spec.seed_rows
    if rows is None or not isinstance(seed, dict):
        return recipe
    out = copy.deepcopy(dict(recipe))
    recipe_section(out)["seed_config"]["selection_strategy"] = rows.selection()
    return out
