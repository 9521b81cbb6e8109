"""Collection with real Data Designer output, and a collection job killed half-way on the local cluster."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.collector import EXIT_FAILED, collect
from ddslurm.collector.testing import blocked_stderr, make_published_run
from ddslurm.config import Resources, RunLayout, WinnerRecord, atomic_write, encode, read_json, read_plan
from ddslurm.config.testing import make_plan
from ddslurm.launcher import Completed, Slurm
from ddslurm.launcher.cli import main

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


_HELD_COLLECT = """#!{python}
# The real collector, held when every part is in its staging directory and only the manifest and the publication
# are left: it says so in {event} and waits there until it is cancelled.
import sys
import time
from pathlib import Path

from ddslurm.collector import _merge

write = _merge.atomic_write


def held(path: Path, data: bytes) -> None:
    if path.name == _merge.MANIFEST:
        Path({event!r}).write_text(str(path.parent))
        while True:
            time.sleep(3600)
    write(path, data)


_merge.atomic_write = held
from ddslurm.collector.cli import main

sys.exit(main())
"""


@pytest.mark.slurm
def test_killed_collection_job_publishes_nothing_and_a_rerun_succeeds(tmp_path: Path) -> None:
    """The collection job is cancelled at the last moment it can be (every part written to its staging directory,
    its manifest and publication left: the real collector, held there by its python_env's wrapper, says so in a
    file): nothing is published, the staging directory is removed, and a rerun publishes every row."""
    from tests.e2e import until

    tables = [[pa.table({"a": list(range(i * 20, (i + 1) * 20)), "t": ["x" * 100] * 20}) for i in range(50)]]
    layout = make_published_run(tmp_path, tables)
    event = tmp_path / "publishing"
    held_env = tmp_path / "held-env"
    (held_env / "bin").mkdir(parents=True)
    wrapper = held_env / "bin" / "ddslurm-collect"
    wrapper.write_text(_HELD_COLLECT.format(python=sys.executable, event=str(event)))
    wrapper.chmod(0o755)
    plan = make_plan(
        layout.run_id,
        (1000,),
        python_env=str(held_env),
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
    until(lambda: event.exists() or proc.poll() is not None, 240, "the collection job to reach its publishing")
    assert event.exists(), proc.communicate(timeout=60)
    assert Path(event.read_text()).is_dir()  # its staging directory, every part written, not yet published
    job_id = next(layout.logs.glob("collect-*.out")).stem.removeprefix("collect-")
    subprocess.run(["scancel", job_id], check=True)  # by id: other tests' jobs may carry the same name
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "ended CANCELLED" in err, (proc.returncode, out, err)
    assert not layout.dataset.exists()
    assert not list(layout.root.glob(".dataset.staging-*"))  # the job cleaned up on SIGTERM
    _for_slurm(layout)  # the rerun: the collector as it is
    again = subprocess.run(
        [str(DDSLURM), "collect", str(layout.root), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert pq.read_table(layout.dataset).num_rows == 1000


def _for_slurm(layout: RunLayout) -> None:
    """Let the run's collection job run on the local cluster's CPU partition with this checkout's venv."""
    plan = msgspec.structs.replace(
        read_plan(layout.plan),
        python_env=str(REPO / ".venv"),
        collection=Resources(time_minutes=5, partition="cpu", memory="1G"),
    )
    atomic_write(layout.plan, encode(plan))


def _refusing_slurm(calls: list[list[str]]) -> Slurm:
    def runner(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        calls.append(list(argv))
        return Completed(1, "", "this test submits nothing")

    return Slurm(runner=runner)


def test_collect_checks_winners_and_destination_before_it_submits_a_job(tmp_path: Path) -> None:
    missing = make_published_run(
        tmp_path / "missing", [[pa.table({"a": [1]})], [pa.table({"a": [2]})]], publish=[True, False]
    )
    existing = make_published_run(tmp_path / "existing", [[pa.table({"a": [1]})]])
    existing.dataset.mkdir()
    calls: list[list[str]] = []
    for layout, message in ((missing, "no published result"), (existing, "already exists")):
        err = io.StringIO()
        rc = main(["collect", str(layout.root)], env={}, slurm=_refusing_slurm(calls), stdout=io.StringIO(), stderr=err)
        assert rc == EXIT_FAILED and message in err.getvalue(), err.getvalue()
        assert not list(layout.root.glob("collect-*.sbatch"))
    assert calls == []


def test_sigterm_to_collect_local_unwinds_without_a_traceback(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [i]}) for i in range(3)]])
    with blocked_stderr() as pipe:
        proc = subprocess.Popen(
            [str(DDSLURM), "collect", str(layout.root), "--local"], stderr=pipe.write_fd, stdout=subprocess.DEVNULL
        )
        pipe.child_started()
        assert pipe.wait_for(lambda: any(layout.root.glob(".dataset.staging-*")), proc), "collection never started"
        proc.send_signal(signal.SIGTERM)
        err = pipe.drain()
        rc = proc.wait(timeout=30)
    assert rc == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted" in err
    assert not list(layout.root.glob(".dataset.staging-*"))
    assert not layout.dataset.exists()


def _conflict(root: Path) -> RunLayout:
    return make_published_run(root, [[pa.table({"a": [1]})], [pa.table({"a": ["one"]})]])


def _changed(root: Path) -> RunLayout:
    layout = make_published_run(root, [[pa.table({"a": [1, 2, 3]})]])
    batch = next(layout.shards.rglob("batch_00000.parquet"))
    size = batch.stat().st_size
    pq.write_table(pa.table({"a": [7, 8, 9]}), batch)
    assert batch.stat().st_size == size
    return layout


@pytest.mark.slurm
@pytest.mark.parametrize("make", [_conflict, _changed], ids=["schema-conflict", "batch-changed-in-place"])
def test_local_and_slurm_collection_fail_alike(tmp_path: Path, make: Any) -> None:
    layout = make(tmp_path)
    _for_slurm(layout)
    results = {}
    for mode in ("--local", None):
        argv = [str(DDSLURM), "collect", str(layout.root), *([mode] if mode else [])]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        results[mode] = (proc.returncode, errors[0] if errors else proc.stderr)
    assert results["--local"] == results[None], results
    assert results[None][0] == EXIT_FAILED
    assert not layout.dataset.exists()
    assert not list(layout.root.glob(".dataset.staging-*"))
