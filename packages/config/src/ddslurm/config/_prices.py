"""A price file (``prices:`` in the run file): what a run's hosted tokens and GPU- and CPU-hours cost, for the
bill, ``status`` and the report. Versioned and written by the user, never a built-in table: prices change, and
each site pays its own. Kept in the run's plan as read at submit, so a later change of the file changes no past
run's figures.

.. code-block:: yaml

    version: 1
    currency: USD                      # shown beside every figure; nothing is converted
    models:                            # by the model name the provider knows (a model config's ``model``)
      meta/llama-3.3-70b-instruct: {input: 0.60, output: 0.60}   # per million tokens
    partitions:                        # by Slurm partition
      gpu: {gpu_hour: 2.50, cpu_hour: 0.04}
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._yaml import load_struct

Price = Annotated[float, msgspec.Meta(ge=0, le=1_000_000)]


class ModelPrice(Frozen, frozen=True, kw_only=True):
    """A hosted model's price, per million tokens."""

    input: Price
    output: Price


class PartitionPrice(Frozen, frozen=True, kw_only=True):
    """A partition's price, per GPU-hour and per CPU-hour held."""

    gpu_hour: Price | None = None
    cpu_hour: Price | None = None


class Prices(Frozen, frozen=True, kw_only=True):
    version: Literal[1]
    """The file's format: 1."""
    currency: Annotated[str, msgspec.Meta(pattern=r"\A[A-Z]{3}\Z")] = "USD"
    models: dict[str, ModelPrice] = msgspec.field(default_factory=dict)
    partitions: dict[str, PartitionPrice] = msgspec.field(default_factory=dict)

    def tokens_cost(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """What ``model``'s tokens cost; None when the file has no price for it."""
        price = self.models.get(model)
        if price is None:
            return None
        return (input_tokens * price.input + output_tokens * price.output) / 1_000_000

    def hours_cost(self, partition: str | None, gpu_hours: float, cpu_hours: float) -> float | None:
        """What holding ``gpu_hours`` and ``cpu_hours`` of ``partition`` costs, each at its own price (a site that
        charges GPU-hours only gives no ``cpu_hour``: the CPUs of a GPU job are then not charged); None when the
        file prices neither for the partition."""
        price = self.partitions.get(partition or "")
        if price is None or (price.gpu_hour is None and price.cpu_hour is None):
            return None
        return gpu_hours * (price.gpu_hour or 0.0) + cpu_hours * (price.cpu_hour or 0.0)


def load_prices(path: Path) -> Prices:
    """Read a price file; :class:`~ddslurm.config.ConfigFileError` at the file, line and field of a problem."""
    return load_struct(path, Prices)
