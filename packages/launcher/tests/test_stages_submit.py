"""``stages: auto`` on the submit side: the plan's stages, the GPU arrays each followed by a CPU-stage array,
their batch scripts, ``retry`` of shards with and without a GPU-stage result, and ``status`` per stage: each
stage's rows, progress that never goes back, the run's state from both stages, the stage column."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import (
    AttemptRecord,
    ClaimRecord,
    Plan,
    RunLayout,
    StagePlan,
    SubmissionRecord,
    WinnerRecord,
    atomic_write,
    encode,
    make_private_dir,
    publish_once,
    read_json,
    read_plan,
)
from ddslurm.launcher import RunStatus, Slurm, run_status, submit
from ddslurm.launcher.commands._console import status_text
from ddslurm.launcher.runs._steer import log_files, pick_attempt, retry
from ddslurm.launcher.submission._prepare import prepare
from ddslurm.launcher.submission._render import render_generation
from ddslurm.launcher.testing import (
    UNIT_RECIPE,
    FakeSlurm,
    InProcessHost,
    accept_every_recipe,
    accept_recipe,
    write_attempt,
    write_unit_run,
)

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

KEY = "sk-stages-test-value-123"
RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: draft, column_type: llm-text, model_alias: gen, prompt: "Say {{ topic }}"}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Improve {{ draft }}"}
  model_configs:
  - {alias: gen, model: m-2, provider: local}
  - {alias: writer, model: m-1, provider: hosted, inference_parameters: {temperature: 0.3, max_parallel_requests: 8}}
"""
# allocations: one task per shard (these tests follow each shard's own GPU and CPU tasks)
DEPLOY = "allocations: 3\ndeployments:\n  - {model_alias: gen, model: m-2}\n"
STAGES = (StagePlan(kind="gpu", columns=("topic", "draft")), StagePlan(kind="cpu", columns=("q",)))


def _files(tmp_path: Path, run_extra: str = DEPLOY, recipe: str = RECIPE) -> tuple[Path, Path, dict[str, str]]:
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=recipe, shards=3, run_extra=run_extra)
    # the vLLM stand-in: submit checks that the profile's vllm_executable is there (ddslurm doctor's checks)
    vllm = Path(sys.executable).parent / "fake-vllm"
    profile.write_text(profile.read_text() + f"gpus_per_node: 4\nvllm_executable: {vllm}\n")
    return run, profile, env


def _prepare(tmp_path: Path, run_extra: str = DEPLOY, recipe: str = RECIPE) -> Plan:
    run, profile, env = _files(tmp_path, run_extra, recipe)
    return prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe).plan


def test_a_mixed_recipe_gets_two_stages_the_cpu_stage_resources_and_the_column_order(tmp_path: Path) -> None:
    plan = _prepare(tmp_path)
    assert plan.stages == STAGES
    assert (plan.stage_reason or "").startswith("two stages: GPU stage 2 column(s) ('topic', 'draft')")
    assert plan.generation.gres == "gpu:1" and plan.generation.partition == "gpu"
    assert plan.cpu_stage is not None
    assert (plan.cpu_stage.gres, plan.cpu_stage.partition, plan.cpu_stage.cpus_per_task) == ("none", "cpu", 2)
    assert plan.cpu_stage_workers == 2  # one hosted-only client per CPU, at most the 3 shards
    assert plan.cpu_stage.time_minutes == plan.generation.time_minutes
    assert plan.column_order == ("topic", "draft", "q")


def test_stages_single_keeps_one_stage_and_says_why(tmp_path: Path) -> None:
    plan = _prepare(tmp_path, DEPLOY + "stages: single\n")
    assert plan.stages == () and plan.cpu_stage is None
    assert plan.stage_reason == "single stage: the run file says stages: single"
    assert plan.column_order == ("topic", "draft", "q")  # collection orders single-stage runs alike


def test_a_hosted_only_run_has_no_stages_and_its_recipes_column_order(tmp_path: Path) -> None:
    plan = _prepare(tmp_path, "", UNIT_RECIPE)
    assert (plan.stages, plan.stage_reason, plan.cpu_stage) == ((), None, None)
    assert plan.column_order == ("topic", "q")  # collection orders hosted-only runs by the same rule


