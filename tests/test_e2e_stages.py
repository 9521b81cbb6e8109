"""``stages: auto`` on the real local Slurm cluster: the mixed example (local generator ``sql``, hosted judge
``sql_quality``, expression ``sql_chars``) runs its GPU stage in GPU allocations and its CPU stage in CPU-only
allocations after them, and collects the dataset a plain local ``DataDesigner.create`` of the recipe makes (the
laptop's: the stand-ins' replies are a function of the request)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, ClaimRecord, SubmissionRecord, WinnerRecord, read_json, read_plan
from fake_vllm.testing import set_gate
from tests.e2e import cli_json as _cli
from tests.e2e import generator, local_dataset, one_draw_recipe, processes, requests_waiting, until, vllm_stand_in

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

GENERATOR = generator(env={"FAKE_VLLM_LATENCY": "0.01", "FAKE_VLLM_STARTUP_DELAY": "1"})
SHARDS = 3
RECORDS = 12


def _run(files: Any) -> tuple[Path, Any]:
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir = Path(submitted["run_dir"])
    final = _cli("wait", str(run_dir), "--json", env=files.env)
    logs = "\n".join(p.read_text()[-2000:] for p in run_dir.glob("shards/*/**/client.out"))
    assert final["state"] == "succeeded", f"{final}\n{logs}"
    dataset = _cli("collect", str(run_dir), "--json", "--local", env=files.env)["dataset"]
    return run_dir, pq.read_table(dataset)


def _sacct(job: str, fields: str) -> list[list[str]]:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-j", job, f"--format={fields}"], capture_output=True, text=True, check=True
    ).stdout
    return [line.split("|") for line in out.splitlines() if line]


def test_two_stage_run_frees_the_gpus_and_collects_the_laptops_dataset(
    make_run_files: Any, hosted_endpoint: Any, tmp_path: Path
) -> None:
    recipe = one_draw_recipe(tmp_path)
    common = {"num_records": RECORDS, "shards": SHARDS, "buffer_size": 4, "recipe": recipe}
    staged_files = make_run_files(
        "staged", extra_run=GENERATOR, vllm_executable=vllm_stand_in(tmp_path, "staged"), **common
    )
    log = hosted_endpoint.request_log
    before = len(log.read_text().splitlines()) if log.exists() else 0
    staged_dir, staged = _run(staged_files)
    hosted = [json.loads(line) for line in log.read_text().splitlines()[before:]]

    plan = read_plan(staged_dir / "run.json")
    assert [s.kind for s in plan.stages] == ["gpu", "cpu"]
    assert plan.stages[0].columns == ("difficulty", "sql") and plan.stages[1].columns == ("sql_quality", "sql_chars")
    assert plan.stage_reason is not None and plan.stage_reason.startswith("two stages")
    assert plan.cpu_stage is not None and plan.cpu_stage.gres == "none" and plan.cpu_stage.partition == "cpu"

    subs = [read_json(p, SubmissionRecord) for p in sorted((staged_dir / "submissions").glob("*.json"))]
    gpu_subs = [s for s in subs if s.stage == 0]
    cpu_subs = [s for s in subs if s.stage == 1]
    assert gpu_subs and cpu_subs
    for sub in cpu_subs:
        script = Path(sub.script).read_text()
        assert "#SBATCH --gres=none" in script and "#SBATCH --partition=cpu" in script
        assert f"#SBATCH --dependency=afterany:{gpu_subs[0].array_job_id}" in script
        assert "--stage 1" in script
        steps = _sacct(sub.array_job_id, "JobName,Partition")
        names = [s[0] for s in steps]
        assert any(n.startswith("client") for n in names), names
        assert not any(n.startswith(("server-", "proxy-")) for n in names), names
        assert {s[1] for s in steps if s[1]} == {"cpu"}
    for sub in gpu_subs:
        assert "#SBATCH --gres=gpu:1" in Path(sub.script).read_text()
        names = [s[0] for s in _sacct(sub.array_job_id, "JobName")]
        assert any(n.startswith("server-generator") for n in names), names

    gpu_published: list[float] = []
    cpu_jobs = {s.array_job_id for s in cpu_subs}
    for index in range(SHARDS):
        shard = staged_dir / "shards" / f"shard-{index:05d}"
        first = read_json(shard / "stage-0" / "winner.json", WinnerRecord)
        final = read_json(shard / "winner.json", WinnerRecord)
        assert first.rows == final.rows == plan.shards[index].num_records
        gpu_published.append(datetime.fromisoformat(first.published_at).timestamp())
        won = read_json(shard / "attempts" / final.attempt / "attempt.json", AttemptRecord)
        assert won.allocation is not None and not list(Path(won.allocation).glob("server-*"))
        assert (shard / f"stage-seed-{first.attempt}.parquet").is_file()  # the shard's, one for every attempt
        gpu_attempt = read_json(shard / "stage-0" / "attempts" / first.attempt / "attempt.json", AttemptRecord)
        assert gpu_attempt.state == "succeeded"
        claims = {p.stem for p in (shard / "claims").glob("*.json")}
        assert claims and claims <= cpu_jobs  # the final result came from a CPU-stage allocation
    # The judge was asked only by the CPU stage: after every shard's GPU stage had its result.
    judge = [r for r in hosted if r["model"] == "demo/judge-70b" and r["path"].endswith("/chat/completions")]
    assert len(judge) >= RECORDS and all(r["authorized"] for r in judge)
    assert min(r["time"] for r in judge) >= max(gpu_published)
    # The generator was asked only by the GPU stage (its servers' logs), once per record.
    generated = [
        json.loads(line)
        for f in tmp_path.glob("staged-requests-*.jsonl")
        for line in f.read_text().splitlines()
        if '"/v1/chat/completions"' in line
    ]
    assert len(generated) >= RECORDS and max(r["time"] for r in generated) <= min(r["time"] for r in judge)

    # `stages: single` keeps the recipe whole (the dry run's plan: tests/test_e2e_mixed.py runs one on the cluster).
    single_files = make_run_files(
        "single", extra_run=GENERATOR + "stages: single\n", vllm_executable=vllm_stand_in(tmp_path, "single"), **common
    )
    dry = _cli("submit", str(single_files.run_file), "--profile", str(single_files.profile), "--dry-run", "--json",
               env=single_files.env)  # fmt: skip
    assert dry["plan"]["stages"] == [] and dry["plan"]["stage_reason"].startswith("single stage"), dry["plan"]

    # The laptop's dataset: a plain local DataDesigner.create of the whole recipe, against one stand-in serving both
    # models (its replies are a function of the request). The same columns in the same order, the same rows.
    oracle = local_dataset(recipe, RECORDS, tmp_path / "oracle")
    assert staged.column_names == list(plan.column_order or ()) == oracle.column_names
    assert staged.num_rows == oracle.num_rows == RECORDS
    a, b = staged.to_pylist(), oracle.to_pylist()
    with (recipe.parent / "questions.csv").open(newline="") as fh:
        seed = list(csv.DictReader(fh))
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert {c: x[c] for c in seed[0]} == seed[i % len(seed)] == {c: y[c] for c in seed[0]}, f"row {i}"
        assert x["sql_chars"] == len(x["sql"]), f"row {i}"
        assert list(x.items()) == list(y.items()), f"row {i}"  # every column, in order
    # The stand-ins' replies differ per prompt: the comparison is not vacuous.
    assert len({r["sql"] for r in a}) > 1 and len({json.dumps(r["sql_quality"]) for r in a}) > 1

    # The report of the two-stage run shows both stages: each shard's GPU-stage and CPU-stage attempt on the
    # timeline, the local generator's requests (GPU stage) and the hosted judge's (CPU stage), and GPUs held only by
    # the GPU stage's jobs.
    report = _cli("report", str(staged_dir), "--json", env=staged_files.env)
    stages = sorted((span["shard"], span["stage"]) for span in report["timeline"] if span["winner"])
    assert stages == sorted((i, stage) for i in range(SHARDS) for stage in ("gpu", "cpu"))
    usage = {m["alias"]: m for m in report["models"]}
    assert usage["generator"]["local"] and usage["generator"]["requests"] >= RECORDS
    assert usage["judge"]["requests"] >= RECORDS
    cpu_arrays = {s.array_job_id for s in subs if s.stage == 1}
    held = {job["job"].partition("_")[0]: job["gpus"] for job in report["gpu"]["jobs"]}
    assert held and all((gpus == 0) == (job in cpu_arrays) for job, gpus in held.items()), held
    assert report["rows_generated"] == RECORDS  # the final stage's rows, not each stage's


def _cpu_clients(run_dir: Path) -> dict[int, int]:
    """The running CPU-stage client processes of the run, by shard (never an ``srun`` that started one)."""
    found = {}
    for pid, argv in processes():
        staged = "--stage" in argv and argv[argv.index("--stage") + 1 :][:1] == ["1"]
        if argv[:1] != ["srun"] and "client" in argv and str(run_dir) in argv and staged:
            found[int(argv[argv.index("--shard") + 1])] = pid
    return found


def test_pulling_two_stages_and_a_killed_cpu_stage_client_pending_for_its_automatic_retry(tmp_path: Path) -> None:
    """One pulling GPU allocation (its server started once) runs the three shards' generator, then one CPU-stage
    allocation runs their judges at once; the hosted judge answers nothing until the test opens its gate. The test
    SIGKILLs shard 0's client (``client_retries: 0``: no rerun inside the allocation): while the allocation still
    runs the other two, shard 0 waits for the automatic retry level (``retries: 1``), so no ``status --json``
    shows it or the run ``failed``, ``retry`` submits nothing, and ``wait`` exits 0 with every row. The same run
    proves the two-stage arrays: GPU, CPU after it, the retry levels after them, and the dataset's columns in the
    plan's order."""
    from conftest import hosted_stand_in, write_run_files

    gate = tmp_path / "judge-gate"
    set_gate(gate, "0")  # the judge answers nothing yet; the writer is not asked (the generator is local)
    with hosted_stand_in(tmp_path, "--fake-gate", str(gate), "--fake-gate-model", "demo/judge-70b") as endpoint:
        files = write_run_files(
            tmp_path / "killed", endpoint, num_records=RECORDS, shards=SHARDS, buffer_size=4,
            recipe=one_draw_recipe(tmp_path), vllm_executable=vllm_stand_in(tmp_path, "killed"),
            extra_run=GENERATOR + "allocations: 1\nretries: 1\nclient_retries: 0\n",
        )  # fmt: skip
        files.run_file.write_text(files.run_file.read_text().replace("  cpus: 1\n", "  cpus: 3\n"))
        run_dir = Path(
            _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
        )
        try:
            until(lambda: requests_waiting(endpoint.root_url) == SHARDS, 300, "the three CPU-stage clients at the gate")
            clients = _cpu_clients(run_dir)  # each in its generation (its client run counted), waiting for its judge
            os.kill(clients[0], signal.SIGKILL)
            until(
                lambda: any(a.state == "failed" for a in _cpu_attempts(run_dir, 0)), 120, "shard 0's CPU attempt's end"
            )
            frames = [_cli("status", str(run_dir), "--json", env=files.env)]
            shard = frames[0]["shards"][0]
            assert (frames[0]["state"], shard["state"], shard["stage"]) == ("running", "pending", "cpu"), shard
            assert "automatic retry array" in (shard["message"] or ""), shard
            retried = _cli("retry", str(run_dir), "--json", env=files.env)
            assert retried["shards"] == [] and retried["job_ids"] == [], retried
            set_gate(gate, "")
            while frames[-1]["state"] not in {"succeeded", "failed", "cancelled", "incomplete"}:
                time.sleep(1)
                frames.append(_cli("status", str(run_dir), "--json", env=files.env))
        finally:
            set_gate(gate, "")
        final = _cli("wait", str(run_dir), "--json", env=files.env)
    assert final["state"] == "succeeded" and final["records_done"] == RECORDS, final
    assert all(f["state"] != "failed" and all(s["state"] != "failed" for s in f["shards"]) for f in frames), [
        (f["state"], [s["state"] for s in f["shards"]]) for f in frames
    ]
    cpu_zero = _cpu_attempts(run_dir, 0)
    assert [a.state for a in cpu_zero] == ["failed", "succeeded"], cpu_zero
    table = pq.read_table(_cli("collect", str(run_dir), "--json", "--local", env=files.env)["dataset"])
    plan = read_plan(run_dir / "run.json")
    assert plan.cpu_stage_workers == 3
    assert table.num_rows == RECORDS and table.column_names == list(plan.column_order or ())
    made = tmp_path / "recipe" / "recipe.yaml"  # one_draw_recipe's
    oracle = local_dataset(made, RECORDS, tmp_path / "oracle")  # the laptop's: every row, the killed shard's too
    assert table.column_names == oracle.column_names and table.to_pylist() == oracle.to_pylist()
    subs = sorted(
        (read_json(p, SubmissionRecord) for p in (run_dir / "submissions").glob("*.json")),
        key=lambda s: int(s.array_job_id),
    )
    # GPU, CPU after it; GPU retry after the GPU array's failure, CPU retry after both
    assert [(s.stage, s.kind, s.tasks) for s in subs] == [
        (0, "initial", 1),
        (1, "initial", 1),
        (0, "auto-retry", 1),
        (1, "auto-retry", 1),
    ]
    assert subs[2].after == subs[0].array_job_id
    assert subs[3].after_any == (subs[2].array_job_id, subs[1].array_job_id)
    for index in range(SHARDS):
        shard = run_dir / "shards" / f"shard-{index:05d}"
        assert (shard / "stage-0" / "claims" / f"{subs[0].array_job_id}.json").is_file()
        assert read_json(shard / "winner.json", WinnerRecord).rows == 4
    # The one initial CPU-stage allocation ran its three shards' attempts side by side: each began before any ended.
    cpu_attempts = []
    for index in range(SHARDS):
        shard = run_dir / "shards" / f"shard-{index:05d}"
        claim = read_json(shard / "claims" / f"{subs[1].array_job_id}.json", ClaimRecord)
        cpu_attempts.append(read_json(shard / "attempts" / f"attempt-{claim.job_id}" / "attempt.json", AttemptRecord))
    assert len({a.job_id for a in cpu_attempts}) == 1
    assert [a.state for a in cpu_attempts] == ["failed", "succeeded", "succeeded"], cpu_attempts
    began = [datetime.fromisoformat(a.started_at) for a in cpu_attempts]
    ended = [datetime.fromisoformat(a.ended_at or "") for a in cpu_attempts]
    assert max(began) < min(ended), (began, ended)
    # One GPU allocation ran the three shards with its server started once.
    gpu_steps = [s[0] for s in _sacct(subs[0].array_job_id, "JobName")]
    assert sum(n.startswith("server-generator") for n in gpu_steps) == 1, gpu_steps


def _cpu_attempts(run_dir: Path, shard: int) -> list[AttemptRecord]:
    """The CPU-stage attempts of ``shard`` (the final stage's, in the shard's own directory), oldest first."""
    paths = (run_dir / "shards" / f"shard-{shard:05d}" / "attempts").glob("*/attempt.json")
    return sorted((read_json(p, AttemptRecord) for p in paths), key=lambda a: a.started_at or "")
