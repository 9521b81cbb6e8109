"""What ``ddslurm`` loads: importing the CLI, and the commands that only read a run (``status``, ``logs``, ``wait``,
``cancel``), load neither pyarrow, numpy, Data Designer nor the planner. Every command is a process of its own, so
each module loaded for nothing is paid again by every call (the test suite makes hundreds)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import FileEntry, WinnerRecord, encode, publish_once, sha256_file
from ddslurm.launcher import Slurm, submit
from ddslurm.launcher.testing import (
    FakeSlurm,
    InProcessHost,
    accept_every_recipe,
    write_attempt,
    write_unit_run,
)

HEAVY = ("pyarrow", "numpy", "data_designer", "ddslurm.planner")
"""What a command that only reads a run must not load (each a tenth of a second or more of CPU, or the planner)."""

LOADED = f"sorted(m for m in {HEAVY!r} if m in sys.modules)"
"""An expression of the heavy modules a process has loaded."""


def _fresh(code: str) -> Any:
    """What ``code`` prints as its last line, as JSON, run by a fresh interpreter of this environment."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_cli_loads_no_heavy_module() -> None:
    assert _fresh(f"import json, sys\nimport ddslurm.launcher.cli\nprint(json.dumps({LOADED}))") == []


def test_the_package_exports_lazily() -> None:
    """``import ddslurm.launcher`` loads none of its modules; a name is imported when it is first used."""
    code = (
        "import json, sys\nimport ddslurm.launcher as launcher\n"
        "before = sorted(m for m in sys.modules if m.startswith('ddslurm.launcher.'))\n"
        "launcher.run_status\n"
        "print(json.dumps([before, 'ddslurm.launcher.runs._status' in sys.modules, 'run_status' in dir(launcher)]))"
    )
    assert _fresh(code) == [[], True, True]


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run of 3 shards submitted through a fake ``sbatch``, shard 0's attempt running, shard 1's published (its
    winner's files are checked by ``status``)."""
    accept_every_recipe(monkeypatch)
    run, profile, env = write_unit_run(tmp_path, "sk-imports-test-0000", shards=3)
    done = submit(run, profile, slurm=Slurm(FakeSlurm(), user="alice"), host=InProcessHost(), env=env)
    layout = done.layout
    write_attempt(layout, 0, "4242_0", "running", task="4242_0", progress=2)
    write_attempt(layout, 1, "4242_1", "succeeded", task="4242_1")
    dataset = layout.shard(1).attempt("attempt-4242_1").output / "shard-00001"
    (dataset / "parquet-files").mkdir(parents=True)
    batch = dataset / "parquet-files" / "batch_00000.parquet"
    pq.write_table(pa.table({"q": ["a", "b"]}), batch)
    entry = FileEntry(path="parquet-files/batch_00000.parquet", size=batch.stat().st_size, sha256=sha256_file(batch))
    winner = WinnerRecord(
        shard=1, attempt="attempt-4242_1", rows=2, dataset_dir=str(dataset), files=(entry,), plan_sha256="-",
        published_at=datetime.now(UTC).isoformat(),
    )  # fmt: skip
    assert publish_once(layout.shard(1).winner, encode(winner))
    return layout.root


def test_commands_that_read_a_run_load_no_heavy_module(run_dir: Path) -> None:
    """``status`` (JSON and text), ``logs``, ``wait`` (until its timeout) and ``cancel``, with a scheduler that knows
    no job: each ends as it should and none loads a heavy module."""
    code = f"""
import io, json, sys
from ddslurm.launcher.cluster._slurm import Completed, Slurm
from ddslurm.launcher.cli import main

def nothing(argv, *, env=None):
    return Completed(0, "", "")

run = {str(run_dir)!r}
codes = [
    main(argv, slurm=Slurm(nothing, user="alice"), sleep=lambda _: None, stdout=io.StringIO(), stderr=io.StringIO())
    for argv in (
        ["status", run, "--json"],
        ["status", run],
        ["logs", run, "--shard", "0"],
        ["wait", run, "--timeout", "0"],
        ["cancel", run],
    )
]
print(json.dumps([codes, {LOADED}]))
"""
    codes, loaded = _fresh(code)
    assert codes == [0, 0, 1, 3, 0]  # logs: shard 0 has no log yet; wait: its timeout
    assert loaded == []
