"""Published batch files are verified against their recorded sha256 while they are read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.collector import BatchChangedError, CollectError, collect, verify_winner
from ddslurm.collector.testing import make_published_run
from ddslurm.config import RunLayout, WinnerRecord, read_json

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies


def _winner(layout: RunLayout, shard: int) -> WinnerRecord:
    return read_json(layout.shard(shard).winner, WinnerRecord)


def _rewrite_same_size(path: Path, table: pa.Table) -> None:
    """Replace ``path`` in place with ``table``: a different file of exactly the same size."""
    size = path.stat().st_size
    pq.write_table(table, path)
    assert path.stat().st_size == size, "the test needs a same-size change"


def test_batch_changed_in_place_with_the_same_size_is_refused(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2, 3]})], [pa.table({"a": [4, 5, 6]})]])
    batch = Path(_winner(layout, 1).dataset_dir) / "parquet-files" / "batch_00000.parquet"
    expected = _winner(layout, 1).files[0].sha256
    _rewrite_same_size(batch, pa.table({"a": [7, 8, 9]}))
    with pytest.raises(BatchChangedError) as err:
        collect(layout)
    msg = str(err.value)
    assert "shard 1" in msg and "parquet-files/batch_00000.parquet" in msg and "changed since it was published" in msg
    assert expected in msg and err.value.expected == expected and err.value.actual not in (None, expected)
    assert err.value.actual is not None and err.value.actual in msg
    assert err.value.shard == 1
    assert not layout.dataset.exists()
    assert not [p for p in layout.root.iterdir() if "staging" in p.name]


def test_missing_batch_file_is_named_with_its_shard(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1]}), pa.table({"a": [2]})]])
    batch = Path(_winner(layout, 0).dataset_dir) / "parquet-files" / "batch_00001.parquet"
    batch.unlink()
    with pytest.raises(BatchChangedError, match=r"shard 0: parquet-files/batch_00001\.parquet .*missing"):
        collect(layout)
    assert not layout.dataset.exists()


def test_verify_winner_lists_every_file_that_no_longer_verifies(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2, 3]}), pa.table({"a": [1]}), pa.table({"a": [5]})]])
    winner = _winner(layout, 0)
    assert verify_winner(winner) == []
    files = Path(winner.dataset_dir) / "parquet-files"
    _rewrite_same_size(files / "batch_00000.parquet", pa.table({"a": [3, 2, 1]}))
    (files / "batch_00001.parquet").unlink()
    problems = verify_winner(winner)
    assert len(problems) == 2
    assert verify_winner(winner, hashes=False) == [problems[1]]  # sizes only: the same-size change goes unseen
    assert "batch_00000.parquet" in problems[0] and "sha256" in problems[0]
    assert "batch_00001.parquet" in problems[1] and "missing" in problems[1]
    # the dataset directory can be given explicitly (a winner whose files were moved, say)
    assert "is missing" in verify_winner(winner, tmp_path / "elsewhere")[0]


def test_corrupt_winner_record_is_a_collect_error_naming_the_shard(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1]})], [pa.table({"a": [2]})]])
    winner = layout.shard(1).winner
    winner.chmod(0o600)
    winner.write_bytes(b'{"shard": 1, "attempt": ')
    with pytest.raises(CollectError, match=r"shard 1: .*winner\.json"):
        collect(layout)
    assert not layout.dataset.exists()


def _rchar() -> int:
    """Bytes this process has read through read(2) and friends (page cache included)."""
    for line in Path(f"/proc/{os.getpid()}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_each_batch_is_read_once_and_the_output_is_never_read_back(tmp_path: Path) -> None:
    # Random bytes do not compress: the files are as large as the data, so a second pass over the input
    # (hashing before reading) or over the output (hashing after writing) shows as twice the bytes read.
    tables = [[pa.table({"b": [os.urandom(1000) for _ in range(1000)]}) for _ in range(4)]]
    layout = make_published_run(tmp_path, tables)
    inputs = sum(f.size for f in _winner(layout, 0).files)
    before = _rchar()
    result = collect(layout)
    read = _rchar() - before
    assert result.rows == 4000
    assert inputs <= read < 1.25 * inputs, (read, inputs)


def test_plain_collection_imports_neither_pyarrow_dataset_nor_pandas(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]}), pa.table({"a": [3]})]])
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ddslurm.collector import collect\n"
        "from ddslurm.config import RunLayout\n"
        f"assert collect(RunLayout(Path({str(layout.root)!r}))).rows == 3\n"
        "print(sorted(m for m in ('pandas', 'pyarrow.dataset') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_output_is_owner_only_and_its_manifest_hashes_match_the_files(tmp_path: Path) -> None:
    from ddslurm.collector import read_manifest
    from ddslurm.config import sha256_file

    layout = make_published_run(tmp_path, [[pa.table({"a": list(range(i, i + 500))}) for i in range(4)]])
    result = collect(layout, target_file_bytes=1, row_group_rows=1000)
    manifest = read_manifest(result.dataset)
    assert len(manifest.files) == 2
    for entry in manifest.files:
        path = result.dataset / entry.path
        assert path.stat().st_mode & 0o777 == 0o600
        assert (path.stat().st_size, sha256_file(path)) == (entry.size, entry.sha256)
