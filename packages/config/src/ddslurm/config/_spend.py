"""What a run is predicted to spend (``Plan.spend``): per hosted alias the requests, tokens and money its records
will take, from the workspace's facts of earlier runs of the same recipe and the run's price file, and the money of
the GPU-hours the cost model predicts. The planner makes it (``ddslurm.planner``); the dry run's bill shows it, and
the report sets it beside what the run spent."""

from __future__ import annotations

from typing import Annotated

import msgspec

from ddslurm.config._base import Frozen

Count = Annotated[int, msgspec.Meta(ge=0)]
Money = Annotated[float, msgspec.Meta(ge=0)]


class AliasSpend(Frozen, frozen=True, kw_only=True):
    """One hosted alias's predicted spend for the run's records (retries, 429s and start-up checks not counted)."""

    alias: str
    model: str
    provider: str
    requests: Count | None = None
    """Records x the recipe's requests per record for the alias; None: no earlier run of the recipe measured it."""
    input_tokens: Count | None = None
    """Records x the input tokens per record; None: not measured."""
    output_tokens: Count | None = None
    cost: Money | None = None
    """The tokens at the price file's price of ``model``; None: tokens not measured, or the model not priced."""
    runs: Count = 0
    """How many earlier runs of the recipe its numbers rest on (their median)."""


class SpendForecast(Frozen, frozen=True, kw_only=True):
    records: Count
    hosted: tuple[AliasSpend, ...] = ()
    """Per hosted alias of the recipe, in the snapshot's order."""
    gpu_hours: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """The GPU-hours allocated the cost model predicts (``Plan.prediction``); 0 for a run without GPUs; None: a run
    with deployments whose layout the run file fixes (no prediction)."""
    cpu_hours: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """The CPU-hours those GPU allocations hold (their predicted hours x the CPUs of their nodes); None with
    ``gpu_hours``. A hosted-only run's CPU jobs are not predicted: the bill bounds them at their time limit."""
    hours_cost: Money | None = None
    """Those hours at the generation partition's prices; None: no prediction, or the partition is not priced."""
    currency: str | None = None
    """The price file's currency; None: no price file (no money is predicted)."""

    def total(self) -> float | None:
        """Every predicted cost together; None when any part of the run cannot be priced (a hosted alias without
        tokens or price, GPUs not predicted, or predicted without a price)."""
        if self.currency is None or any(a.cost is None for a in self.hosted):
            return None
        if self.gpu_hours is None or (self.gpu_hours > 0 and self.hours_cost is None):
            return None
        return sum(a.cost or 0.0 for a in self.hosted) + (self.hours_cost or 0.0)
