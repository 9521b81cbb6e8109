"""Schema unification: dictionary-encoded strings, the right pair of files in a conflict, wide tables."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.collector import SchemaConflictError, collect, unified_schema
from ddslurm.collector.testing import make_published_run


def test_dictionary_encoded_strings_and_plain_strings_are_decoded_and_unified(tmp_path: Path) -> None:
    categorical = pa.table({"c": pa.array(["x", "y", "x"]).dictionary_encode(), "n": [1, 2, 3]})
    plain = pa.table({"c": ["z", None], "n": [4, 5]})
    small_index = pa.table(
        {"c": pa.DictionaryArray.from_arrays(pa.array([0], type=pa.int8()), pa.array(["w"])), "n": [6]}
    )
    layout = make_published_run(tmp_path, [[categorical], [plain, small_index]])
    out = pq.read_table(collect(layout).dataset)
    assert out.schema.field("c").type == pa.string()
    assert out.column("c").to_pylist() == ["x", "y", "x", "z", None, "w"]
    assert out.column("n").to_pylist() == [1, 2, 3, 4, 5, 6]


def test_dictionary_of_a_type_that_conflicts_is_still_a_conflict(tmp_path: Path) -> None:
    layout = make_published_run(
        tmp_path, [[pa.table({"c": pa.array(["x"]).dictionary_encode()})], [pa.table({"c": [1]})]]
    )
    with pytest.raises(SchemaConflictError, match=r"column 'c' .*string in .*int64 in"):
        collect(layout)


def test_conflict_names_the_files_whose_types_conflict_not_a_null_only_one(tmp_path: Path) -> None:
    layout = make_published_run(
        tmp_path,
        [[pa.table({"a": pa.nulls(2)})], [pa.table({"a": [1, 2]})], [pa.table({"a": ["one"]})]],
    )
    with pytest.raises(SchemaConflictError) as err:
        collect(layout)
    msg = str(err.value)
    assert "int64 in" in msg and "string in" in msg
    assert "shard-00001" in msg and "shard-00002" in msg
    assert "shard-00000" not in msg, msg


def test_conflict_after_a_widening_names_the_file_that_brought_the_conflicting_type(tmp_path: Path) -> None:
    layout = make_published_run(
        tmp_path,
        [
            [pa.table({"a": pa.array([1], type=pa.int32())})],
            [pa.table({"a": [{"k": 1}]})],
            [pa.table({"a": [1.5]})],
        ],
    )
    with pytest.raises(SchemaConflictError) as err:
        collect(layout)
    msg = str(err.value)
    assert "shard-00000" in msg and "shard-00001" in msg and "shard-00002" not in msg, msg


def _wide(columns: int, files: int) -> list[tuple[Path, pa.Schema]]:
    kinds = (pa.int64(), pa.string(), pa.float64())
    schema = pa.schema([pa.field(f"col_{c:05d}", kinds[c % 3]) for c in range(columns)])
    return [(Path(f"batch_{i:05d}.parquet"), schema) for i in range(files)]


def test_unification_of_thousands_of_columns_keeps_their_order() -> None:
    # Its cost (linear in the columns) is measured by bench/collect.py's ``wide`` case, not asserted here.
    schemas = _wide(4000, 16)
    merged = unified_schema(schemas)
    assert merged.names == schemas[0][1].names


def test_a_wide_table_whose_files_order_their_columns_differently_is_conformed(tmp_path: Path) -> None:
    # Its cost (linear in the columns) is measured by bench/collect.py's ``wide`` case, not asserted here.
    columns = 3000
    table = pa.table({f"col_{c:05d}": pa.array([c]) for c in range(columns)})
    shuffled = table.select(list(reversed(table.column_names)))
    layout = make_published_run(tmp_path, [[table, shuffled] * 4])
    got = pq.read_table(collect(layout).dataset)
    assert got.column_names == table.column_names and got.num_rows == 8
    assert got.column("col_01234").to_pylist() == [1234] * 8
