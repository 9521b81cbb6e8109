"""``status`` of a two-stage run on the real local Slurm cluster, sampled while the run goes on: ``status --watch
--json`` (a JSON object per refresh) and ``status --json`` called once a second. The run's progress over both stages
and its final-stage records never go back, not even while a shard whose GPU stage is done waits for its CPU stage,
and the run never returns to ``pending`` once it ran. One GPU allocation pulls the two shards one after another on
one client worker, and the CPU-stage array starts only once that allocation has ended (``--dependency=afterany``),
so a shard whose GPU stage is done waits for its CPU stage while the other generates. That moment is held, not hoped
for: the replica answers through the stand-in's gate, which lets through one request fewer than the records (a
generator request each), so one shard's GPU stage finishes and the other's cannot until the test opens the gate,
once both ``status --json`` and ``status --watch`` have shown the moment."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import RunLayout
from fake_vllm.testing import set_gate
from tests.e2e import DDSLURM, MIXED_RECIPE, generator, run_cli, vllm_stand_in
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

SHARDS = 2
RECORDS = 16


def _waiting_for_cpu(sample: dict[str, Any]) -> bool:
    """The moment the old status got wrong: a shard whose GPU stage has its result waiting for its CPU stage while
    another shard has not finished its own GPU stage."""
    shards = sample["shards"]
    return any(sh["stage"] == "cpu" and sh["state"] == "pending" for sh in shards) and any(
        sh["stage"] == "gpu" for sh in shards
    )


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
    assert any(map(_waiting_for_cpu, samples)), (
        f"{what}: no sample of a shard waiting for its CPU stage: {[(s['state'], s['progress']) for s in samples]}"
    )
    assert samples[-1]["state"] == "succeeded" and samples[-1]["progress"] == 1.0


def test_status_of_a_two_stage_run_never_goes_back(make_run_files: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # every record is one generator request: one short, one shard cannot finish
    set_gate(gate, str(RECORDS - 1))
    stand_in = {"FAKE_VLLM_LATENCY": "0.2", "FAKE_VLLM_STARTUP_DELAY": "1", "FAKE_VLLM_GATE": str(gate)}
    files = make_run_files(
        "watched",
        num_records=RECORDS,
        shards=SHARDS,
        buffer_size=2,
        recipe=MIXED_RECIPE,
        extra_run=generator(env=stand_in) + "allocations: 1\nclient_workers: 1\n",
        vllm_executable=vllm_stand_in(tmp_path, "watched"),
    )
    run_dir = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
    gpu_winners = [RunLayout(Path(run_dir)).shard(i).stage(0).winner for i in range(SHARDS)]
    watch = subprocess.Popen(
        [DDSLURM, "status", run_dir, "--watch", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=files.env,
    )
    frames: list[dict[str, Any]] = []
    watch_saw_it = threading.Event()

    def read_frames() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            frames.append(json.loads(line))
            if _waiting_for_cpu(frames[-1]):
                watch_saw_it.set()

    def a_gpu_winner() -> bool:
        return any(w.exists() for w in gpu_winners)

    reader = threading.Thread(target=read_frames, daemon=True)
    reader.start()
    sampled: list[dict[str, Any]] = []  # status --json, once a second, until the run has ended
    try:
        deadline = time.monotonic() + 600  # a bound on the wait, not a measured time
        while not a_gpu_winner():
            assert time.monotonic() < deadline, "no GPU stage finished with all but one generator request answered"
            sampled.append(_cli("status", run_dir, "--json", env=files.env))
            time.sleep(1)
        assert sum(w.exists() for w in gpu_winners) == 1
        sampled.append(_cli("status", run_dir, "--json", env=files.env))
        assert _waiting_for_cpu(sampled[-1]), sampled[-1]["shards"]
        assert watch_saw_it.wait(120), "status --watch never showed the first shard waiting for its CPU stage"
        set_gate(gate, "")
        while sampled[-1]["state"] not in {"succeeded", "failed", "cancelled", "incomplete"}:
            time.sleep(1)
            sampled.append(_cli("status", run_dir, "--json", env=files.env))
        watch.wait(timeout=120)  # --watch stops after the first terminal status
        reader.join(timeout=60)
        watch_err = watch.stderr.read() if watch.stderr is not None else ""
    finally:
        set_gate(gate, "")
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0, watch_err
    assert sampled[-1]["state"] == "succeeded", sampled[-1]
    _check_series(sampled, "status --json")
    _check_series(frames, "status --watch --json")

    # The table: the stage column, each stage's rows, attempts by number (the first of each shard's final stage).
    done = run_cli("status", run_dir, env=files.env)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()[2:]
    rows, keys = rows[: len(sampled[-1]["shards"])], rows[len(sampled[-1]["shards"]) :]
    assert [k.split(" (")[0] for k in keys] == ["key DEMO_HOSTED_API_KEY"], keys  # the hosted judge's key, under it
    columns = ["SHARD", "STAGE", "STATE", "GPU ROWS", "CPU ROWS", "ROWS/S", "ATTEMPT", "JOB", "SLURM", "REASON"]
    assert re.split(r"\s{2,}", header.strip()) == columns
    for index, (row, shard) in enumerate(zip(rows, sampled[-1]["shards"], strict=True)):
        want = f"{shard['records']}/{shard['records']}"
        number = str(shard["attempt_number"]) if shard["attempts"] == 1 else f"{shard['attempt_number']} of "
        assert re.match(rf"\s*{index}  cpu\s+succeeded\s+{want}\s+{want}\s+{number}", row), row
