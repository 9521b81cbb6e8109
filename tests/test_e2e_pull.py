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

from ddslurm.config import AttemptRecord, ClaimRecord, WinnerRecord, read_json
from tests.e2e import MIXED_RECIPE, generator
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

RECORDS, SHARDS = 21, 5
GENERATOR = (
    generator(replicas=2, tensor_parallel=1, env={"FAKE_VLLM_LATENCY": "0.3", "FAKE_VLLM_STARTUP_DELAY": "3"})
    + "stages: single\n"  # the pulling allocations run every column (tests/test_e2e_stages.py: two stages)
)


def _submit(make_run_files: Any, name: str, extra: str) -> tuple[Any, Path, dict[str, Any]]:
    files = make_run_files(
        name, num_records=RECORDS, shards=SHARDS, buffer_size=3, recipe=MIXED_RECIPE, extra_run=GENERATOR + extra
    )
    # Two client workers need two client CPUs (submission.cpus is shared among them).
    files.run_file.write_text(files.run_file.read_text().replace("  cpus: 1\n", "  cpus: 2\n", 1))
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    return files, Path(submitted["run_dir"]), submitted


def _unsharded_questions() -> Counter[str]:
    """The seed rows a plain local run of the recipe uses: ORDERED, record k reads row k mod 12."""
    with (MIXED_RECIPE.parent / "questions.csv").open() as f:
        rows = [r["question"] for r in csv.DictReader(f)]
    return Counter(rows[k % len(rows)] for k in range(RECORDS))


def _collect(run_dir: Path, env: dict[str, str]) -> Any:
    dataset = _cli("collect", str(run_dir), "--local", "--json", env=env)["dataset"]
    return pq.read_table(dataset)


def test_pulling_allocations_keep_servers_warm_and_run_every_shard_once(
    make_run_files: Any, scan_for_secret: Any
) -> None:
    files, run_dir, submitted = _submit(make_run_files, "pull", "allocations: 2\nclient_workers: 2\n")
    assert "--pool 0-4" in (run_dir / "generate.sbatch").read_text()
    final = _cli("wait", str(run_dir), "--json", env=files.env)
    assert final["state"] == "succeeded", json.dumps(final)[-3000:]
    assert final["records_done"] == RECORDS
    array = submitted["job_id"]
    allocations = sorted((run_dir / "allocations").iterdir())
    assert 1 <= len(allocations) <= 2
    # The servers started once per allocation, not once per shard: two replicas each, for five shards.
    servers = sorted(p.name for a in allocations for p in a.glob("server-generator-*.log"))
    assert len(servers) == 2 * len(allocations)
    for shard in range(SHARDS):
        claims = list((run_dir / "shards" / f"shard-{shard:05d}" / "claims").glob("*.json"))
        assert [c.name for c in claims] == [f"{array}.json"]
        claim = read_json(claims[0], ClaimRecord)
        winner = read_json(run_dir / "shards" / f"shard-{shard:05d}" / "winner.json", WinnerRecord)
        record = read_json(
            run_dir / "shards" / f"shard-{shard:05d}" / "attempts" / winner.attempt / "attempt.json", AttemptRecord
        )
        assert record.job_id == claim.job_id and record.allocation is not None
        assert Path(record.allocation).parent == run_dir / "allocations"
    table = _collect(run_dir, files.env)
    assert table.num_rows == RECORDS
    assert Counter(table.column("question").to_pylist()) == _unsharded_questions()
    assert scan_for_secret(run_dir, files.env["DEMO_HOSTED_API_KEY"]) == []


def test_an_allocation_killed_mid_run_loses_no_shard_and_duplicates_none(make_run_files: Any) -> None:
    files, run_dir, submitted = _submit(make_run_files, "kill", "allocations: 2\nclient_workers: 2\nretries: 1\n")
    array = submitted["job_id"]
    victim = f"{array}_0"
    deadline = time.monotonic() + 120
    claimed: list[int] = []
    while time.monotonic() < deadline and not claimed:  # task 0 has claimed a shard and begun its attempt
        for path in run_dir.glob("shards/shard-*/attempts/attempt-*/attempt.json"):
            record = read_json(path, AttemptRecord)
            if record.slurm_log and record.slurm_log.endswith(f"slurm-{victim}.out") and record.state == "running":
                claimed.append(record.shard)
        time.sleep(0.2)
    assert claimed, "allocation 0 never began an attempt"
    subprocess.run(["scancel", "--signal=KILL", "--batch", victim], check=True)  # the controller dies at once
    final = _cli("wait", str(run_dir), "--json", env=files.env, timeout=600)
    assert final["state"] == "succeeded", json.dumps(final)[-3000:]
    assert final["records_done"] == RECORDS
    kinds = sorted(json.loads(p.read_text())["kind"] for p in (run_dir / "submissions").glob("*.json"))
    assert kinds == ["auto-retry", "initial"]
    for shard in claimed:  # the killed allocation's shards were finished by the automatic retry's allocations
        winner = read_json(run_dir / "shards" / f"shard-{shard:05d}" / "winner.json", WinnerRecord)
        record = read_json(
            run_dir / "shards" / f"shard-{shard:05d}" / "attempts" / winner.attempt / "attempt.json", AttemptRecord
        )
        assert not (record.slurm_log or "").endswith(f"slurm-{victim}.out")
    table = _collect(run_dir, files.env)
    assert table.num_rows == RECORDS
    assert Counter(table.column("question").to_pylist()) == _unsharded_questions()
