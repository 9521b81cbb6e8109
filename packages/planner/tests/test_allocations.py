"""How the planner spreads shards over allocations and client workers (``allocations``, ``client_workers``)."""

from __future__ import annotations

import pytest

from ddslurm.config import ClusterProfile, Deployment, RunFile, ServerSpec, Submission
from ddslurm.planner import PlanError, plan_allocations, plan_serving


def _run(shards: int, *, replicas: int = 0, cpus: int = 4, **fields: object) -> RunFile:
    deployments = (
        (Deployment(model_alias="gen", model="m", replicas=replicas, server=ServerSpec(cpus=1)),) if replicas else ()
    )
    return RunFile(
        name="r", recipe="x.yaml", num_records=100, shards=shards, deployments=deployments,
        submission=Submission(cpus=cpus), **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _plan(run: RunFile) -> tuple[int | None, int, int]:
    profile = ClusterProfile(workspace="/ws", python_env="/venv", gpus_per_node=8, partition="gpu")
    serving = plan_serving(run, profile, "gpu") if run.deployments else None
    got = plan_allocations(run, serving)
    return got.count, got.workers, got.client_cpus


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        pytest.param(_run(8), (None, 1, 4), id="hosted-only: one task per shard"),
        pytest.param(_run(8, replicas=1), (None, 1, 4), id="one replica: one worker, one task per shard"),
        pytest.param(_run(8, replicas=2), (4, 2, 2), id="two replicas: two workers, one allocation per two shards"),
        pytest.param(_run(7, replicas=4), (2, 4, 1), id="uneven: ceil(7 / 4) allocations"),
        pytest.param(_run(8, replicas=4, cpus=2), (4, 2, 1), id="workers capped by the client CPUs"),
        pytest.param(_run(8, replicas=2, max_concurrent=3), (3, 2, 2), id="at most max_concurrent allocations"),
        pytest.param(_run(2, replicas=4), (1, 2, 2), id="workers capped by the shards"),
        pytest.param(_run(8, replicas=2, allocations=1), (1, 2, 2), id="explicit: one allocation pulls all"),
        pytest.param(_run(8, allocations=2), (2, 1, 4), id="hosted-only, explicit allocations: pulling"),
        pytest.param(_run(8, replicas=2, client_workers=1), (None, 1, 4), id="one worker: one task per shard"),
        pytest.param(_run(8, replicas=1, allocations=8), (None, 1, 4), id="as many allocations as shards"),
    ],
)
def test_allocations_and_workers(run: RunFile, expected: tuple[int | None, int, int]) -> None:
    assert _plan(run) == expected


def test_more_allocations_than_shards_is_refused_naming_the_field() -> None:
    with pytest.raises(PlanError, match=r"^allocations: 9 allocations for 8 shards"):
        _plan(_run(8, allocations=9))


def test_more_workers_than_client_cpus_is_refused_naming_the_field() -> None:
    with pytest.raises(PlanError, match=r"^client_workers: 4 client steps need at least 4 CPUs, but submission.cpus"):
        _plan(_run(8, replicas=2, cpus=2, client_workers=4))


def test_client_workers_share_the_replicas_capacity() -> None:
    from pathlib import Path

    from ddslurm.config import ProviderSnapshot, RunLayout
    from ddslurm.planner import PlanInputs, compile_plan

    def sized(run: RunFile) -> int | None:
        profile = ClusterProfile(workspace="/ws", python_env="/venv", gpus_per_node=8, partition="gpu")
        plan = compile_plan(
            PlanInputs(
                run=run,
                profile=profile,
                snapshot=ProviderSnapshot(),
                layout=RunLayout(Path("/ws/r")),
                recipe_sha256="-",
                snapshot_sha256="-",
            )
        )
        assert plan.serving is not None
        return plan.serving.deployments[0].max_parallel_requests

    capacity = ("--max-num-seqs", "8")
    two = Deployment(model_alias="gen", model="m", replicas=2, server=ServerSpec(cpus=1, extra_args=capacity))
    base = {"name": "r", "recipe": "x.yaml", "num_records": 100, "shards": 8, "deployments": (two,)}
    assert sized(RunFile(**base, submission=Submission(cpus=4))) == 8  # type: ignore[arg-type]  # 2 workers x 8
    assert sized(RunFile(**base, client_workers=1, submission=Submission(cpus=4))) == 16  # type: ignore[arg-type]
    assert sized(RunFile(**base, client_workers=3, submission=Submission(cpus=4))) == 6  # type: ignore[arg-type]