def test_the_cpu_stage_script_asks_for_cpu_only_allocations_after_its_arrays(tmp_path: Path) -> None:
    plan = _prepare(tmp_path)
    layout = RunLayout(tmp_path / "run-1")
    cpu = render_generation(plan, layout, [0, 1, 2], tasks=3, stage=1, after_any=("11", "12"))
    assert "#SBATCH --gres=none" in cpu and "#SBATCH --partition=cpu" in cpu and "#SBATCH --cpus-per-task=2" in cpu
    assert "#SBATCH --dependency=afterany:11:12" in cpu and "--kill-on-invalid-dep=yes" in cpu
    assert cpu.rstrip().endswith("--pool 0-2 --stage 1")
    gpu = render_generation(plan, layout, [0, 1, 2], stage=0)
    assert "#SBATCH --gres=gpu:1" in gpu and "#SBATCH --partition=gpu" in gpu
    assert gpu.rstrip().endswith('--shard "$SLURM_ARRAY_TASK_ID" --stage 0')
    assert "--stage" not in render_generation(plan, layout, [0, 1, 2])


@pytest.fixture
def _no_dd_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    accept_every_recipe(monkeypatch)


def _winner(layout: RunLayout, shard: int, stage: int | None) -> None:
    where = layout.shard(shard).stage(0) if stage == 0 else layout.shard(shard)
    make_private_dir(where.dir, exist_ok=True)
    record = WinnerRecord(
        shard=shard, attempt="attempt-1", rows=4, dataset_dir="/x", files=(), plan_sha256="-", published_at="-"
    )
    assert publish_once(where.winner, encode(record))


def _records(layout: RunLayout) -> list[SubmissionRecord]:
    return sorted(
        (read_json(p, SubmissionRecord) for p in layout.submissions.glob("*.json")), key=lambda r: int(r.array_job_id)
    )


@pytest.mark.usefixtures("_no_dd_subprocess")
def test_submit_records_the_stages_retry_and_status_follow_each_shards_stage(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path)
    fake = FakeSlurm()
    done = submit(run, profile, slurm=Slurm(fake, user="alice"), host=HOST, env=env)
    layout = RunLayout(done.layout.root)
    gpu, cpu = _records(layout)
    assert (gpu.stage, gpu.tasks, gpu.after_any) == (0, None, ())
    # 2 CPUs per CPU-stage allocation: 2 shards at once each, so 2 allocations run the 3 shards at once.
    assert read_plan(layout.plan).cpu_stage_workers == 2
    assert (cpu.stage, cpu.tasks, cpu.after_any, cpu.shards) == (1, 2, (gpu.array_job_id,), (0, 1, 2))
    assert f"--dependency=afterany:{gpu.array_job_id}" in Path(cpu.script).read_text()

    # shard 0 is done; shard 1 finished its GPU stage, but the CPU allocations ended without it; shard 2's GPU
    # task failed.
    _winner(layout, 0, None)
    _winner(layout, 1, 0)
    fake.sacct_out = (
        f"{gpu.array_job_id}_0|COMPLETED|0:0|None\n{gpu.array_job_id}_1|COMPLETED|0:0|None\n"
        f"{gpu.array_job_id}_2|FAILED|1:0|None\n"
        + "".join(f"{cpu.array_job_id}_{t}|COMPLETED|0:0|None\n" for t in range(2))
    )
    status = run_status(layout, Slurm(fake, user="alice"))
    by_shard = {s.shard: s for s in status.shards}
    assert (by_shard[0].state, by_shard[0].stage) == ("succeeded", "cpu")
    assert (by_shard[1].state, by_shard[1].stage, by_shard[1].reason) == ("failed", "cpu", "not_claimed")
    assert (by_shard[2].state, by_shard[2].stage) == ("failed", "gpu")
    assert by_shard[2].job_id == f"{gpu.array_job_id}_2"

    retried = retry(layout, Slurm(fake, user="alice"), env)
    assert retried.shards == (1, 2)
    new = _records(layout)[2:]
    assert [(r.stage, r.shards, r.tasks, r.kind) for r in new] == [
        (1, (1,), 1, "retry"),
        (0, (2,), None, "retry"),
        (1, (2,), 1, "retry"),
    ]
    assert new[0].after_any == () and new[2].after_any == (new[1].array_job_id,)
    assert "afterany" not in Path(new[0].script).read_text()


