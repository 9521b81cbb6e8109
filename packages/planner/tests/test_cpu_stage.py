"""A two-stage run's CPU stage: how many shards a CPU-stage allocation runs at once (``cpu_stage_workers``, from
its CPUs) and how many allocations its arrays ask for (``cpu_stage_tasks``), through ``compile_plan`` and
``plan_arrays``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    Plan,
    ProviderSnapshot,
    RecipeColumn,
    RunFile,
    RunLayout,
    SnapshotModel,
    SnapshotProvider,
    StagePlan,
    Submission,
)
from ddslurm.config.testing import make_plan
from ddslurm.planner import PlanInputs, compile_plan, plan_arrays

LAYOUT = RunLayout.in_workspace(Path("/ws"), "run-1")
SNAPSHOT = ProviderSnapshot(
    providers=(SnapshotProvider(name="hosted", endpoint="https://h/v1", api_key_env="H_API_KEY"),),
    models=(SnapshotModel(alias="judge", model="j", provider="hosted"),),
)


def _llm_column(name: str, *reads: str) -> RecipeColumn:
    """An LLM column of the model alias ``name`` that reads ``reads``, as Data Designer's column config says."""
    return RecipeColumn(
        name=name,
        column_type="llm-text",
        aliases=(name,),
        refs=reads,
        required=reads,
        side_effects=(),
        drop=False,
        skips=False,
        propagate_skip=True,
        sampler_type=None,
    )


COLUMNS = (_llm_column("gen"), _llm_column("judge", "gen"))
"""A local generator and a hosted judge over it: two stages."""

STAGES = (StagePlan(kind="gpu", columns=("gen",)), StagePlan(kind="cpu", columns=("judge",)))


def _plan_of(cpus: int, shards: int, **run: object) -> Plan:
    fields: dict[str, object] = {
        "name": "demo",
        "recipe": "recipe.yaml",
        "num_records": 100,
        "shards": shards,
        "deployments": (Deployment(model_alias="gen", model="m"),),
        "submission": Submission(cpus=cpus),
        **run,
    }
    profile = ClusterProfile(workspace="/ws", python_env="/venv", partition="gpu", cpu_partition="cpu", gpus_per_node=4)
    recipe = {"columns": [{"name": c.name} for c in COLUMNS]}
    run_file = RunFile(**fields)  # type: ignore[arg-type]
    inputs = PlanInputs(run=run_file, profile=profile, snapshot=SNAPSHOT, layout=LAYOUT, recipe=recipe,
                        columns=COLUMNS, recipe_sha256="1" * 64, snapshot_sha256="2" * 64)  # fmt: skip
    return compile_plan(inputs)


@pytest.mark.parametrize(
    ("cpus", "shards", "workers"),
    [(4, 8, 4), (8, 3, 3), (1, 5, 1), (6, 6, 6)],
)
def test_a_cpu_stage_allocation_runs_as_many_shards_as_its_cpus_allow_at_most_the_shards(
    cpus: int, shards: int, workers: int
) -> None:
    plan = _plan_of(cpus, shards)
    assert plan.stages == STAGES and plan.cpu_stage is not None
    assert plan.cpu_stage.cpus_per_task == cpus
    assert plan.cpu_stage_workers == workers


def test_a_run_of_one_stage_has_one_cpu_stage_worker() -> None:
    plan = _plan_of(4, 8, stages="single")
    assert (plan.stages, plan.cpu_stage, plan.cpu_stage_workers) == ((), None, 1)


@pytest.mark.parametrize(
    ("shards", "gpu_tasks", "workers", "cpu_tasks"),
    [
        (6, 6, 3, 2),  # one task per shard on the GPU stage; 3 shards at once per CPU allocation: 2 allocations
        (7, 7, 3, 3),  # 7 shards, 3 at once each: 3 allocations (the last runs one)
        (6, 2, 1, 2),  # one shard at a time: as many as the GPU array's allocations, as before
        (6, 2, 6, 1),  # one allocation runs all six at once
    ],
)
def test_cpu_stage_arrays_ask_for_the_allocations_their_workers_need_at_most_the_gpu_tasks(
    tmp_path: Path, shards: int, gpu_tasks: int, workers: int, cpu_tasks: int
) -> None:
    pulling = {} if gpu_tasks == shards else {"allocations": gpu_tasks, "client_workers": 1}
    plan = make_plan("run-1", (1,) * shards, stages=STAGES, cpu_stage_workers=workers, **pulling)
    gpu, cpu = plan_arrays(plan, RunLayout(tmp_path), list(range(shards)), 1000, kind="initial", stamp="s")
    assert (gpu.stage, len(gpu.shards)) == (0, shards)
    assert (gpu.tasks or len(gpu.shards)) == gpu_tasks
    assert (cpu.stage, cpu.shards, cpu.tasks) == (1, gpu.shards, cpu_tasks)
    assert cpu.array == (f"0-{cpu_tasks - 1}" if cpu_tasks > 1 else "0")
    assert cpu_tasks * workers >= min(shards, gpu_tasks * workers)  # never fewer shards at once than before


def test_a_retrys_cpu_only_array_asks_for_the_allocations_its_workers_need(tmp_path: Path) -> None:
    plan = make_plan("run-1", (1,) * 5, stages=STAGES, cpu_stage_workers=2)
    [cpu] = plan_arrays(plan, RunLayout(tmp_path), [0, 1, 2, 3, 4], 1000, kind="retry", stamp="s", gpu_done=range(5))
    assert (cpu.stage, cpu.shards, cpu.tasks) == (1, (0, 1, 2, 3, 4), 3)  # 5 shards, 2 at once each
