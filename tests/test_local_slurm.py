"""Real behaviour of the local Slurm cluster started by tools/local-slurm (see docs/local-slurm.md).

Safe next to other tests that submit jobs: only our own job ids are inspected, nothing is cancelled and
the queue is not assumed to be empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e import local_slurm_tool

pytestmark = pytest.mark.slurm

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_SLURM = REPO_ROOT / "tools" / "local-slurm"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _job_env() -> dict[str, str]:
    """Our environment without GPU/Slurm variables that would leak into jobs via --export=ALL."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPU_", "SLURM_"))}


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_job_env(), check=False)


def _submit(tmp_path: Path, *options: str, script: str) -> tuple[str, Path]:
    out = tmp_path / "job.out"
    proc = _run(["sbatch", "--parsable", "-J", "test-local-slurm", "-o", str(out), *options, "--wrap", script])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], out


def _job_state(job_id: str) -> str:
    proc = _run(["scontrol", "show", "job", "-o", job_id])
    for field in proc.stdout.split():
        if field.startswith("JobState="):
            return field.removeprefix("JobState=")
    return ""


def _wait_final(job_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = _job_state(job_id)
        if state in FINAL_STATES:
            return state
        time.sleep(0.2)
    pytest.fail(f"job {job_id} not finished after {timeout}s (last state {state or 'unknown'})")


def _env_lines(path: Path) -> dict[str, str]:
    text = path.read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_all_nodes_up(slurm_cluster) -> None:
    proc = _run(["sinfo", "-h", "-N", "-o", "%N %P %t"])
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    states = {node: state for node, _, state in rows}
    partitions: dict[str, set[str]] = {}
    for node, partition, _ in rows:
        partitions.setdefault(partition.rstrip("*"), set()).add(node)
    assert set(states) == set(slurm_cluster.nodes)
    # up as the tool calls it (test_a_node_planned_for_a_pending_job_is_up): idle or mix; alloc/comp when other tests'
    # jobs fill a node right now, plnd when the backfill scheduler has planned another test's pending job on it
    assert all(local_slurm_tool().node_ok(state) for state in states.values()), states
    assert partitions[slurm_cluster.gpu_partition] == set(slurm_cluster.gpu_nodes)
    assert partitions[slurm_cluster.cpu_partition] == set(slurm_cluster.nodes)


def test_gpu_job_sees_two_devices(slurm_cluster, tmp_path: Path) -> None:
    job_id, out = _submit(
        tmp_path,
        "-p",
        slurm_cluster.gpu_partition,
        "--gres=gpu:2",
        script='echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"; echo "NODE=$SLURMD_NODENAME"',
    )
    assert _wait_final(job_id) == "COMPLETED"
    env = _env_lines(out)
    indices = env["CVD"].split(",")
    assert len(indices) == 2, env
    assert all(0 <= int(i) < slurm_cluster.gpus_per_node for i in indices), env
    assert env["NODE"] in slurm_cluster.gpu_nodes


def test_cpu_job_sees_no_gpu(slurm_cluster, tmp_path: Path) -> None:
    job_id, out = _submit(
        tmp_path,
        "-p",
        slurm_cluster.cpu_partition,
        "--gres=none",
        script='echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"; echo "NODE=$SLURMD_NODENAME"',
    )
    assert _wait_final(job_id) == "COMPLETED"
    env = _env_lines(out)
    assert env["CVD"] == "unset"
    assert env["NODE"] in slurm_cluster.nodes


def test_sacct_reports_completed(slurm_cluster, tmp_path: Path) -> None:
    job_id, _ = _submit(tmp_path, "-p", slurm_cluster.cpu_partition, script="true")
    assert _wait_final(job_id) == "COMPLETED"
    deadline = time.monotonic() + 30  # accounting lags the controller by up to a few seconds
    rows: list[str] = []
    while time.monotonic() < deadline:
        proc = _run(["sacct", "-X", "-n", "--parsable2", "-j", job_id, "--format=JobID,State,ExitCode"])
        rows = proc.stdout.split()
        if rows and rows[0].split("|")[1].startswith("COMPLETED"):
            break
        time.sleep(0.2)
    assert rows, f"sacct never listed job {job_id}"
    assert rows[0].split("|") == [job_id, "COMPLETED", "0:0"]


def test_start_again_is_a_noop_and_status_reports_running(slurm_cluster) -> None:
    state = ["--state-dir", str(slurm_cluster.state_dir)]

    def daemons() -> dict[str, int]:
        proc = _run([sys.executable, str(LOCAL_SLURM), *state, "status", "--json"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return {name: info["pid"] for name, info in json.loads(proc.stdout)["daemons"].items()}

    before = daemons()
    proc = _run([sys.executable, str(LOCAL_SLURM), *state, "start"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already running" in proc.stdout
    assert daemons() == before  # nothing was started again (the same processes), whatever the clock says

    proc = _run([sys.executable, str(LOCAL_SLURM), *state, "status", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = json.loads(proc.stdout)
    assert status["running"] is True
    assert set(status["nodes"]) == set(slurm_cluster.nodes)
    assert all(info["alive"] for info in status["daemons"].values()), status["daemons"]


@pytest.mark.parametrize(
    ("state", "up"),
    [("idle", True), ("mix", True), ("alloc", True), ("comp", True), ("plnd", True), ("mix-", True), ("idle@", True),
     ("down", False), ("drain", False), ("drng", False), ("idle*", False), ("down*", False), ("fail", False)],
)  # fmt: skip
def test_a_node_planned_for_a_pending_job_is_up(state: str, up: bool) -> None:
    """``sinfo`` shows ``plnd`` for a node the backfill scheduler planned a pending job on; ``status`` said a busy
    cluster was not running then. A node not responding (``*``), down or drained is not up."""
    assert local_slurm_tool().node_ok(state) is up