def test_logs_find_a_gpu_stage_attempt(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run-1")
    record = AttemptRecord(shard=0, attempt="attempt-7", job_id="7", node="n1", state="failed", started_at="1")
    attempt = layout.shard(0).stage(0).attempt("attempt-7")
    attempt.dir.mkdir(parents=True)
    atomic_write(attempt.record, encode(record))
    attempt.client_log.write_text("{}\n")
    assert pick_attempt(layout, 0) == record
    assert log_files(layout, 0, "client") == [attempt.client_log]


# --- status of a two-stage run as it goes on ---


def _stage_winner(layout: RunLayout, shard: int, stage: int, rows: int) -> None:
    where = layout.stage_shard(shard, stage)
    make_private_dir(where.dir, exist_ok=True)
    record = WinnerRecord(
        shard=shard, attempt=f"attempt-{stage}{shard}", rows=rows, dataset_dir="/x", files=(), plan_sha256="-",
        published_at="-",
    )  # fmt: skip
    assert publish_once(where.winner, encode(record))


def _cpu_claim(layout: RunLayout, shard: int, array: str, task: int) -> None:
    layout.shard(shard).claims.mkdir(exist_ok=True)
    record = ClaimRecord(shard=shard, array_job_id=array, task=task, job_id=f"60{task}", node="n3", claimed_at="-")
    layout.shard(shard).claim(array).write_bytes(encode(record))


@pytest.mark.usefixtures("_no_dd_subprocess")
def test_status_of_a_two_stage_run_never_goes_back_and_shows_stages_rows_and_attempt_numbers(tmp_path: Path) -> None:
    """A two-stage run followed phase by phase, as ``status --watch`` sees it: each shard's rows of each stage, the
    run's fraction of both stages (recomputed here from what each phase wrote), never less than before, and the
    run ``running`` from the first GPU task on, also while every shard waits for its CPU stage."""
    run, profile, env = _files(tmp_path)
    fake = FakeSlurm()
    done = submit(run, profile, slurm=Slurm(fake, user="alice"), host=HOST, env=env)
    layout = RunLayout(done.layout.root)
    gpu, cpu = (r.array_job_id for r in _records(layout))
    plan = read_json(layout.plan, Plan)
    records = [s.num_records for s in plan.shards]
    assert sum(records) == plan.num_records and len(records) == 3

    gpu_rows, cpu_rows = [0, 0, 0], [0, 0, 0]
    seen: list[tuple[str, float, int]] = []

    def look(squeue: str, sacct: str = "") -> dict[str, Any]:
        fake.squeue_out, fake.sacct_out = squeue, sacct
        status = run_status(layout, Slurm(fake, user="alice"))
        shown = msgspec.to_builtins(status)
        assert [s["stage_rows"] for s in shown["shards"]] == [[g, c] for g, c in zip(gpu_rows, cpu_rows, strict=True)]
        assert [(s["stage"], s["rows_done"], s["records"]) for s in shown["stages"]] == [
            ("gpu", sum(gpu_rows), plan.num_records),
            ("cpu", sum(cpu_rows), plan.num_records),
        ]
        assert shown["progress"] == round((sum(gpu_rows) + sum(cpu_rows)) / (2 * plan.num_records), 4)
        assert shown["records_done"] == sum(cpu_rows)  # the run's records are the final stage's rows
        seen.append((status.state, status.progress, status.records_done))
        return shown

    # Nothing has started yet.
    first = look(f"{gpu}_[0-2]|PENDING|Priority\n{cpu}_[0-2]|PENDING|Dependency\n")
    assert first["state"] == "pending" and [s["stage"] for s in first["shards"]] == ["gpu"] * 3

    # Shard 0's GPU task generates, its first attempt failed: the second of two runs.
    write_attempt(layout, 0, "5000", "failed", task=f"{gpu}_0", started="2026-01-01T00:00:00+00:00", stage=0)
    write_attempt(layout, 0, "5003", "running", task=f"{gpu}_0", progress=2, stage=0)
    gpu_rows[0] = 2
    shown = look(f"{gpu}_0|RUNNING|None\n{gpu}_[1-2]|PENDING|Priority\n{cpu}_[0-2]|PENDING|Dependency\n")
    assert shown["state"] == "running"
    assert (shown["shards"][0]["attempt"], shown["shards"][0]["attempt_number"]) == ("attempt-5003", 2)
    assert "5003" not in plain_status(shown) and "2 of 2" in plain_status(shown)

    # Shard 0's GPU stage has its result; shards 1 and 2 generate. Shard 0 now waits for its CPU stage: its GPU
    # rows stay counted.
    _stage_winner(layout, 0, 0, records[0])
    write_attempt(layout, 1, "5001", "running", task=f"{gpu}_1", progress=1, stage=0)
    write_attempt(layout, 2, "5002", "running", task=f"{gpu}_2", progress=2, stage=0)
    gpu_rows[:] = [records[0], 1, 2]
    shown = look(f"{gpu}_[1-2]|RUNNING|None\n{cpu}_[0-2]|PENDING|Dependency\n", f"{gpu}_0|COMPLETED|0:0|None\n")
    assert shown["state"] == "running"
    assert (shown["shards"][0]["stage"], shown["shards"][0]["state"]) == ("cpu", "pending")

    # Every GPU stage has its result and the CPU allocations wait for a node: every shard is pending, the run
    # still running.
    for shard in (1, 2):
        _stage_winner(layout, shard, 0, records[shard])
    gpu_rows[:] = records
    ended = "".join(f"{gpu}_{t}|COMPLETED|0:0|None\n" for t in range(3))
    shown = look(f"{cpu}_[0-2]|PENDING|Priority\n", ended)
    assert {s["state"] for s in shown["shards"]} == {"pending"} and shown["state"] == "running"
    assert [s["stage"] for s in shown["shards"]] == ["cpu"] * 3 and shown["stages"][0]["shards_done"] == 3

    # A CPU allocation claims shard 0 and generates.
    _cpu_claim(layout, 0, cpu, 0)
    write_attempt(layout, 0, "6000", "running", task=f"{cpu}_0", progress=1)
    cpu_rows[0] = 1
    shown = look(f"{cpu}_0|RUNNING|None\n{cpu}_[1-2]|PENDING|Priority\n", ended)
    assert shown["state"] == "running" and shown["shards"][0]["attempt_number"] == 1

    # Every shard has its final result.
    for shard in range(3):
        _stage_winner(layout, shard, 1, records[shard])
    cpu_rows[:] = records
    ended += "".join(f"{cpu}_{t}|COMPLETED|0:0|None\n" for t in range(3))
    shown = look("", ended)
    assert shown["state"] == "succeeded" and shown["progress"] == 1.0
    assert [s["shards_done"] for s in shown["stages"]] == [3, 3]

    states = [state for state, _, _ in seen]
    assert states == ["pending", "running", "running", "running", "running", "succeeded"]
    progress = [p for _, p, _ in seen]
    assert progress == sorted(progress) and len(set(progress)) == len(progress)  # up at every phase, never back
    assert [done for _, _, done in seen] == sorted(done for _, _, done in seen)


def plain_status(shown: dict[str, Any]) -> str:
    return status_text(msgspec.convert(shown, RunStatus))


@pytest.mark.usefixtures("_no_dd_subprocess")
def test_the_status_table_of_a_two_stage_run_has_a_stage_column_and_each_stages_rows(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path)
    fake = FakeSlurm()
    layout = RunLayout(submit(run, profile, slurm=Slurm(fake, user="alice"), host=HOST, env=env).layout.root)
    gpu, cpu = (r.array_job_id for r in _records(layout))
    records = [s.num_records for s in read_json(layout.plan, Plan).shards]
    _stage_winner(layout, 0, 0, records[0])
    _cpu_claim(layout, 0, cpu, 0)
    write_attempt(layout, 0, "6000", "running", task=f"{cpu}_0", progress=1)
    write_attempt(layout, 1, "5001", "running", task=f"{gpu}_1", progress=2, stage=0)
    fake.squeue_out = f"{gpu}_1|RUNNING|None\n{gpu}_2|PENDING|Priority\n{cpu}_0|RUNNING|None\n"
    text = status_text(run_status(layout, Slurm(fake, user="alice")))
    head, _, header, *rows = text.splitlines()
    total = sum(records)
    want = round(100 * (records[0] + 2 + 1) / (2 * total))
    assert head.endswith(
        f"(1/{total} records, gpu {records[0] + 2}/{total} + cpu 1/{total} rows ({want} %), 1 pending, 2 running)"
    )
    columns = ["SHARD", "STAGE", "STATE", "GPU ROWS", "CPU ROWS", "ROWS/S", "ATTEMPT", "JOB", "SLURM", "REASON"]
    assert re.split(r"\s{2,}", header.strip()) == columns
    assert re.fullmatch(
        rf"\s+0  cpu\s+running\s+{records[0]}/{records[0]}\s+1/{records[0]}\s+\S*\s+1\s+{cpu}_0\s+RUNNING", rows[0]
    ), rows[0]
    assert re.fullmatch(
        rf"\s+1  gpu\s+running\s+2/{records[1]}\s+0/{records[1]}\s+\S*\s+1\s+{gpu}_1\s+RUNNING", rows[1]
    ), rows[1]
    assert re.fullmatch(rf"\s+2  gpu\s+pending\s+0/{records[2]}\s+0/{records[2]}\s+-\s+{gpu}_2\s+PENDING.*", rows[2]), (
        rows[2]
    )
