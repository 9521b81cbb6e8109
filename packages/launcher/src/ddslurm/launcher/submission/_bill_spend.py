"""The bill's money: what the run is predicted to spend (``Plan.spend``: hosted requests, tokens and money from the
facts of earlier runs of the recipe, the predicted GPU-hours' money) and what its jobs cost at most, held to their
time limits at the price file's partition prices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ddslurm.config import Prices, Resources, SpendForecast
from ddslurm.launcher.runs._money import money


class HeldJobs(Protocol):
    """One kind of job of a submission, as the bill counts it."""

    @property
    def resources(self) -> Resources: ...
    @property
    def gpu_hours(self) -> float: ...
    @property
    def cpu_hours(self) -> float: ...


def limit_cost(jobs: Sequence[HeldJobs], prices: Prices | None) -> float | None:
    """What ``jobs`` cost held to their time limits at their partitions' prices; None without a price file, or
    when a partition of them has no price."""
    if prices is None:
        return None
    costs = [prices.hours_cost(j.resources.partition, j.gpu_hours, j.cpu_hours) for j in jobs]
    return None if any(c is None for c in costs) else sum(c or 0.0 for c in costs)


def spend_lines(spend: SpendForecast | None) -> list[str]:
    """The bill's ``predicted spend`` section: per hosted alias its requests, tokens and money for the run's
    records, from the facts of earlier runs of the recipe (what no run measured is said so, never guessed); the
    predicted GPU-hours' money; the total when every part is priced."""
    if spend is None or (not spend.hosted and not spend.gpu_hours):
        return []
    cur = spend.currency
    lines = [
        f"predicted spend for {spend.records:,} records (the median per record of the recipe's earlier runs here; "
        "retries, 429s and start-up checks not counted):"
    ]
    width = max((len(a.alias) for a in spend.hosted), default=0)
    for a in spend.hosted:
        head = f"  {a.alias:<{width}}  {a.model} ({a.provider}): "
        if a.requests is None:
            lines.append(head + "not predicted: no run of this recipe here has measured it yet (its first run will)")
            continue
        text = f"{a.requests:,} requests"
        if a.input_tokens is not None and a.output_tokens is not None:
            text += f", {a.input_tokens:,} input and {a.output_tokens:,} output tokens"
            if cur is not None:
                text += ", " + (money(a.cost, cur) if a.cost is not None else "no price for the model")
        else:
            text += ", tokens not measured yet"
        lines.append(head + text + f"  ({a.runs} run{'s' if a.runs != 1 else ''})")
    if spend.gpu_hours:
        text = f"  GPU-hours: {spend.gpu_hours:.2f} predicted (the Layout section)"
        if cur is not None:
            text += ", " + (
                f"{money(spend.hours_cost, cur)} with their {spend.cpu_hours or 0:.2f} CPU-hours"
                if spend.hours_cost is not None
                else "the generation partition has no price"
            )
        lines.append(text)
    elif spend.gpu_hours is None:
        lines.append("  GPU-hours: not predicted (the run file fixes the layout); the time limit bounds them, above")
    total = spend.total()
    if cur is not None and total is not None:
        lines.append(f"  total: {money(total, cur)}")
    return lines
