"""A collection whose output does not fit (a full disk or quota) fails like any other: ``error: cannot write
PATH: No space left on device ...; nothing was published``, exit 1, no traceback, no dataset and no staging
directory left. On a real small tmpfs where this process may mount one (root); a failing write injected
everywhere."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ddslurm.collector import CollectError, collect
from ddslurm.collector import _writer as writer_module
from ddslurm.collector.testing import make_published_run

COLLECT = Path(sys.executable).parent / "ddslurm-collect"


def _blobs(root: Path) -> Path:
    """A published run of 2 shards, 3 batches each of 40 KB of random bytes (~240 KB that Parquet cannot
    compress); its run directory."""
    layout = make_published_run(root, [[pa.table({"blob": [os.urandom(40_000)]}) for _ in range(3)] for _ in range(2)])
    return layout.root


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs of ``request.param`` (a size such as ``40k``, or ``mount -o`` options such as
    ``size=4m,nr_inodes=2``) at ``tmp_path / "out"``."""
    out = tmp_path / "out"
    out.mkdir()
    options = request.param if "=" in request.param else f"size={request.param}"
    mount = ["mount", "-t", "tmpfs", "-o", f"{options},mode=0700", "tmpfs", str(out)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True, check=False).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield out
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)


@pytest.mark.parametrize("small_disk", ["4k", "40k", "160k"], indirect=True)
def test_ddslurm_collect_onto_a_full_disk_says_so_and_leaves_nothing(tmp_path: Path, small_disk: Path) -> None:
    run_dir = _blobs(tmp_path / "run")
    dataset = small_disk / "dataset"
    done = subprocess.run(
        [str(COLLECT), str(run_dir), "--output", str(dataset)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "part-00000.parquet: No space left on device" in error[0], done.stderr
    assert "the file system or your quota is full; nothing was published" in error[0]
    assert list(small_disk.iterdir()) == []  # neither the dataset nor its staging directory


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
@pytest.mark.parametrize("after", [0, 100_000, 250_000])  # bytes written before the disk is full
def test_a_write_that_fails_anywhere_is_a_collect_error_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, after: int
) -> None:
    layout = make_published_run(
        tmp_path, [[pa.table({"blob": [os.urandom(40_000)]}) for _ in range(3)] for _ in range(3)]
    )
    real = writer_module._HashingFile.write
    written = {"bytes": 0}

    def write(self: Any, data: Any) -> int:
        written["bytes"] += len(memoryview(data))
        if written["bytes"] > after:
            raise OSError(code, os.strerror(code))
        return real(self, data)

    monkeypatch.setattr(writer_module._HashingFile, "write", write)
    with pytest.raises(CollectError) as info:
        collect(layout, target_file_bytes=100_000)  # several files: the failure may come at the second or third
    assert os.strerror(code) in str(info.value) and "nothing was published" in str(info.value)
    assert ("quota is full" in str(info.value)) == (code != errno.EIO)
    assert "part-0000" in str(info.value)
    assert not layout.dataset.exists()
    assert not list(layout.root.glob(".dataset.*"))


@pytest.mark.parametrize("small_disk", ["size=4m,nr_inodes=2", "size=4m,nr_inodes=3"], indirect=True)
def test_a_disk_out_of_inodes_at_the_staging_directory_or_the_manifest_is_an_error_too(
    tmp_path: Path, small_disk: Path
) -> None:
    """Out of inodes at the staging directory, a part file or the manifest: exit 1 and one error line, never a
    traceback (the Slurm collection job's ``ddslurm-collect`` caught only its own write errors)."""
    run_dir = _blobs(tmp_path / "run")
    done = subprocess.run(
        [str(COLLECT), str(run_dir), "--output", str(small_disk / "dataset")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error: ")], done.stderr
    assert "nothing was published" in done.stderr and not (small_disk / "dataset").exists()
