"""Pulling allocations on the real local Slurm cluster: model servers started once per allocation and kept warm
across the shards it claims, two client workers side by side, every shard exactly once, the seed rows an
unsharded run uses; and an allocation killed mid-run whose shards the automatic retry finishes."""

from __future__ import annotations

import csv
import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, ClaimRecord, RunLayout, WinnerRecord, read_json, read_plan
from fake_vllm.testing import set_gate
from tests.e2e import MIXED_RECIPE, attempts, generator, run_cli, slurm, until
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

RECORDS, SHARDS = 21, 5
STAND_IN = {"FAKE_VLLM_LATENCY": "0.3", "FAKE_VLLM_STARTUP_DELAY": "3"}


def _submit(
    make_run_files: Any, name: str, extra: str, stand_in: dict[str, str] | None = None
) -> tuple[Any, Path, dict[str, Any]]:
    deployment = (
        generator(replicas=2, tensor_parallel=1, env={**STAND_IN, **(stand_in or {})}) + "stages: single\n"
    )  # the pulling allocations run every column (tests/test_e2e_stages.py: two stages)
    files = make_run_files(
        name, num_records=RECORDS, shards=SHARDS, buffer_size=3, recipe=MIXED_RECIPE, extra_run=deployment + extra
    )
    # Two client workers need two client CPUs (submission.cpus is shared among them).
    files.run_file.write_text(files.run_file.read_text().replace("  cpus: 1\n", "  cpus: 2\n", 1))
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    return files, Path(submitted["run_dir"]), submitted


def _unsharded_questions(records: int = RECORDS) -> Counter[str]:
    """The seed rows a plain local run of the recipe uses: ORDERED, record k reads row k mod 12."""
    with (MIXED_RECIPE.parent / "questions.csv").open() as f:
        rows = [r["question"] for r in csv.DictReader(f)]
    return Counter(rows[k % len(rows)] for k in range(records))


