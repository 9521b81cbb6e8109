"""Faults on the local Slurm cluster, where the behaviour is Slurm's own: cancelling a run whose automatic
retries wait on it, a SIGKILL of the controller, a requeue and a node failure, a time limit too short for
Slurm's early warning, and a winner whose batch file changed after publication.

Every wait is bounded; every run is the test's own. The node-failure test drains, downs and always resumes
one node, and leaves it alone if jobs of others still run there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import WinnerRecord, read_json
from tests.e2e import array_jobs, attempts, cli_json, local_slurm_tool, processes, run_cli, slurm, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

SERVED = ["--served-model-name", "demo/writer-8b", "demo/judge-70b"]


def _running(run_dir: Path, shards: range) -> bool:
    return all(any(r.state == "running" for r in attempts(run_dir, s)) for s in shards)


def _status(run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    status: dict[str, Any] = cli_json("status", str(run_dir), "--json", env=env)
    return status


@contextlib.contextmanager
def _slow_provider(files: Any, key: str, latency: str = "0.25", port: int | None = None) -> Iterator[dict[str, str]]:
    """A provider slow enough that a shard is still generating when the test acts (``latency`` 600: it hangs);
    yields the run's env. The same ``port`` again: the provider, healed."""
    from fake_vllm.testing import start_server

    args = [*SERVED, "--fake-latency", latency, "--fake-capacity", "4"]
    with start_server("demo", args=args, api_key=key, port=port) as srv:
        (files.dd_home / "model_providers.yaml").write_text(
            f"providers:\n- {{name: demo-hosted, endpoint: '{srv.base_url}', api_key: DEMO_HOSTED_API_KEY}}\n"
        )
        yield {**files.env, "DEMO_HOSTED_API_KEY": key}


def _submit(files: Any, env: dict[str, str]) -> Path:
    return Path(cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)["run_dir"])


def _cancel_quietly(run_dir: Path, env: dict[str, str]) -> None:
    run_cli("cancel", str(run_dir), env=env)


# --- 1. cancel stops a run with automatic retries, and only an explicit retry continues it ---


def test_cancel_stops_every_array_of_a_run_with_automatic_retries(make_run_files: Any) -> None:
    files = make_run_files("cancel-retries", num_records=24, shards=2, buffer_size=3, extra_run="retries: 2\n")
    with _slow_provider(files, "sk-cancel-" + "3" * 16) as env:
        run_dir = _submit(files, env)
        try:
            arrays = array_jobs(run_dir)
            assert len(arrays) == 3  # the run and its two automatic retry arrays (afternotok chain)
            until(lambda: _running(run_dir, range(2)), 120, "both shards to be generating")
            out = cli_json("cancel", str(run_dir), "--json", env=env)
            assert out["run_cancelled"] and sorted(out["cancelled"], key=int) == arrays
            until(lambda: _status(run_dir, env)["state"] == "cancelled", 60, "the run to be cancelled")
            time.sleep(6)  # a retry array released by the cancellation would have started by now (~1 s a hop)
            assert slurm("squeue", "-h", "-j", ",".join(arrays), "-o", "%i").strip() == ""
            rows = slurm("sacct", "-X", "-n", "--parsable2", "-j", ",".join(arrays), "--format=JobID,State")
            states = {line.split("|")[0]: line.split("|")[1] for line in rows.splitlines() if "|" in line}
            assert states and all(s.startswith("CANCELLED") for s in states.values()), states
            for shard in range(2):
                records = attempts(run_dir, shard)
                assert records[0].state == "failed" and records[0].reason == "cancelled", records[0]
                # a task that started anyway (a race with scancel) generated nothing
                assert all((r.state, r.reason) == ("cancelled", "run_cancelled") for r in records[1:]), records
            assert _status(run_dir, env)["cancelled_at"]

            refused = run_cli("retry", str(run_dir), env=env)
            assert refused.returncode == 1 and "--resume-cancelled" in refused.stderr, refused.stderr
            assert cli_json("retry", str(run_dir), "--resume-cancelled", "--json", env=env)["shards"] == [0, 1]
            final = cli_json("wait", str(run_dir), "--json", "--timeout", "240", env=env)
            assert final["state"] == "succeeded" and final["records_done"] == 24
        finally:
            _cancel_quietly(run_dir, env)


