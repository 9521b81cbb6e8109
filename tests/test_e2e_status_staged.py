"""``status`` of a two-stage run on the real local Slurm cluster, sampled while the run goes on: ``status --watch
--json`` (a JSON object per refresh) and ``status --json`` called again and again. The run's progress over both
stages and its final-stage records never go back, not even while a shard whose GPU stage is done waits for its CPU
stage, and the run never returns to ``pending`` once it ran. One GPU allocation pulls the two shards one after
another on one client worker, and the CPU-stage array starts only once that allocation has ended
(``--dependency=afterany``), so the first shard waits for its CPU stage while the second generates. The replica
runs one request at once (``--max-num-seqs 1``): a client's share of the replicas is then one request, and the
worker's spare takes over only in the first shard's last ``SPARE_SETUP_S`` at its rate (8 records at 2 s a
request: about its last two), leaving the second shard some 10 s of generating after the first is done. (At the
default capacity, 256, a whole shard fits in its share and the spare starts the second at once.)"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import DDSLURM, MIXED_RECIPE, generator, run_cli, vllm_stand_in
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

SHARDS = 2
RECORDS = 16


def _check_series(samples: list[dict[str, Any]], what: str) -> None:
    """What every series of status samples must hold: no state back to ``pending`` after the run left it, records
    and progress never lower than in the sample before, and each sample's numbers consistent with its shards."""
    assert samples, f"{what}: no samples"
    states = [s["state"] for s in samples]
    left = next((i for i, state in enumerate(states) if state != "pending"), len(states))
    assert "pending" not in states[left:], f"{what}: back to pending after running: {states}"
    done = [s["records_done"] for s in samples]
    assert done == sorted(done), f"{what}: records went back: {done}"
    for sample in samples:  # the run's figures, recomputed from its shards
        rows = [shard["stage_rows"] for shard in sample["shards"]]
        assert all(r is not None and len(r) == 2 for r in rows), rows
        gpu, cpu = sum(r[0] for r in rows), sum(r[1] for r in rows)
        assert [(s["stage"], s["rows_done"], s["records"]) for s in sample["stages"]] == [
            ("gpu", gpu, RECORDS),
            ("cpu", cpu, RECORDS),
        ], sample["stages"]
        assert sample["progress"] == round((gpu + cpu) / (2 * RECORDS), 4), sample
        assert sample["records_done"] == cpu
        for shard in sample["shards"]:  # the attempt shown, by its number among the shard's attempts of its stage
            assert (shard["attempt"] is None) == (shard["attempt_number"] is None), shard
            assert 1 <= (shard["attempt_number"] or 1) <= max(shard["attempts"], 1), shard
    progress = [s["progress"] for s in samples]
    assert progress == sorted(progress), f"{what}: progress went back: {progress}"
    per_shard = [[sum(shard["stage_rows"]) for shard in s["shards"]] for s in samples]
    for index in range(SHARDS):
        mine = [rows[index] for rows in per_shard]
        assert mine == sorted(mine), f"{what}: shard {index}'s rows went back: {mine}"
    # The moment the old status got wrong was seen: a shard whose GPU stage had its result waiting for its CPU
    # stage while another shard had not finished its own GPU stage.
    assert any(
        any(sh["stage"] == "cpu" and sh["state"] == "pending" for sh in s["shards"])
        and any(sh["stage"] == "gpu" for sh in s["shards"])
        for s in samples
    ), f"{what}: no sample of a shard waiting for its CPU stage: {[(s['state'], s['progress']) for s in samples]}"
    assert samples[-1]["state"] == "succeeded" and samples[-1]["progress"] == 1.0


def test_status_of_a_two_stage_run_never_goes_back(make_run_files: Any, tmp_path: Path) -> None:
    files = make_run_files(
        "watched",
        num_records=RECORDS,
        shards=SHARDS,
        buffer_size=2,
        recipe=MIXED_RECIPE,
        extra_run=generator(
            env={"FAKE_VLLM_LATENCY": "2.0", "FAKE_VLLM_STARTUP_DELAY": "1"}, extra_args=["--max-num-seqs", "1"]
        )
        + "allocations: 1\nclient_workers: 1\n",
        vllm_executable=vllm_stand_in(tmp_path, "watched"),
    )
    run_dir = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
    watch = subprocess.Popen(
        [DDSLURM, "status", run_dir, "--watch", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=files.env,
    )
    try:
        sampled: list[dict[str, Any]] = []  # status --json, as fast as it answers, until the run has ended
        while not sampled or sampled[-1]["state"] not in {"succeeded", "failed", "cancelled", "incomplete"}:
            sampled.append(_cli("status", run_dir, "--json", env=files.env))
        frames_out, watch_err = watch.communicate(timeout=120)  # --watch stops after the first terminal status
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0, watch_err
    frames = [json.loads(line) for line in frames_out.splitlines()]
    assert sampled[-1]["state"] == "succeeded", sampled[-1]
    _check_series(sampled, "status --json")
    _check_series(frames, "status --watch --json")

    # The table: the stage column, each stage's rows, attempts by number (the first of each shard's final stage).
    done = run_cli("status", run_dir, env=files.env)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()[2:]
    columns = ["SHARD", "STAGE", "STATE", "GPU ROWS", "CPU ROWS", "ROWS/S", "ATTEMPT", "JOB", "SLURM", "REASON"]
    assert re.split(r"\s{2,}", header.strip()) == columns
    for index, (row, shard) in enumerate(zip(rows, sampled[-1]["shards"], strict=True)):
        want = f"{shard['records']}/{shard['records']}"
        number = str(shard["attempt_number"]) if shard["attempts"] == 1 else f"{shard['attempt_number']} of "
        assert re.match(rf"\s*{index}  cpu\s+succeeded\s+{want}\s+{want}\s+{number}", row), row
