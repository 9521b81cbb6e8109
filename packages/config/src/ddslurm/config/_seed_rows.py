"""The one rule for which seed rows a shard reads: pure functions, used by the planner (each shard's block), the
recipe change that gives a shard its block (``partition_seed``), the node that reads the block
(``ddslurm.runtime._engine.read_seed_block``) and the launcher that captures the recipe's own selection.

Data Designer reads a seed dataset through a selection of ``M`` rows, ``IndexRange(start, end)`` with both ends
included (the whole dataset by default). Record ``j`` of an unsharded run uses row ``start + j % M`` (ORDERED;
SHUFFLE uses each row once per ``M`` records). A shard given ``IndexRange(s, e)`` cycles through ``s..e`` from
its first record, so a shard of records ``[a, a + n)`` reads the rows an unsharded run would when either it stays
inside one cycle of the selection (its rows are ``a % M .. a % M + n - 1`` of it) or it starts a cycle and holds at
least one (its rows are the whole selection, cycled): :func:`shard_seed_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeedRows:
    """Seed rows ``start`` to ``end``, both included: Data Designer's ``IndexRange`` (and a recipe's
    ``selection_strategy: {start, end}``)."""

    start: int
    end: int

    @classmethod
    def of(cls, start: int, rows: int) -> SeedRows:
        """The ``rows`` rows from ``start``."""
        return cls(start, start + rows - 1)

    @property
    def rows(self) -> int:
        """How many rows: ``end - start + 1``."""
        return self.end - self.start + 1

    def selection(self) -> dict[str, int]:
        """The rows as a recipe's ``seed_config.selection_strategy`` (Data Designer's ``IndexRange`` fields)."""
        return {"start": self.start, "end": self.end}


def shard_seed_rows(pool: SeedRows, first_record: int, num_records: int) -> SeedRows:
    """The block of ``pool`` (the recipe's selection) that a shard of records ``first_record ..
    first_record + num_records - 1`` reads, so that it uses the rows an unsharded run uses for those records (see
    the module's docstring). ValueError for a shard that crosses a cycle of the selection without starting on one
    (no block reproduces it: the planner never places one)."""
    if pool.rows < 1 or pool.start < 0:
        raise ValueError(f"the seed dataset's selection has {pool.rows} rows; Data Designer needs at least one")
    offset = first_record % pool.rows
    rows = pool.rows if offset == 0 and num_records >= pool.rows else num_records
    if offset + rows > pool.rows:
        raise ValueError(
            f"records {first_record}+{num_records} cross a cycle of the seed dataset's {pool.rows} rows without "
            "starting one"
        )
    return SeedRows.of(pool.start + offset, rows)