# --- 2. an attempt that could not record its end: the reason comes from Slurm's record ---


def _controller_pid(run_dir: Path) -> int | None:
    """The batch step: ``ddslurm-runtime generate --run-dir RUN_DIR`` (the script execs it)."""
    for pid, words in processes():
        if "generate" in words and str(run_dir) in words and any(w.endswith("ddslurm-runtime") for w in words):
            return pid
    return None


def test_sigkill_of_the_controller_is_reported_from_slurms_record(make_run_files: Any) -> None:
    files = make_run_files("sigkill", num_records=12, shards=1, buffer_size=3)
    with _slow_provider(files, "sk-sigkill-" + "4" * 16, latency="600") as env:
        run_dir = _submit(files, env)
        try:
            until(lambda: _running(run_dir, range(1)), 120, "the attempt to be generating")
            pid = until(lambda: _controller_pid(run_dir), 30, "the controller process")
            os.kill(pid, signal.SIGKILL)
            shard = until(
                lambda: (s := _status(run_dir, env)["shards"][0])["state"] == "failed" and s,
                60,
                "the shard to fail",
            )
        finally:
            _cancel_quietly(run_dir, env)
    assert shard["reason"] == "killed (signal 9)", shard
    assert "Slurm: FAILED, exit code 0:9 (SIGKILL)" in shard["message"] and "still says running" in shard["message"]
    assert attempts(run_dir, 0)[-1].state == "running"  # the attempt itself could not say


# --- 3. a requeued task is pending again: shown as requeued, not as the SIGTERM that stopped it ---


def test_requeued_task_is_shown_requeued_and_reruns(make_run_files: Any) -> None:
    from fake_vllm.testing import free_port

    files = make_run_files("requeue", num_records=12, shards=1, buffer_size=3)
    port, key = free_port(), "sk-requeue-" + "5" * 16
    run_dir: Path | None = None
    try:
        with _slow_provider(files, key, latency="600", port=port) as env:  # hangs: the task is still running
            run_dir = _submit(files, env)
            task = f"{array_jobs(run_dir)[0]}_0"
            until(lambda: _running(run_dir, range(1)), 120, "the attempt to be generating")
            slurm("scontrol", "requeue", task)
            shard = until(
                lambda: (s := _status(run_dir, env)["shards"][0])["state"] == "pending" and s["reason"] and s,
                60,
                "the requeued task to be pending",
                lambda: (_status(run_dir, env), slurm("squeue", "-h", "-r", "-o", "%i|%T|%r|%N")),
            )
            assert shard["reason"] == "requeued", shard
            assert f"requeued task {task}" in shard["message"]
        with _slow_provider(files, key, latency="0", port=port) as env:  # the provider healed
            slurm("scontrol", "update", f"jobid={task}", "StartTime=now")  # not Slurm's 2-minute requeue delay
            final = cli_json("wait", str(run_dir), "--json", "--timeout", "240", env=env)
    finally:
        if run_dir is not None:
            _cancel_quietly(run_dir, files.env)
    assert final["state"] == "succeeded" and final["records_done"] == 12, final
    records = attempts(run_dir, 0)
    assert [r.state for r in records] == ["failed", "succeeded"] and records[1].attempt.endswith("-r1"), records
    assert records[0].reason == "requeued" and "incarnation 1" in (records[0].message or ""), records[0]


def _node_jobs() -> dict[str, set[str]]:
    jobs: dict[str, set[str]] = {}
    for line in slurm("squeue", "-h", "-t", "R", "-o", "%i|%N").splitlines():
        job, _, nodes = line.partition("|")
        for node in slurm("scontrol", "show", "hostnames", nodes).split() if nodes else []:
            jobs.setdefault(node, set()).add(job)
    return jobs


