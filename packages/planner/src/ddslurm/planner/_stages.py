"""``stages: auto`` in the plan: the recipe's GPU and CPU stages and the dataset's final column order, from the
recipe's columns as Data Designer reads them (the submit host gathers those; the split itself is
``ddslurm.config.split_stages``, the order ``ddslurm.config.final_columns``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddslurm.config import RecipeColumn, RunFile, StagePlan, final_columns, split_stages

SINGLE_BY_RUN_FILE = "single stage: the run file says stages: single"


@dataclass(frozen=True, slots=True)
class Staging:
    """The plan's stages (none: one stage), why, and the dataset's final column order."""

    stages: tuple[StagePlan, ...] = ()
    reason: str | None = None
    column_order: tuple[str, ...] | None = None


def plan_stages(
    run: RunFile,
    recipe: Mapping[str, Any],
    columns: Sequence[RecipeColumn] | None,
    seed_columns: Sequence[str] = (),
) -> Staging:
    """The dataset's final column order, for every run (``final_columns``: the order Data Designer writes the
    recipe's columns in, which collection applies to hosted-only, single- and two-stage runs alike), and for a run
    with deployments the recipe's GPU and CPU stages (``split_stages`` over the deployed aliases; none for
    ``stages: single``). A recipe whose columns Data Designer did not read (``columns`` None: its validation says
    why): neither."""
    order = None if columns is None else final_columns(recipe, columns, seed_columns)
    if not run.deployments:
        return Staging(column_order=order)
    if run.stages == "single":
        return Staging(reason=SINGLE_BY_RUN_FILE, column_order=order)
    if columns is None:
        return Staging()
    split = split_stages(recipe, columns, {d.model_alias for d in run.deployments})
    stages = (
        tuple(StagePlan(kind=st.kind, columns=st.columns, keep=st.keep) for st in split.stages) if split.split else ()
    )
    return Staging(stages=stages, reason=split.reason, column_order=order)
