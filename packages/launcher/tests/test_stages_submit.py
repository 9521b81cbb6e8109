"""``stages: auto`` on the submit side: the plan's stages, the GPU arrays each followed by a CPU-stage array,
their batch scripts, ``retry`` of shards with and without a GPU-stage result, and ``status`` per stage."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ddslurm.config import (
    AttemptRecord,
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
)
from ddslurm.launcher import Slurm, run_status, submit
from ddslurm.launcher import _submit as submit_module
from ddslurm.launcher._render import render_generation
from ddslurm.launcher._steer import log_files, pick_attempt, retry
from ddslurm.launcher._submit import prepare
from ddslurm.launcher.testing import UNIT_RECIPE, FakeSlurm, accept_recipe, write_unit_run

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
DEPLOY = "deployments:\n  - {model_alias: gen, model: m-2}\n"
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
    assert plan.cpu_stage.time_minutes == plan.generation.time_minutes
    assert plan.column_order == ("topic", "draft", "q")


def test_stages_single_keeps_one_stage_and_says_why(tmp_path: Path) -> None:
    plan = _prepare(tmp_path, DEPLOY + "stages: single\n")
    assert plan.stages == () and plan.cpu_stage is None
    assert plan.stage_reason == "single stage: the run file says stages: single"
    assert plan.column_order == ("topic", "draft", "q")  # collection orders single-stage runs alike


def test_a_hosted_only_run_has_no_stages_and_no_column_order(tmp_path: Path) -> None:
    plan = _prepare(tmp_path, "", UNIT_RECIPE)
    assert (plan.stages, plan.stage_reason, plan.cpu_stage, plan.column_order) == ((), None, None, None)


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
    original = submit_module.prepare
    monkeypatch.setattr(submit_module, "prepare", lambda *a, **k: original(*a, **{**k, "check_recipe": accept_recipe}))


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
    done = submit(run, profile, slurm=Slurm(fake, user="alice"), env=env)
    layout = RunLayout(done.layout.root)
    gpu, cpu = _records(layout)
    assert (gpu.stage, gpu.tasks, gpu.after_any) == (0, None, ())
    assert (cpu.stage, cpu.tasks, cpu.after_any, cpu.shards) == (1, 3, (gpu.array_job_id,), (0, 1, 2))
    assert f"--dependency=afterany:{gpu.array_job_id}" in Path(cpu.script).read_text()

    # shard 0 is done; shard 1 finished its GPU stage, but the CPU allocations ended without it; shard 2's GPU
    # task failed.
    _winner(layout, 0, None)
    _winner(layout, 1, 0)
    fake.sacct_out = (
        f"{gpu.array_job_id}_0|COMPLETED|0:0|None\n{gpu.array_job_id}_1|COMPLETED|0:0|None\n"
        f"{gpu.array_job_id}_2|FAILED|1:0|None\n"
        + "".join(f"{cpu.array_job_id}_{t}|COMPLETED|0:0|None\n" for t in range(3))
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
