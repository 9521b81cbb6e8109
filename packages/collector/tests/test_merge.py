"""Collection: winners in shard order, schema unified by name, values unchanged, published atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.collector import (
    MANIFEST_VERSION,
    CollectError,
    DestinationExistsError,
    MissingWinnersError,
    SchemaConflictError,
    SchemaField,
    collect,
    manifest_schema,
    read_manifest,
)
from ddslurm.collector.cli import main as collect_main
from ddslurm.collector.testing import make_published_run
from ddslurm.config import Plan, digest, read_json, sha256_file

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies


def _rows(tables: list[pa.Table]) -> list[dict[str, Any]]:
    return [row for t in tables for row in t.to_pylist()]


CASES = [
    pytest.param(
        [[pa.table({"a": [1, 2], "b": ["x", "y"]})], [pa.table({"b": ["z"], "a": [3]})]],
        id="reordered-columns",
    ),
    pytest.param(
        [[pa.table({"a": [1, 2]})], [pa.table({"a": [1.5]})]],
        id="int-float-widening",
    ),
    pytest.param(
        [[pa.table({"a": [1], "n": pa.nulls(1)})], [pa.table({"a": [2], "n": ["text"]})]],
        id="null-only-column",
    ),
    pytest.param(
        [[pa.table({"a": [1], "extra": ["e"]})], [pa.table({"a": [2]})]],
        id="missing-column-becomes-null",
    ),
    pytest.param(
        [
            [pa.table({"s": [{"score": 1, "reasoning": "r"}]}), pa.table({"s": [{"reasoning": "q", "score": 2}]})],
            [pa.table({"s": [{"score": 3, "reasoning": "w"}]})],
        ],
        id="struct-fields-reordered",
    ),
    pytest.param(
        [[pa.table({"s": [{"score": 1, "reasoning": "r"}]})], [pa.table({"s": [{"reasoning": "only"}]})]],
        id="struct-field-missing-in-a-batch",
    ),
    pytest.param(
        [[pa.table({"a": pa.array([1], type=pa.int32())})], [pa.table({"a": pa.array([2**40], type=pa.int64())})]],
        id="int32-int64-widening",
    ),
    pytest.param(
        [[pa.table({"l": pa.array([[]], type=pa.list_(pa.null()))})], [pa.table({"l": [[{"k": 1}]]})]],
        id="empty-list-vs-list-of-structs",
    ),
]


@pytest.mark.parametrize("shards", CASES)
def test_collect_unifies_schema_without_changing_values(tmp_path: Path, shards: list[list[pa.Table]]) -> None:
    layout = make_published_run(tmp_path, shards)
    result = collect(layout)
    out = pq.read_table(result.dataset)
    want = _rows([t for batches in shards for t in batches])
    got = out.to_pylist()
    assert len(got) == len(want) == result.rows
    for g, w in zip(got, want, strict=True):
        for name, value in w.items():
            if isinstance(value, dict):
                assert {k: g[name][k] for k in value} == value
            else:
                assert g[name] == value, name
        for name in set(g) - set(w):
            assert g[name] is None


def test_collect_conflict_names_column_types_and_files(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1]})], [pa.table({"a": ["one"]})]])
    with pytest.raises(SchemaConflictError) as err:
        collect(layout)
    msg = str(err.value)
    assert "'a'" in msg and "int64" in msg and "string" in msg and "batch_00000.parquet" in msg
    assert not layout.dataset.exists()


def test_collect_puts_columns_in_the_plans_order_whatever_each_file_says(tmp_path: Path) -> None:
    # Data Designer writes columns in the order their cells were first written, which differs between files.
    shards = [
        [pa.table({"b": [1], "a": ["x"], "c": [None]}), pa.table({"a": ["y"], "c": [1.5], "b": [2]})],
        [pa.table({"c": [2.5], "b": [3], "a": ["z"]})],
    ]
    layout = make_published_run(tmp_path, shards, column_order=("a", "b", "c"))
    out = pq.read_table(collect(layout).dataset)
    assert out.column_names == ["a", "b", "c"]
    assert out.to_pylist() == [
        {"a": "x", "b": 1, "c": None},
        {"a": "y", "b": 2, "c": 1.5},
        {"a": "z", "b": 3, "c": 2.5},
    ]


def test_collect_with_a_column_order_refuses_a_file_with_other_columns(tmp_path: Path) -> None:
    shards = [[pa.table({"a": ["x"], "b": [1]})], [pa.table({"a": ["y"], "d": [2]})]]
    layout = make_published_run(tmp_path, shards, column_order=("a", "b"))
    with pytest.raises(SchemaConflictError, match="not expected 'd'; missing 'b'"):
        collect(layout)
    assert not layout.dataset.exists()


def test_collect_refuses_missing_winners_and_publishes_nothing(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1]})], [pa.table({"a": [2]})]], publish=[True, False])
    with pytest.raises(MissingWinnersError) as err:
        collect(layout)
    assert err.value.shards == [1]
    assert not layout.dataset.exists()


def test_collect_never_overwrites_unless_asked(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2, 3]})]])
    first = collect(layout)
    before = sha256_file(first.files[0])
    with pytest.raises(DestinationExistsError):
        collect(layout)
    assert sha256_file(first.files[0]) == before
    again = collect(layout, overwrite=True)
    assert again.rows == 3
    assert [p.name for p in layout.root.iterdir() if p.name.startswith(".")] == []


def test_manifest_lists_rows_files_winners_and_plan_hash(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]}), pa.table({"a": [3]})], [pa.table({"a": [4]})]])
    result = collect(layout)
    manifest = read_manifest(result.dataset)
    assert manifest.rows == 4
    assert [(s.shard, s.rows, s.attempt) for s in manifest.shards] == [(0, 3, "attempt-1"), (1, 1, "attempt-1")]
    assert manifest.files and all(sha256_file(result.dataset / f.path) == f.sha256 for f in manifest.files)
    assert manifest.version == MANIFEST_VERSION
    assert [(f.name, f.type) for f in manifest.schema] == [("a", "int64")]
    assert manifest.plan_sha256 == digest(read_json(layout.plan, Plan))


def test_manifest_schema_is_machine_readable_and_complete(tmp_path: Path) -> None:
    """Every column with its nested fields, and the exact Arrow schema, however wide (the text was truncated)."""
    wide = {f"c{i:03d}": [i] for i in range(300)}
    nested = {"s": [{"score": 1, "why": "r"}], "l": [[{"k": 1}]]}
    layout = make_published_run(tmp_path, [[pa.table({**wide, **nested})]])
    result = collect(layout)
    manifest = read_manifest(result.dataset)
    assert not isinstance(manifest.schema, str)
    assert [f.name for f in manifest.schema] == [*wide, "s", "l"]
    by_name = {f.name: f for f in manifest.schema}
    assert by_name["s"].fields == (
        SchemaField(name="score", type="int64"),
        SchemaField(name="why", type="string"),
    )
    assert by_name["l"].fields[0].fields == (SchemaField(name="k", type="int64"),)
    exact = manifest_schema(manifest)
    assert exact is not None
    assert exact.equals(pq.read_schema(result.files[0]), check_metadata=False)


def test_manifest_marks_partial_shards(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]})], [pa.table({"a": [3]})]], partial=[1])
    manifest = read_manifest(collect(layout).dataset)
    assert [(s.shard, s.partial) for s in manifest.shards] == [(0, False), (1, True)]


def test_a_version_1_manifest_stays_readable(tmp_path: Path) -> None:
    old = (
        '{"collected_at": "2026-01-01T00:00:00+00:00", "files": [{"path": "part-00000.parquet", "sha256": "ab", '
        '"size": 5}], "plan_sha256": "cd", "rows": 3, "run_id": "r", "schema": "a: int64\\nb: large_string", '
        '"shards": [{"attempt": "attempt-1", "rows": 3, "shard": 0}]}'
    )
    (tmp_path / "_manifest.json").write_text(old)
    manifest = read_manifest(tmp_path)
    assert manifest.version == 1
    assert manifest.schema == "a: int64\nb: large_string"
    assert manifest.shards[0].partial is False
    assert manifest_schema(manifest) is None


def test_collect_splits_output_into_files_of_target_size(tmp_path: Path) -> None:
    tables = [pa.table({"a": list(range(i * 1000, (i + 1) * 1000))}) for i in range(4)]
    layout = make_published_run(tmp_path, [tables])
    result = collect(layout, target_file_bytes=1, row_group_rows=1000)
    assert len(result.files) == 4
    assert pq.read_table(result.dataset).column("a").to_pylist() == list(range(4000))


def test_small_batches_are_merged_into_sensible_row_groups(tmp_path: Path) -> None:
    tables = [pa.table({"a": list(range(i * 100, (i + 1) * 100))}) for i in range(30)]
    result = collect(make_published_run(tmp_path, [tables[:15], tables[15:]]), row_group_rows=1000)
    meta = pq.ParquetFile(result.files[0]).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [1000, 1000, 1000]
    assert pq.read_table(result.dataset).column("a").to_pylist() == list(range(3000))


def test_collect_detects_batch_changed_after_publication(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1]})]])
    batch = next(layout.shards.rglob("batch_00000.parquet"))
    pq.write_table(pa.table({"a": [1, 2, 3, 4, 5, 6]}), batch)
    with pytest.raises(CollectError, match="changed since it was published"):
        collect(layout)


def test_interrupted_collection_leaves_nothing_visible_and_rerun_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1]}), pa.table({"a": [2]})]])

    def boom(done: int, total: int) -> None:
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(layout, progress=boom)
    assert not layout.dataset.exists()
    assert not [p for p in layout.root.iterdir() if "staging" in p.name]
    assert collect(layout).rows == 2


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]})]])
    assert collect_main([str(layout.root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 2 and out["dataset"] == str(layout.dataset)
    assert collect_main([str(layout.root)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_lossy_widening_is_a_conflict_not_a_rounding(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [2**53 + 1]})], [pa.table({"a": [0.5]})]])
    with pytest.raises(SchemaConflictError, match=r"column 'a' in .*batch_00000\.parquet \(int64\) cannot become"):
        collect(layout)
    assert not layout.dataset.exists()


def test_leftovers_of_a_killed_collection_are_removed_and_rerun_succeeds(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]})]])
    stale = layout.root / ".dataset.staging-deadbeef"
    stale.mkdir()
    (stale / "part-00000.parquet").write_bytes(b"half written")
    assert collect(layout).rows == 2
    assert not stale.exists()


def test_one_collection_of_a_run_at_a_time(tmp_path: Path) -> None:
    import fcntl
    import os

    layout = make_published_run(tmp_path, [[pa.table({"a": [1]})]])
    layout.collections.mkdir()
    fd = os.open(layout.collections / "collect.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(CollectError, match="another collection"):
            collect(layout)
    finally:
        os.close(fd)
    assert collect(layout).rows == 1
