"""The planner's placement of replicas bigger than a node (pipeline and data parallel across whole nodes), of
data and expert parallel on one node, and of SGLang; every refusal with its field and numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    ProviderSnapshot,
    ReplicaPlan,
    RunFile,
    RunLayout,
    ServerSpec,
    Submission,
)
from ddslurm.planner import VLLM_DEFAULT_MAX_NUM_SEQS, PlanError, PlanInputs, compile_plan, server_capacity

LAYOUT = RunLayout.in_workspace(Path("/ws"), "run-1")


def _plan_of(*deployments: Deployment, submission: Submission | None = None, **profile: object):  # type: ignore[no-untyped-def]
    fields: dict[str, object] = {
        "workspace": "/ws",
        "python_env": "/venv",
        "partition": "gpu",
        "cpu_partition": "cpu",
        "gpus_per_node": 4,
    }
    fields.update(profile)
    run = RunFile(
        name="demo",
        recipe="recipe.yaml",
        num_records=100,
        deployments=deployments,
        submission=submission or Submission(),
    )
    return compile_plan(
        PlanInputs(
            run=run,
            profile=ClusterProfile(**fields),  # type: ignore[arg-type]
            snapshot=ProviderSnapshot(),
            layout=LAYOUT,
            recipe_sha256="1" * 64,
            snapshot_sha256="2" * 64,
        )
    )


def test_tp4_pp2_on_4_gpu_nodes_spans_two_whole_nodes() -> None:
    plan = _plan_of(
        Deployment(model_alias="big", model="m", tensor_parallel=4, pipeline_parallel=2),
        submission=Submission(cpus=3),
        memory_per_gpu="8G",
    )
    serving = plan.serving
    assert serving is not None
    assert (serving.nodes, serving.gpus) == (2, 4)
    dep = serving.deployments[0]
    assert dep.replicas == (ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),)
    assert (dep.tensor_parallel, dep.pipeline_parallel, dep.data_parallel, dep.replica_gpus) == (4, 2, 1, 8)
    res = plan.generation
    # Per node: the first node runs the client (3), the leader's step (4) and the proxy (1); Slurm gives each node
    # as much. GPUs and memory per node: 4 GPUs x 8G.
    assert (res.nodes, res.gres, res.gpus, res.cpus_per_task, res.memory) == (2, "gpu:4", None, 3 + 4 + 1, "32768M")
    assert plan.client_workers == 1


def test_tp4_pp3_spans_three_nodes_and_data_parallel_splits_evenly_over_them() -> None:
    plan = _plan_of(Deployment(model_alias="big", model="m", tensor_parallel=4, pipeline_parallel=3))
    assert plan.serving is not None and (plan.serving.nodes, plan.generation.nodes) == (3, 3)
    plan = _plan_of(Deployment(model_alias="dp", model="m", tensor_parallel=2, data_parallel=6))
    assert plan.serving is not None
    assert plan.serving.deployments[0].replicas == (ReplicaPlan(index=0, gpus=4, cpus=4, nodes=3),)


def test_gpus_request_of_a_spanning_replica_is_per_node() -> None:
    plan = _plan_of(
        Deployment(model_alias="big", model="m", tensor_parallel=2, pipeline_parallel=4), gpu_request="gpus"
    )
    assert (plan.generation.nodes, plan.generation.gres, plan.generation.gpus) == (2, "none", 4)


def test_data_parallel_8_over_two_4_gpu_nodes() -> None:
    plan = _plan_of(Deployment(model_alias="moe", model="m", data_parallel=8, expert_parallel=True))
    assert plan.serving is not None
    dep = plan.serving.deployments[0]
    assert (plan.serving.nodes, plan.serving.gpus, plan.generation.nodes) == (2, 4, 2)
    assert dep.replicas == (ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),)
    assert (dep.data_parallel, dep.expert_parallel, dep.replica_gpus) == (8, True, 8)
    assert dep.capacity == 8 * VLLM_DEFAULT_MAX_NUM_SEQS


def test_data_parallel_2_with_expert_parallel_on_one_node() -> None:
    plan = _plan_of(
        Deployment(
            model_alias="moe",
            model="m",
            data_parallel=2,
            expert_parallel=True,
            server=ServerSpec(extra_args=("--max-num-seqs", "64")),
        )
    )
    assert plan.serving is not None
    dep = plan.serving.deployments[0]
    assert (plan.serving.nodes, plan.serving.gpus, plan.generation.gres) == (1, 2, "gpu:2")
    assert dep.replicas == (ReplicaPlan(index=0, gpus=2, cpus=4, nodes=1),)
    assert (dep.engine, dep.listen, dep.expert_parallel) == ("vllm", "unix", True)
    assert (dep.capacity, dep.max_parallel_requests) == (2 * 64, 2 * 64)  # --max-num-seqs is per rank


def test_one_node_replicas_of_several_shapes_share_the_node() -> None:
    plan = _plan_of(
        Deployment(model_alias="gen", model="g", tensor_parallel=1, pipeline_parallel=2),
        Deployment(model_alias="judge", model="j", replicas=2),
    )
    assert plan.serving is not None
    assert (plan.serving.nodes, plan.serving.gpus) == (1, 4)
    assert [r.gpus for d in plan.serving.deployments for r in d.replicas] == [2, 1, 1]


def test_sglang_listens_on_a_planned_loopback_port_and_reads_max_running_requests() -> None:
    plan = _plan_of(
        Deployment(
            model_alias="gen",
            model="m",
            engine="sglang",
            replicas=2,
            data_parallel=2,
            server=ServerSpec(extra_args=("--max-running-requests=32", "--max-num-seqs", "9")),
        ),
        sglang_executable="/opt/sglang/bin/python",
        sglang_image="sglang.sqsh",
    )
    serving = plan.serving
    assert serving is not None
    dep = serving.deployments[0]
    assert (dep.engine, dep.listen, dep.proxy) == ("sglang", "tcp", True)
    assert [r.port for r in dep.replicas] == [None, None]  # planned per job
    assert (dep.capacity, dep.max_parallel_requests) == (2 * 32, 2 * 2 * 32)
    assert (serving.sglang_executable, serving.sglang_image) == ("/opt/sglang/bin/python", "sglang.sqsh")


def test_sglang_with_server_port_keeps_it() -> None:
    plan = _plan_of(Deployment(model_alias="gen", model="m", engine="sglang", server=ServerSpec(port=9000)))
    assert plan.serving is not None
    assert [(r.port, d.listen) for d in plan.serving.deployments for r in d.replicas] == [(9000, "tcp")]


@pytest.mark.parametrize(
    ("engine", "extra_args", "want"),
    [
        pytest.param("sglang", (), VLLM_DEFAULT_MAX_NUM_SEQS, id="sglang-assumed-default"),
        pytest.param("sglang", ("--max-running-requests", "12"), 12, id="sglang-flag"),
        pytest.param("sglang", ("--max-num-seqs", "12"), VLLM_DEFAULT_MAX_NUM_SEQS, id="vllm-flag-is-not-sglangs"),
        pytest.param("vllm", ("--max-running-requests", "12"), VLLM_DEFAULT_MAX_NUM_SEQS, id="sglang-flag-on-vllm"),
    ],
)
def test_capacity_flag_is_the_engines(engine: str, extra_args: tuple[str, ...], want: int) -> None:
    assert server_capacity(extra_args, engine=engine) == want  # type: ignore[arg-type]


def test_bad_max_running_requests_is_refused_at_its_field() -> None:
    with pytest.raises(PlanError) as info:
        _plan_of(
            Deployment(
                model_alias="gen", model="m", engine="sglang", server=ServerSpec(extra_args=("--max-running-requests",))
            )
        )
    assert str(info.value) == (
        "deployments[0].server.extra_args: --max-running-requests needs a whole number of at least 1, got ''"
    )


@pytest.mark.parametrize(
    ("deployments", "want"),
    [
        pytest.param(
            (Deployment(model_alias="big", model="m", tensor_parallel=2, pipeline_parallel=3),),
            "deployments[0]: one replica needs tensor_parallel 2 x pipeline_parallel 3 = 6 GPUs, more than the 4 "
            "GPUs of a node and not a whole number of nodes (6 / 4 = 1.50) (model alias 'big')",
            id="not-whole-nodes",
        ),
        pytest.param(
            (Deployment(model_alias="big", model="m", tensor_parallel=2, pipeline_parallel=2, data_parallel=2),),
            "deployments[0].data_parallel: 2 with pipeline_parallel 2 in a replica that spans 2 nodes "
            "(tensor_parallel 2 x pipeline_parallel 2 x data_parallel 2 = 8 GPUs, 4 a node)",
            id="dp-with-pp-across-nodes",
        ),
        pytest.param(
            (Deployment(model_alias="big", model="m", tensor_parallel=4, pipeline_parallel=2, replicas=2),),
            "deployments[0].replicas: a replica of 'big' spans 2 nodes (tensor_parallel 4 x pipeline_parallel 2 = 8 "
            "GPUs, 4 a node), so it must be the allocation's only replica, but it has replicas: 2.",
            id="spanning-replica-with-replicas-2",
        ),
        pytest.param(
            (
                Deployment(model_alias="small", model="s"),
                Deployment(model_alias="big", model="m", data_parallel=8),
            ),
            "deployments: a replica of 'big' spans 2 nodes (tensor_parallel 1 x data_parallel 8 = 8 GPUs, 4 a "
            "node), so it must be the allocation's only replica, but the run also deploys 'small'.",
            id="spanning-replica-beside-another-deployment",
        ),
        pytest.param(
            (Deployment(model_alias="big", model="m", engine="sglang", data_parallel=8),),
            "deployments[0].data_parallel: 8 in an SGLang replica that spans 2 nodes (tensor_parallel 1 x "
            "data_parallel 8 = 8 GPUs, 4 a node) (model alias 'big'); SGLang runs data parallel across nodes only "
            "with DP attention",
            id="sglang-dp-across-nodes",
        ),
        pytest.param(
            (Deployment(model_alias="one", model="m", expert_parallel=True),),
            "deployments[0].expert_parallel: true, but one replica has 1 GPU (tensor_parallel 1 = 1 GPU) "
            "(model alias 'one')",
            id="expert-parallel-on-one-gpu",
        ),
        pytest.param(
            (Deployment(model_alias="big", model="m", tensor_parallel=8, pipeline_parallel=2),),
            "deployments[0].tensor_parallel: 8 is more than the 4 GPUs of one node (model alias 'big'); tensor "
            "parallel never crosses a node",
            id="tp-never-crosses-a-node",
        ),
        pytest.param(
            (
                Deployment(model_alias="gen", model="g", pipeline_parallel=2, replicas=2),
                Deployment(model_alias="judge", model="j", data_parallel=2),
            ),
            "deployments: the deployments need 6 GPUs (gen: 2 x 2 + judge: 1 x 2) but a node has 4 (replicas x GPUs "
            "of a replica;",
            id="one-node-replicas-must-fit-together",
        ),
    ],
)
def test_shapes_that_cannot_be_placed_are_refused_with_their_numbers(
    deployments: tuple[Deployment, ...], want: str
) -> None:
    with pytest.raises(PlanError) as info:
        _plan_of(*deployments)
    assert str(info.value).startswith(want), str(info.value)
