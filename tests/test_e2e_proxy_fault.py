"""A dead proxy on the real local Slurm cluster: the proxy is an ``srun`` step in front of two replicas (each
its own step on its own fake GPU). Killing the proxy's task mid-generation fails the client run at once with
``proxy_died``; the in-allocation rerun starts a new proxy step and the shard gets exactly its records.

The same controller paths run with plain processes in tests/test_serving_local.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, WinnerRecord, read_json

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

REPO = Path(__file__).resolve().parents[1]
MIXED_RECIPE = REPO / "examples" / "mixed" / "recipe.yaml"
DDSLURM = str(Path(sys.executable).parent / "ddslurm")
RECORDS = 36
GENERATOR = (
    "deployments:\n  - model_alias: generator\n    model: m\n    served_model_name: qwen3-8b\n"
    "    replicas: 2\n    server:\n      cpus: 1\n      startup_timeout: 120\n"
    "      env: {FAKE_VLLM_LATENCY: '2'}\n"
)


def _cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DDSLURM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def _proxy_tasks(attempt: Path) -> list[int]:
    """The proxy step's task (started by slurmstepd), never the ``srun`` that asked for it; found by the
    attempt's log path in its command line."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[0] != "srun" and "proxy" in argv and str(attempt / "proxy-generator.log") in argv:
            pids.append(int(cmdline.parent.name))
    return pids


def _attempt_with_rows(run_dir: Path, rows: int, timeout: float = 240) -> Path:
    """The running attempt once its progress file shows ``rows`` (a batch on disk: generation under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for progress in run_dir.glob("shards/shard-00000/attempts/attempt-*/progress.json"):
            try:
                if json.loads(progress.read_text())["rows"] >= rows:
                    return progress.parent
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    raise AssertionError(f"no attempt of {run_dir} reached {rows} rows in {timeout} s")


@pytest.mark.parametrize("client_retries", [0, 1])
def test_killed_proxy_step_fails_fast_and_the_rerun_starts_a_new_one(make_run_files: Any, client_retries: int) -> None:
    files = make_run_files(
        f"proxy-fault-{client_retries}",
        num_records=RECORDS,
        shards=1,
        buffer_size=6,
        recipe=MIXED_RECIPE,
        extra_run=GENERATOR + f"client_retries: {client_retries}\nstages: single\n",  # the judge behind the proxy
    )
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    run_dir = Path(json.loads(submitted.stdout)["run_dir"])
    job_id = json.loads(submitted.stdout)["job_id"]
    try:
        attempt = _attempt_with_rows(run_dir, 6)
        [pid] = _proxy_tasks(attempt)
        os.kill(pid, signal.SIGKILL)
        killed = datetime.now().astimezone()
        done = _cli("wait", str(run_dir), "--json", "--timeout", "240", env=files.env, timeout=300)
    except BaseException:
        _cli("cancel", str(run_dir), env=files.env, timeout=60)  # leave no job behind
        raise
    final = json.loads(done.stdout)
    record = read_json(attempt / "attempt.json", AttemptRecord)
    steps = subprocess.run(
        ["sacct", "-n", "-P", "-j", str(job_id), "--format=JobName"], capture_output=True, text=True, check=True
    ).stdout.split()
    if client_retries == 0:
        assert done.returncode == 1 and final["state"] == "failed", done.stdout
        assert (record.state, record.reason, record.retryable) == ("failed", "proxy_died", True), record
        assert "proxy-generator" in (record.message or "")
        assert record.ended_at is not None
        assert (datetime.fromisoformat(record.ended_at) - killed).total_seconds() < 30
        assert steps.count("proxy-generator") == 1
    else:
        assert done.returncode == 0 and final["state"] == "succeeded", (attempt / "client.out").read_text()[-3000:]
        assert record.state == "succeeded" and record.rows == RECORDS and record.client_runs == 2, record
        winner = read_json(run_dir / "shards" / "shard-00000" / "winner.json", WinnerRecord)
        assert winner.rows == RECORDS
        assert pq.read_table(Path(winner.dataset_dir) / "parquet-files").num_rows == RECORDS
        # a new proxy step and a new client step, each under its own Slurm name (NAME.2: the second start of NAME)
        assert steps.count("proxy-generator") == steps.count("proxy-generator.2") == 1, steps
        assert steps.count("client") == steps.count("client.2") == 1, steps
        proxy_log = [json.loads(line)["event"] for line in (attempt / "proxy-generator.log").read_text().splitlines()]
        assert proxy_log.count("proxy.started") == 2