def _node_state(node: str) -> str:
    return slurm("sinfo", "-h", "-n", node, "-N", "-o", "%t").split()[0] if node else ""


def test_node_failure_is_shown_requeued_node_failure(make_run_files: Any) -> None:
    busy = _node_jobs()
    node = min(("n3", "n2", "n1"), key=lambda n: len(busy.get(n, ())))
    files = make_run_files(
        "node-fail", num_records=12, shards=1, buffer_size=3, extra_run=f"  extra_sbatch: ['--nodelist={node}']\n"
    )
    with _slow_provider(files, "sk-nodefail-" + "6" * 16, latency="600") as env:
        run_dir = _submit(files, env)
        task = f"{array_jobs(run_dir)[0]}_0"
        try:
            until(lambda: _running(run_dir, range(1)), 120, "the attempt to be generating")
            slurm("scontrol", "update", f"nodename={node}", "state=drain", "reason=ddslurm-fault-test")
            try:
                alone = until(
                    lambda: _node_jobs().get(node, set()) <= {task}, 90, f"{node} alone", interval=1.0, fail=False
                )
                if not alone:
                    pytest.skip(f"jobs of other tests still run on {node}; not failing the node under them")
                slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=ddslurm-fault-test")
                # Slurm's accounting records NODE_FAIL a moment after the task is pending again ("requeued").
                shard = until(
                    lambda: (
                        (s := _status(run_dir, env)["shards"][0])["state"] == "pending"
                        and s["reason"] == "requeued (node failure)"
                        and s
                    ),
                    60,
                    "the task to be pending again after the node failure",
                    lambda: (_status(run_dir, env), slurm("squeue", "-h", "-r", "-o", "%i|%T|%r|%N")),
                )
            finally:
                slurm("scontrol", "update", f"nodename={node}", "state=resume")
                until(lambda: local_slurm_tool().node_ok(_node_state(node)), 60, f"{node} to be back")
        finally:
            _cancel_quietly(run_dir, env)
    assert shard["reason"] == "requeued (node failure)", shard
    assert shard["slurm_state"] == "PENDING"


# --- 4. a time limit that Slurm's early warning would eat entirely is refused at submit ---


def test_time_limit_too_short_for_the_warning_is_refused(make_run_files: Any) -> None:
    files = make_run_files("short-limit", num_records=2, shards=1)
    files.run_file.write_text(files.run_file.read_text().replace("time_limit: '00:10:00'", "time_limit: 1"))
    done = run_cli("submit", str(files.run_file), "--profile", str(files.profile), env=files.env)
    assert done.returncode == 2, done.stdout
    assert "submission.time_limit: 1 is 1 minute(s); at least 2" in done.stderr, done.stderr
    assert not list(files.workspace.glob("runs/*"))


# --- 5. a winner whose batch file changed in place (same size) is reported, and the run is not succeeded ---


def test_winner_changed_after_publication_is_reported_corrupt(make_run_files: Any) -> None:
    files = make_run_files("corrupt", num_records=2, shards=1, buffer_size=2)
    run_dir = _submit(files, files.env)
    final = cli_json("wait", str(run_dir), "--json", "--timeout", "240", env=files.env)
    assert final["state"] == "succeeded"
    winner = read_json(run_dir / "shards" / "shard-00000" / "winner.json", WinnerRecord)
    batch = Path(winner.dataset_dir) / winner.files[0].path
    data = bytearray(batch.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed in place: the size stays
    batch.write_bytes(bytes(data))
    assert batch.stat().st_size == winner.files[0].size
    shard = _status(run_dir, files.env)["shards"][0]
    assert (shard["state"], shard["reason"]) == ("corrupt", "winner_corrupt"), shard
    assert str(batch) in shard["message"] and "sha256" in shard["message"]
    waited = run_cli("wait", str(run_dir), "--json", env=files.env)
    assert waited.returncode == 1 and json.loads(waited.stdout)["state"] == "failed"
