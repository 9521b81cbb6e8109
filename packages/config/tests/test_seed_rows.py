"""shard_seed_rows, the one rule for the seed rows a shard reads, against a brute-force model of Data Designer: record
j of an unsharded run over a selection of M rows from P uses row P + j % M, and a shard given rows s..e cycles
through them from its first record."""

from __future__ import annotations

import pytest

from ddslurm.config import SeedRows, ShardSpec, partition_seed, shard_seed_rows


def _cycled(start: int, end: int, records: int) -> list[int]:
    return [start + k % (end - start + 1) for k in range(records)]


@pytest.mark.parametrize("pool_start", [0, 5])
@pytest.mark.parametrize("pool_rows", [1, 3, 7, 10])
def test_every_shard_that_has_a_block_reads_the_rows_of_an_unsharded_run(pool_start: int, pool_rows: int) -> None:
    pool = SeedRows(pool_start, pool_start + pool_rows - 1)
    for first in range(3 * pool_rows):
        for records in range(1, 3 * pool_rows + 1):
            unsharded = [pool_start + j % pool_rows for j in range(first, first + records)]
            inside = first % pool_rows + records <= pool_rows
            starts_a_cycle = first % pool_rows == 0
            if not (inside or starts_a_cycle):
                with pytest.raises(ValueError, match="cross a cycle"):
                    shard_seed_rows(pool, first, records)
                continue
            block = shard_seed_rows(pool, first, records)
            assert pool.start <= block.start <= block.end <= pool.end
            assert _cycled(block.start, block.end, records) == unsharded, (first, records, block)


def test_a_block_is_inclusive_at_both_ends_as_data_designers_index_range() -> None:
    block = SeedRows.of(9, 9)
    assert (block.start, block.end, block.rows) == (9, 17, 9)
    assert block.selection() == {"start": 9, "end": 17}
    spec = ShardSpec(index=1, first_record=9, num_records=9, seed_start=9, seed_end=17)
    assert spec.seed_rows == block
    recipe = {"data_designer": {"seed_config": {"source": {"seed_type": "local", "path": "s.parquet"}}}}
    assert partition_seed(recipe, spec)["data_designer"]["seed_config"]["selection_strategy"] == block.selection()
    assert ShardSpec(index=0, first_record=0, num_records=3).seed_rows is None


def test_an_empty_selection_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        shard_seed_rows(SeedRows.of(0, 0), 0, 1)
