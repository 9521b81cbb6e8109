"""Which records a short shard regenerates: exactly the dropped ones, by the seed rows they used."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.runtime._fill import missing_rows, observed_keys, recipe_reading, row_keys


def _keys(values: list[int]) -> list[str]:
    return row_keys(pa.table({"seed_id": values}), ["seed_id"])


@pytest.mark.parametrize(
    ("width", "records", "present", "expected"),
    [
        (10, 10, [0, 1, 2, 4, 5, 6, 7, 8, 9], [3]),  # one row dropped inside a cycle
        (10, 10, list(range(10)), []),  # nothing missing
        (3, 8, [0, 1, 2, 0, 2, 0], [1, 1]),  # cycled: row 1 is used 3 times in 8 records, present once
        (4, 6, [0, 1, 2, 3, 0], [1]),  # ORDERED remainder: rows 0 and 1 get the 5th and 6th records
    ],
)
def test_ordered_missing_rows_are_the_dropped_ones(
    width: int, records: int, present: list[int], expected: list[int]
) -> None:
    block = _keys(list(range(width)))
    assert missing_rows(block, Counter(_keys(present)), records, "ordered") == expected


def test_shuffled_remainder_is_refilled_from_rows_not_yet_used_twice() -> None:
    block = _keys([0, 1, 2, 3])
    # 6 records over 4 rows: every row once, 2 rows twice (random). Present: 0,1,2,3,2 → one record missing,
    # and any row but 2 may take the remaining extra use.
    chosen = missing_rows(block, Counter(_keys([0, 1, 2, 3, 2])), 6, "shuffle")
    assert chosen is not None and len(chosen) == 1 and chosen[0] != 2
    assert missing_rows(block, Counter(_keys([0, 1, 3])), 4, "shuffle") == [2]


def test_duplicate_seed_rows_are_interchangeable() -> None:
    block = _keys([7, 7, 8])
    assert missing_rows(block, Counter(_keys([7, 8])), 3, "ordered") == [0]


def test_rows_the_block_cannot_explain_mean_no_fill() -> None:
    block = _keys([0, 1, 2])
    assert missing_rows(block, Counter(_keys([0, 1, 9])), 3, "ordered") is None
    assert missing_rows(block, Counter(_keys([0, 0, 1])), 3, "ordered") is None  # row 0 twice in one cycle


def test_observed_keys_needs_every_seed_column(tmp_path: Path) -> None:
    good, bad = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"seed_id": [1, 2], "answer": ["x", "y"]}), good)
    pq.write_table(pa.table({"answer": ["z"]}), bad)
    assert observed_keys([good], ["seed_id"]) == Counter(_keys([1, 2]))
    assert observed_keys([good, bad], ["seed_id"]) is None


def test_fill_recipe_reads_the_missing_rows_in_order(tmp_path: Path) -> None:
    recipe = {"data_designer": {"seed_config": {"source": {"seed_type": "directory", "path": "/x"}}, "columns": []}}
    out = recipe_reading(recipe, tmp_path / "fill.parquet")
    assert out["data_designer"]["seed_config"] == {
        "source": {"seed_type": "local", "path": str(tmp_path / "fill.parquet")},
        "sampling_strategy": "ordered",
        "selection_strategy": None,
    }
    assert recipe["data_designer"]["seed_config"]["source"]["seed_type"] == "directory"
    assert recipe_reading({"columns": []}, None) == {"columns": []}
