"""Collection with real Data Designer output, and a collection job killed half-way on the local cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.collector import collect
from ddslurm.collector.testing import make_published_run
from ddslurm.config import Resources, RunLayout, WinnerRecord, atomic_write, encode, read_json
from ddslurm.config.testing import make_plan

REPO = Path(__file__).resolve().parents[1]
RUNTIME = Path(sys.executable).parent / "ddslurm-runtime"
DDSLURM = Path(sys.executable).parent / "ddslurm"


@pytest.mark.dd
def test_batches_of_a_real_dd_run_with_different_column_orders_collect_row_for_row(
    make_run_files: Any, local_attempt: Any, tmp_path: Path
) -> None:
    files = make_run_files("dd", num_records=6, shards=1, buffer_size=3)
    run_dir, proc = local_attempt(files, "1")
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    winner = read_json(RunLayout(run_dir).shard(0).winner, WinnerRecord)
    batches = [pq.read_table(Path(winner.dataset_dir) / f.path) for f in winner.files]
    assert len(batches) == 2
    # Data Designer writes independent columns in the order they finish; make the second batch disagree.
    second = batches[1].select(list(reversed(batches[1].column_names)))
    assert second.column_names != batches[0].column_names
    layout = make_published_run(tmp_path / "merge", [[batches[0], second]])
    out = pq.read_table(collect(layout).dataset)
    assert out.column_names == batches[0].column_names
    want = batches[0].to_pylist() + batches[1].to_pylist()
    assert out.to_pylist() == want


@pytest.mark.slurm
def test_killed_collection_job_publishes_nothing_and_a_rerun_succeeds(tmp_path: Path) -> None:
    # Enough batch files that reading them takes seconds: the job is cancelled while it works.
    tables = [[pa.table({"a": list(range(i * 20, (i + 1) * 20)), "t": ["x" * 100] * 20}) for i in range(2000)]]
    layout = make_published_run(tmp_path, tables)
    plan = make_plan(
        layout.run_id,
        (40000,),
        python_env=str(REPO / ".venv"),
        collection=Resources(time_minutes=5, partition="cpu", memory="1G"),
    )
    atomic_write(layout.plan, encode(plan))
    env = {**os.environ}
    proc = subprocess.Popen(
        [str(DDSLURM), "collect", str(layout.root), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Cancel once the job reports progress, well before it is done (it prints every 5 % of the files).
    deadline = time.monotonic() + 90
    started = False
    while time.monotonic() < deadline and not started and proc.poll() is None:
        logs = "".join(p.read_text(errors="replace") for p in layout.logs.glob("collect-*.out"))
        started = "collected 100/2000 batch files" in logs
        time.sleep(0.02)
    assert started, "the collection job never reported progress"
    assert list(layout.root.glob(".dataset.staging-*"))
    subprocess.run(["scancel", "--name=ddslurm-collect-test"], check=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "ended CANCELLED" in err, (out, err)
    assert not layout.dataset.exists()
    assert not list(layout.root.glob(".dataset.staging-*"))  # the job cleaned up on SIGTERM
    again = subprocess.run(
        [str(DDSLURM), "collect", str(layout.root), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert pq.read_table(layout.dataset).num_rows == 40000