def _frame(run_dir: Path, env: dict[str, str], most_running: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``status --json`` frame, kept in ``frames``: it never shows more shards ``running`` than the plan's client
    workers of all its allocations (a spare's shard is ``waiting``: it generates nothing yet)."""
    frame = _cli("status", str(run_dir), "--json", env=env)
    frames.append(frame)
    running = [s["shard"] for s in frame["shards"] if s["state"] == "running"]
    assert len(running) <= most_running, (running, frame["shards"])
    for shard in frame["shards"]:
        if shard["state"] == "waiting":  # nothing generated yet, nothing counted
            assert shard["rate"] is None and not shard["rows"], shard
    return frame


def _collect(run_dir: Path, env: dict[str, str]) -> Any:
    dataset = _cli("collect", str(run_dir), "--local", "--json", env=env)["dataset"]
    return pq.read_table(dataset)


def test_pulling_allocations_keep_servers_warm_run_every_shard_once_and_lose_none_of_a_killed_one(
    make_run_files: Any, scan_for_secret: Any, tmp_path: Path
) -> None:
    """One run proves both: the servers of a pulling allocation start once for every shard it claims, each shard is
    claimed once per array and generated once; and allocation 0, killed (SIGKILL to its batch step: the controller
    dies at once) as soon as it has begun an attempt, loses no shard and duplicates none: the automatic retry's
    allocations finish its shards, and the dataset is exactly the unsharded run's rows.

    The servers' gate holds every generator request until then: however late Slurm starts allocation 0, allocation
    1 (two workers) cannot finish a shard and claim them all first. Five shards over two allocations of two workers:
    while the gate holds, some allocation has begun a spare client's attempt (issue 40), whose shard ``status``
    shows ``waiting``; no ``status --json`` frame sampled from then to the end shows more shards ``running`` than
    the four workers (the allocation killed counts until Slurm has seen it end: the gate opens only then)."""
    gate = tmp_path / "gate"
    set_gate(gate, "hold")
    files, run_dir, submitted = _submit(
        make_run_files, "pull", "allocations: 2\nclient_workers: 2\nretries: 1\n", {"FAKE_VLLM_GATE": str(gate)}
    )
    try:
        assert "--pool 0-4" in (run_dir / "generate.sbatch").read_text()
        array = submitted["job_id"]
        victim = f"{array}_0"
        deadline = time.monotonic() + 600  # a bound on the wait, not a measured time: nothing finishes meanwhile
        claimed: list[int] = []
        while not claimed:  # task 0 has claimed a shard and begun its attempt
            assert time.monotonic() < deadline, "allocation 0 never began an attempt"
            for path in run_dir.glob("shards/shard-*/attempts/attempt-*/attempt.json"):
                record = read_json(path, AttemptRecord)
                if record.slurm_log and record.slurm_log.endswith(f"slurm-{victim}.out") and record.state == "running":
                    claimed.append(record.shard)
            time.sleep(0.2)
        plan = read_plan(RunLayout(run_dir).plan)
        most_running = plan.client_workers * (plan.allocations or 0)
        assert most_running == 4, (plan.client_workers, plan.allocations)
        frames: list[dict[str, Any]] = []
        # the gate holds: no shard drains or ends, so a spare begun waits until the gate opens
        spare = until(
            lambda: next((a for a in attempts(run_dir) if a.spare and a.state == "running"), None),
            300,
            "a spare client's attempt",
            lambda: [(a.shard, a.attempt, a.state, a.spare) for a in attempts(run_dir)],
        )
        held = _frame(run_dir, files.env, most_running, frames)
        assert spare.generating_at is None and held["shards"][spare.shard]["state"] == "waiting", held["shards"]
        assert not list(run_dir.glob("shards/shard-*/winner.json"))  # the gate held: no shard has finished yet
        subprocess.run(["scancel", "--signal=KILL", "--batch", victim], check=True)
        # its attempts' records still say running: status counts them running until Slurm has seen the task end
        live = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}  # what status counts as a task that runs
        until(lambda: not live & set(slurm("squeue", "-h", "-j", victim, "-o", "%T").split()), 120, f"{victim} ended")
    finally:
        set_gate(gate, "")
    while frames[-1]["state"] not in ("succeeded", "failed", "cancelled", "incomplete"):
        time.sleep(1)  # a sampling rate, not a condition: every frame is checked
        _frame(run_dir, files.env, most_running, frames)
    final = _cli("wait", str(run_dir), "--json", env=files.env, timeout=600)
    assert final["state"] == "succeeded", json.dumps(final)[-3000:]
    assert final["records_done"] == RECORDS
    kinds = sorted(json.loads(p.read_text())["kind"] for p in (run_dir / "submissions").glob("*.json"))
    assert kinds == ["auto-retry", "initial"]
    # The servers started once per allocation, not once per shard: no allocation started a replica twice, and the
    # two that ran shards of the initial array started both replicas.
    allocations = sorted((run_dir / "allocations").iterdir())
    for allocation in allocations:
        servers = sorted(p.name for p in allocation.glob("server-generator-*.log"))
        assert len(servers) in (0, 2), (allocation.name, servers)
    for shard in range(SHARDS):
        shard_dir = run_dir / "shards" / f"shard-{shard:05d}"
        claims = {c.name: read_json(c, ClaimRecord) for c in (shard_dir / "claims").glob("*.json")}
        assert f"{array}.json" in claims  # one claim file per array: each array's allocations claim a shard once
        winner = read_json(shard_dir / "winner.json", WinnerRecord)
        record = read_json(shard_dir / "attempts" / winner.attempt / "attempt.json", AttemptRecord)
        assert record.allocation is not None and Path(record.allocation).parent == run_dir / "allocations"
        assert record.job_id in {c.job_id for c in claims.values()}  # the winner ran in an allocation that claimed it
        if claims[f"{array}.json"].task != 0:  # a survivor's shard: claimed and generated once, by the initial array
            assert list(claims) == [f"{array}.json"], (shard, list(claims))
            assert len(list((shard_dir / "attempts").iterdir())) == 1
        else:  # the killed allocation's shards were finished by the automatic retry's allocations
            assert not (record.slurm_log or "").endswith(f"slurm-{victim}.out")
    table = _collect(run_dir, files.env)
    assert table.num_rows == RECORDS
    assert Counter(table.column("question").to_pylist()) == _unsharded_questions()
    assert scan_for_secret(run_dir, files.env["DEMO_HOSTED_API_KEY"]) == []


def test_a_replica_that_keeps_crashing_is_restarted_in_place_and_every_record_is_collected(
    make_run_files: Any,
) -> None:
    """Issue 34's crashing replica: ``retries: 3``, one local replica that exits after every 5 requests, 16 records
    over 2 shards, ``allocations: auto`` (the cost model chooses one pulling allocation for both). The controller
    starts the replica again in place (``server.restarts``), the shards resume, and the run succeeds with every
    record; no ``status --json`` frame sampled meanwhile says ``failed``, and ``wait`` exits 0."""
    records = 16
    deployment = generator(replicas=1, tensor_parallel=1, env={"FAKE_VLLM_CRASH_AFTER": "5"})  # stages: auto
    files = make_run_files(
        "crashing", num_records=records, shards=2, buffer_size=None, recipe=MIXED_RECIPE, extra_run=deployment
    )
    files.run_file.write_text(files.run_file.read_text() + "retries: 3\n")
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir = Path(submitted["run_dir"])
    seen: list[str] = []
    while not seen or seen[-1] in ("submitted", "queued", "pending", "running"):
        frame = _cli("status", str(run_dir), "--json", env=files.env)
        seen.append(frame["state"])
        assert frame["state"] != "failed" and all(s["state"] != "failed" for s in frame["shards"]), frame
        time.sleep(1)  # a sampling rate, not a condition: every frame is checked
    done = run_cli("wait", str(run_dir), "--json", env=files.env)
    assert done.returncode == 0, done.stdout[-3000:]
    final = json.loads(done.stdout)
    assert final["state"] == "succeeded" and final["records_done"] == records, final
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("slurm-*.out"))
    assert '"server.restarting"' in logs  # the replica died and was started again inside its allocation
    assert "--pool 0-1" in (run_dir / "generate.sbatch").read_text()  # one pulling allocation for both shards
    table = _collect(run_dir, files.env)
    assert table.num_rows == records
    assert Counter(table.column("question").to_pylist()) == _unsharded_questions(records)
