"""What the benchmarks that submit real runs to the local Slurm cluster share: the run's files, waiting for its
jobs, and reading the times of the logs and of sacct."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from ddslurm.launcher import Prepared

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_root(root: Path, recipe: str, providers: str = "providers: []\n", log_env: str = "") -> Path:
    """``root`` with the recipe, a Data Designer home holding ``providers``, ``logs/`` and the profile's ``vllm``: a
    wrapper that gives each stand-in process its own request log (``logs/requests-<job>-<pid>.jsonl``; more
    ``FAKE_VLLM_*`` settings in ``log_env``). Returns the wrapper."""
    root.mkdir(parents=True)
    (root / "dd-home").mkdir()
    (root / "dd-home" / "model_providers.yaml").write_text(providers)
    (root / "recipe.yaml").write_text(recipe)
    (root / "logs").mkdir()
    wrapper = root / "vllm"
    log = f"{root}/logs/requests-${{SLURM_JOB_ID:-local}}-$$.jsonl"
    wrapper.write_text(f'#!/bin/sh\nFAKE_VLLM_REQUEST_LOG="{log}" {log_env}exec "{BIN / "fake-vllm"}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def write_profile(root: Path, wrapper: Path) -> Path:
    profile = root / "profile.yaml"
    profile.write_text(
        f"name: bench\nworkspace: {root / 'work'}\npython_env: {REPO / '.venv'}\npartition: gpu\n"
        f"cpu_partition: cpu\ngpus_per_node: 4\nvllm_executable: {wrapper}\n"
    )
    return profile


def wait_jobs(jobs: list[str], env: Mapping[str, str], timeout: float) -> None:
    """Until the jobs (their teardown included) have left the queue; cancelled after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", ",".join(jobs)], capture_output=True, text=True, env=env)
        if out.returncode == 0 and not out.stdout.strip():
            return
        time.sleep(0.5)
    subprocess.run(["scancel", *jobs], env=env, check=False)
    raise RuntimeError(f"jobs {jobs} did not finish within {timeout:.0f} s")


def epoch(stamp: str) -> float:
    """An ISO time as epoch seconds: the logs' UTC stamps, or sacct's local times without a zone."""
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return parsed.timestamp() if parsed.tzinfo else parsed.astimezone().timestamp()


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a log that also holds other lines (a job's slurm output); none if it is missing."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@contextmanager
def scratch(prefix: str, keep: bool) -> Iterator[Path]:
    """A temporary directory for the benchmark's runs: removed afterwards, or kept (``--keep``) and printed."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if keep:
            print(f"run directories: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def unsized(prepared: Prepared) -> Prepared:
    """The prepared run with the client sizing taken out of its plan (as compiled before it): Data Designer runs
    each local alias with its default ``max_parallel_requests`` (4)."""
    plan = prepared.plan
    assert plan.serving is not None
    deployments = tuple(
        msgspec.structs.replace(d, capacity=None, max_parallel_requests=None) for d in plan.serving.deployments
    )
    serving = msgspec.structs.replace(plan.serving, deployments=deployments)
    return dataclasses.replace(prepared, plan=msgspec.structs.replace(plan, serving=serving))
