"""No row group exceeds the documented bound (128k rows / 128 MB), however the batches are sized."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.collector import ROW_GROUP_ROWS, collect
from ddslurm.collector.testing import make_published_run


def _groups(dataset: Path) -> list[int]:
    sizes: list[int] = []
    for part in sorted(dataset.glob("part-*.parquet")):
        meta = pq.ParquetFile(part).metadata
        sizes.extend(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    return sizes


def test_three_100k_row_batches_give_no_group_over_128k_rows(tmp_path: Path) -> None:
    assert ROW_GROUP_ROWS == 128 * 1024
    tables = [pa.table({"a": pa.array(range(i * 100_000, (i + 1) * 100_000), type=pa.int64())}) for i in range(3)]
    result = collect(make_published_run(tmp_path, [tables]))
    groups = _groups(result.dataset)
    assert sum(groups) == 300_000 and max(groups) <= ROW_GROUP_ROWS, groups
    assert groups == [ROW_GROUP_ROWS, ROW_GROUP_ROWS, 300_000 - 2 * ROW_GROUP_ROWS]
    assert pq.read_table(result.dataset).column("a").to_pylist() == list(range(300_000))


def test_one_300k_row_batch_is_split_into_several_groups(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array(range(300_000), type=pa.int64())})
    result = collect(make_published_run(tmp_path, [[table]]))
    groups = _groups(result.dataset)
    assert groups == [ROW_GROUP_ROWS, ROW_GROUP_ROWS, 300_000 - 2 * ROW_GROUP_ROWS]
    assert pq.read_table(result.dataset).column("a").to_pylist() == list(range(300_000))


def test_groups_stay_under_the_byte_bound(tmp_path: Path) -> None:
    # 3 batches of 100 rows of 1 kB: with a 50 kB bound no group may hold more than 50 rows.
    tables = [pa.table({"t": [f"{i:04d}" * 250 for i in range(b * 100, (b + 1) * 100)]}) for b in range(3)]
    result = collect(make_published_run(tmp_path, [tables]), row_group_bytes=50_000)
    groups = _groups(result.dataset)
    assert sum(groups) == 300 and max(groups) <= 50, groups
    assert pq.read_table(result.dataset).column("t").to_pylist() == [f"{i:04d}" * 250 for i in range(300)]
