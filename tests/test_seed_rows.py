"""The four places that use a shard's seed rows agree on them, on uneven splits, with an independent computation.

The rule is config's (``shard_seed_rows``); its users are the launcher, which captures the recipe's own selection
(``capture_seed``: the pool), the planner, which places the shards and gives each its block (``plan_shards``),
config's recipe change that hands the block to Data Designer (``partition_seed``), and the node, which reads the
block with Data Designer's own seed reader (``read_seed_block``). The independent computation is the unsharded
run's: record j uses row ``P + j % M`` of a selection of M rows from P; a shard cycles through what it reads.
Data Designer's real run of the same splits is ``tests/test_seed_sharding.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import RunLayout, partition_seed, recipe_section
from ddslurm.launcher.submission._seed import capture_seed
from ddslurm.planner import plan_shards
from ddslurm.runtime._engine import read_seed_block

pytestmark = pytest.mark.dd

FILE_ROWS = 60
CASES = [
    # selection rows, records, shards: 7 shards over 60 rows, 3 over 10, more shards than rows, records past a cycle
    pytest.param(60, 60, 7, id="7-shards-over-60-rows"),
    pytest.param(10, 10, 3, id="3-shards-over-10-rows"),
    pytest.param(4, 10, 7, id="more-shards-than-rows"),
    pytest.param(3, 10, 10, id="one-record-a-shard"),
    pytest.param(10, 25, 4, id="records-past-a-cycle"),
]
SELECTIONS = {
    # a selection of ``rows`` rows: the rows of the seed file, the recipe's selection_strategy, its first row
    "none": lambda rows: (rows, None, 0),
    "index-range": lambda rows: (rows + 10, {"start": 7, "end": 7 + rows - 1}, 7),
}


def _recipe(seed: Path, selection: dict[str, int] | None) -> dict[str, Any]:
    seed_config: dict[str, Any] = {"source": {"seed_type": "local", "path": str(seed)}}
    if selection is not None:
        seed_config["selection_strategy"] = selection
    return {"data_designer": {"seed_config": seed_config, "columns": []}}


@pytest.mark.parametrize("selection", sorted(SELECTIONS))
@pytest.mark.parametrize(("rows", "records", "shards"), CASES)
def test_capture_plan_recipe_and_node_agree_on_every_shards_seed_rows(
    tmp_path: Path, rows: int, records: int, shards: int, selection: str
) -> None:
    file_rows, strategy, first_row = SELECTIONS[selection](rows)
    seed = tmp_path / "seed.parquet"
    pq.write_table(pa.table({"row": list(range(file_rows))}), seed)
    recipe = _recipe(seed, strategy)

    captured = capture_seed(recipe, tmp_path / "recipe.yaml", RunLayout(tmp_path / "run"))  # the launcher
    assert captured is not None
    assert (captured.plan.pool_start, captured.plan.pool_size) == (first_row, rows)

    specs = plan_shards(records, shards, captured.plan.pool)  # the planner
    assert [s.num_records for s in specs] and sum(s.num_records for s in specs) == records
    unsharded = [first_row + j % rows for j in range(records)]
    sharded: list[int] = []
    for spec in specs:
        block = spec.seed_rows
        assert block is not None
        # config's recipe change: Data Designer's IndexRange, both ends included
        given = recipe_section(partition_seed(recipe, spec))["seed_config"]["selection_strategy"]
        assert given == {"start": spec.seed_start, "end": spec.seed_end}
        # the node: exactly those rows, in order, by Data Designer's own reader
        read = read_seed_block(recipe, block).column("row").to_pylist()
        assert read == list(range(given["start"], given["end"] + 1))
        sharded += [read[k % len(read)] for k in range(spec.num_records)]
    assert sharded == unsharded


def test_a_partition_block_is_the_pool_data_designer_computes(tmp_path: Path) -> None:
    """The launcher takes a partition block's rows from Data Designer's own arithmetic; the shards divide it."""
    seed = tmp_path / "seed.parquet"
    pq.write_table(pa.table({"row": list(range(FILE_ROWS))}), seed)
    recipe = _recipe(seed, {"index": 1, "num_partitions": 3})
    captured = capture_seed(recipe, tmp_path / "recipe.yaml", RunLayout(tmp_path / "run"))
    assert captured is not None and captured.plan.pool.selection() == {"start": 20, "end": 39}  # 60 rows in thirds
    sharded: list[int] = []
    for spec in plan_shards(7, 3, captured.plan.pool):
        assert spec.seed_rows is not None
        read = read_seed_block(recipe, spec.seed_rows).column("row").to_pylist()
        sharded += [read[k % len(read)] for k in range(spec.num_records)]
    assert sharded == list(range(20, 27))
