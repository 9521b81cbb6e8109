"""The node-side runtime where Slurm's own behaviour decides: a pulling allocation that ``scontrol requeue`` restarts
(same job id, SLURM_RESTART_COUNT 1) serves anew from its own directory, and its first clients wait for its own
endpoints instead of sending requests to servers that are still loading.

Every wait is bounded; the run is the test's own and is cancelled if the test fails part-way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import MIXED_RECIPE, attempts, cli_json, generator, run_cli, slurm, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

RECORDS, SHARDS = 12, 2


def test_a_requeued_pulling_allocation_serves_from_its_own_directory_and_its_clients_wait(
    make_run_files: Any, tmp_path: Path
) -> None:
    requests = tmp_path / "requests.jsonl"  # every request the model servers of both incarnations answered
    stand_in = {"FAKE_VLLM_LATENCY": "0.5", "FAKE_VLLM_STARTUP_DELAY": "20", "FAKE_VLLM_REQUEST_LOG": str(requests)}
    deployment = generator(replicas=1, tensor_parallel=1, startup_timeout=180, env=stand_in)
    files = make_run_files("requeue-pull", num_records=RECORDS, shards=SHARDS, buffer_size=3, recipe=MIXED_RECIPE,
                           extra_run=deployment + "stages: single\nallocations: 1\nclient_workers: 1\n")  # fmt: skip
    submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir, task = Path(submitted["run_dir"]), f"{submitted['job_id']}_0"
    allocations = run_dir / "allocations"
    try:
        first = until(
            lambda: next(iter(allocations.glob("allocation-*/endpoints.json")), None),
            240,
            "the first incarnation to serve",
        ).parent
        job = first.name.removeprefix("allocation-")
        slurm("scontrol", "requeue", task)
        until(
            lambda: "PENDING" in slurm("squeue", "-h", "-j", task, "-o", "%T"),
            90,
            "the requeued allocation to be pending",
            lambda: slurm("squeue", "-h", "-j", task, "-o", "%i|%T|%r"),
        )
        slurm("scontrol", "update", f"jobid={task}", "StartTime=now")  # not Slurm's requeue delay
        # Until the new incarnation begins its attempts, status shows the cancelled ones of the first: wait ends.
        until(
            lambda: any(r.attempt == f"attempt-{job}-r1" for r in attempts(run_dir)),
            240,
            "the requeued allocation to begin its attempts",
            lambda: slurm("squeue", "-h", "-j", task, "-o", "%i|%T|%r"),
        )
        final = cli_json("wait", str(run_dir), "--json", "--timeout", "420", env=files.env, timeout=480)
    except BaseException:
        run_cli("cancel", str(run_dir), env=files.env, timeout=60)  # leave no job behind
        raise
    assert final["state"] == "succeeded" and final["records_done"] == RECORDS, json.dumps(final)[-3000:]
    requeued = [r for r in attempts(run_dir) if r.attempt == f"attempt-{job}-r1"]
    # Each requeued shard generated in one client run: none failed on the first incarnation's endpoints (before the
    # fix a first client run read them, hit the new servers' ports while they loaded, and spent the rerun).
    assert requeued and [r.client_runs for r in requeued] == [1] * len(requeued), requeued
    # The second incarnation served from allocation-<job>-r1, and its attempts say so.
    second = allocations / f"allocation-{job}-r1"
    assert (second / "endpoints.json").is_file() and list(second.glob("server-generator-0.log"))
    assert all(r.allocation == str(second) for r in requeued), requeued
    assert {r.state for r in requeued} == {"succeeded"}
    # No client sent a request to a server that was still loading (vLLM answers 503 then; rows were dropped).
    entries = [json.loads(line) for line in requests.read_text().splitlines()]
    loading = [e for e in entries if e["path"].startswith("/v1/chat") and e["status"] == 503]
    assert loading == [], f"{len(loading)} requests got 503 from a loading server"
    # ddslurm logs --step server of a requeued attempt shows its own incarnation's server log.
    shown = requeued[0].shard
    logs = run_cli("logs", str(run_dir), "--shard", str(shown), "--step", "server", "--json", env=files.env, timeout=60)
    assert logs.returncode == 0, logs.stderr
    sources = {json.loads(line)["source"] for line in logs.stdout.splitlines() if line.strip()}
    assert sources and all(Path(s).parent == second for s in sources), sources
