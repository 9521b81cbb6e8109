"""docs/python-api.md as a user reads it: its first ``python`` block runs as written, with ``python`` from the
repository root, against the local Slurm cluster and the hosted stand-in (the environment ``tools/demo`` sets up:
Data Designer's home with the endpoint's port, the key in ``DEMO_HOSTED_API_KEY``), and prints the directory of a
dataset holding the run file's rows; the page names every name the API exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import load_run_file
from ddslurm.launcher import api

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "python-api.md"
RUN_FILE = ROOT / "examples" / "hosted-only" / "run.yaml"
"""The run file the example submits (``examples/hosted-only/run.yaml``, with ``examples/local-profile.yaml``)."""
KEY_ENV = "DEMO_HOSTED_API_KEY"
"""The variable the example's ``model_providers.yaml`` names for the key."""


def first_python_block(page: Path) -> str:
    found = re.search(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
    assert found is not None, f"{page} has no python block"
    return found.group(1)


def test_the_page_names_every_name_the_api_exports() -> None:
    """What is stable is the module's ``__all__`` (pinned in packages/launcher/tests/test_api.py): the page says so
    by name."""
    text = PAGE.read_text()
    assert [name for name in api.__all__ if f"`{name}" not in text] == []


@pytest.mark.slurm
@pytest.mark.dd
def test_the_example_runs_as_written_and_prints_a_dataset_of_the_run_files_rows(
    hosted_endpoint: Any, tmp_path: Path, scan_for_secret: Any
) -> None:
    block = first_python_block(PAGE)
    assert '"examples/hosted-only/run.yaml", "examples/local-profile.yaml"' in block  # paths from the root
    home = tmp_path / "dd-home"  # as tools/demo makes it: the example's settings, the endpoint's port in them
    home.mkdir()
    providers = (ROOT / "examples" / "hosted-only" / "dd-home" / "model_providers.yaml").read_text()
    endpoint = re.sub(r"http://127\.0\.0\.1:\d+/v1", hosted_endpoint.base_url, providers)
    assert endpoint != providers
    (home / "model_providers.yaml").write_text(endpoint)
    env = {k: v for k, v in os.environ.items() if k not in {"DDSLURM_PROFILE", KEY_ENV}}
    env |= {"DATA_DESIGNER_HOME": str(home), KEY_ENV: hosted_endpoint.api_key}
    work = ROOT / ".ddslurm-work"  # the profile's workspace: the run and what wait and collect record of it
    runs_before = set((work / "runs").iterdir()) if (work / "runs").is_dir() else set()
    facts_before = (work / "facts.json").read_bytes() if (work / "facts.json").is_file() else None
    try:
        done = subprocess.run(
            [sys.executable, "-c", block], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False
        )
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        dataset = Path(done.stdout.splitlines()[-1])
        run_dir = dataset.parent
        assert run_dir in set((work / "runs").iterdir()) - runs_before and dataset == run_dir / "dataset"
        rows = load_run_file(RUN_FILE).num_records
        assert dataset.is_dir() and pq.read_table(dataset).num_rows == rows == 40
        assert f"{rows} rows" in done.stdout.splitlines()
        assert hosted_endpoint.api_key not in done.stdout + done.stderr
        assert scan_for_secret(run_dir, hosted_endpoint.api_key) == []
    finally:  # the run is the example's, in the repository's workspace: nothing of it is kept
        name = load_run_file(RUN_FILE).name  # a run of the example's, made now (another test's is never touched)
        for made in set((work / "runs").glob(f"{name}-*")) - runs_before:
            shutil.rmtree(made, ignore_errors=True)
        if facts_before is None:
            (work / "facts.json").unlink(missing_ok=True)
        else:
            (work / "facts.json").write_bytes(facts_before)
