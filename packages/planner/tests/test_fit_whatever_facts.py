"""Issue 37: the planner never chooses a layout that does not fit a node of the partition (its CPUs, GPUs and
memory), whatever the facts say. Planted facts (a load of a second, a crawling replica) made the most replicas an
allocation holds the cheapest: 4 GPUs and more CPUs than the local cluster's nodes have. Layouts the nodes cannot
hold are not in the search at all (not chosen, then refused by the job check)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from packages.planner.tests.test_choose import chosen, slow_model

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    Facts,
    LayoutChoice,
    PartitionNodes,
    Plan,
    ProviderSnapshot,
    RunFile,
    RunLayout,
    ServerSpec,
    Submission,
)
from ddslurm.planner import PlanInputs, compile_plan, parse_memory_mb, plan_serving
from ddslurm.planner._allocations import node_memory
from ddslurm.planner._choose import candidates
from ddslurm.planner._cost import CostSources, allocation_cpus, allocation_gpus, cost_inputs

NODES = PartitionNodes(partition="gpu", nodes=2, cpus=16, gpus=4, memory_mb=32000)
"""The local cluster's GPU nodes (tools/local-slurm): 16 CPUs, 4 GPUs and 32000 MB each."""
PROFILE = ClusterProfile(workspace="/ws", python_env="/venv", gpus_per_node=4, partition="gpu", memory_per_gpu="12G")
SUBMISSION_CPUS, SERVER_CPUS, MEMORY_PER_GPU_MB = 4, 4, 12 * 1024
HOSTILE = (
    slow_model(load_s=1.0, rate=0.01),  # every replica it can get
    slow_model(load_s=0.0, rate=0.001),
    slow_model(load_s=600.0, rate=1e6),  # one replica, as fast as can be
    Facts(),
)


def _run(gpus: int = 4) -> RunFile:
    dep = Deployment(
        model_alias="gen", model="m", server=ServerSpec(cpus=SERVER_CPUS, extra_args=("--max-num-seqs", "8"))
    )
    return RunFile(
        name="r", recipe="x.yaml", num_records=800, shards=8, deployments=(dep,), gpus=gpus,
        submission=Submission(cpus=SUBMISSION_CPUS),
    )  # fmt: skip


def _plan(run: RunFile, nodes: PartitionNodes | None, facts: Facts, profile: ClusterProfile = PROFILE) -> Plan:
    return compile_plan(
        PlanInputs(
            run=run, profile=profile, snapshot=ProviderSnapshot(), layout=RunLayout(Path("/ws/runs/r")),
            recipe_sha256="-", snapshot_sha256="-", facts=facts, nodes=nodes,
        )
    )  # fmt: skip


def _node_cpus(replicas: int) -> int:
    return SUBMISSION_CPUS + replicas * SERVER_CPUS + 1  # the clients, each replica's step, the proxy


def _fits(choice: LayoutChoice) -> bool:
    [replicas] = choice.replicas
    return _node_cpus(replicas) <= NODES.cpus and replicas <= NODES.gpus and replicas * MEMORY_PER_GPU_MB <= 32000


def test_planted_facts_that_favour_every_gpu_choose_a_layout_the_nodes_hold() -> None:
    facts = HOSTILE[0]
    unbounded = _plan(_run(), None, facts)  # the nodes unknown: what the facts alone would pick
    assert chosen(unbounded).replicas == (4,) and unbounded.generation.cpus_per_task == _node_cpus(4) > NODES.cpus
    plan = _plan(_run(), NODES, facts)
    assert plan.prediction is not None
    for choice in (plan.prediction.chosen, *plan.prediction.runners_up):
        assert _fits(choice), choice
    gen = plan.generation
    assert gen.cpus_per_task <= NODES.cpus and gen.gres == f"gpu:{sum(chosen(plan).replicas)}"
    assert gen.memory is not None and parse_memory_mb(gen.memory) <= NODES.memory_mb


@pytest.mark.parametrize("facts", HOSTILE, ids=["quick-load-slow-replica", "no-load-crawl", "slow-load-fast", "none"])
@pytest.mark.parametrize("profile_gpus", [4, 8])  # a profile that claims more GPUs a node than sinfo shows
def test_no_layout_a_node_cannot_hold_is_even_in_the_search(facts: Facts, profile_gpus: int) -> None:
    run = _run(gpus=8)
    profile = msgspec.structs.replace(PROFILE, gpus_per_node=profile_gpus)
    sources = CostSources(
        facts=facts, gpu_type="", recipe_key="-", columns=None, shard_records=(100,) * 8, two_stage=False,
        nodes=NODES, memory=node_memory(run, profile),
    )  # fmt: skip
    inputs = cost_inputs(run, plan_serving(run, profile, "gpu"), sources)
    offered = list(candidates(run, profile_gpus, (1,), inputs, 8))
    assert offered
    for candidate in offered:
        cpus, gpus = allocation_cpus(candidate.replicas, inputs), allocation_gpus(candidate.replicas, inputs)
        assert cpus <= NODES.cpus and gpus <= NODES.gpus and gpus * MEMORY_PER_GPU_MB <= NODES.memory_mb, candidate
    plan = _plan(run, NODES, facts, profile)
    assert plan.prediction is not None
    assert all(_fits(c) for c in (plan.prediction.chosen, *plan.prediction.runners_up)), plan.prediction
