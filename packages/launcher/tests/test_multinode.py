"""What a run with a replica that spans nodes asks Slurm for and bills: ``--nodes``, one task a node, GPUs per node;
the GPU-hours over all the nodes; one srun step per node of the replica (``--relative``)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    Plan,
    ProviderSnapshot,
    RunFile,
    RunLayout,
    ServerSpec,
    Submission,
)
from ddslurm.launcher.commands._console import plan_notes
from ddslurm.launcher.submission._bill import bill_lines, make_bill
from ddslurm.launcher.submission._render import render_generation
from ddslurm.planner import PlanInputs, compile_plan, plan_arrays
from ddslurm.providers import AliasRow

LAYOUT = RunLayout.in_workspace(Path("/ws"), "run-1")


def _plan(*deployments: Deployment, shards: int = 1, **profile: object) -> Plan:
    fields: dict[str, object] = {"workspace": "/ws", "python_env": "/venv", "partition": "gpu", "gpus_per_node": 4}
    fields.update(profile)
    run = RunFile(
        name="demo",
        recipe="recipe.yaml",
        num_records=100,
        shards=shards,
        deployments=deployments,
        submission=Submission(cpus=2, time_limit=90),
    )
    inputs = PlanInputs(
        run=run,
        profile=ClusterProfile(**fields),  # type: ignore[arg-type]
        snapshot=ProviderSnapshot(),
        layout=LAYOUT,
        recipe_sha256="1" * 64,
        snapshot_sha256="2" * 64,
    )
    return compile_plan(inputs)


TP4_PP2 = Deployment(model_alias="big", model="org/big", tensor_parallel=4, pipeline_parallel=2)


def _sbatch(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


@pytest.mark.parametrize(
    ("gpu_request", "gpu_lines"),
    [
        pytest.param("gres", ["--gres=gpu:4"], id="gres"),
        pytest.param("gpus", ["--gres=none", "--gpus-per-node=4"], id="gpus"),
    ],
)
def test_two_node_job_asks_for_one_task_a_node_and_gpus_per_node(gpu_request: str, gpu_lines: list[str]) -> None:
    plan = _plan(TP4_PP2, gpu_request=gpu_request)
    lines = _sbatch(render_generation(plan, LAYOUT, [0]))
    assert "--nodes=2" in lines and "--ntasks-per-node=1" in lines
    assert "--ntasks=1" not in lines and not any(line.startswith("--gpus=") for line in lines)
    # client 2 + the leader's step 4 + the proxy 1, on each node
    assert "--cpus-per-task=7" in lines
    assert [line for line in lines if line.startswith(("--gres", "--gpus"))] == gpu_lines


def test_one_node_job_keeps_ntasks_and_gpus() -> None:
    plan = _plan(Deployment(model_alias="gen", model="m", tensor_parallel=2), gpu_request="gpus")
    lines = _sbatch(render_generation(plan, LAYOUT, [0]))
    assert {"--nodes=1", "--ntasks=1", "--gpus=2"} <= set(lines)
    assert "--ntasks-per-node=1" not in lines and not any(line.startswith("--gpus-per-node") for line in lines)


def test_the_bill_of_a_two_node_replica_counts_every_node() -> None:
    plan = _plan(TP4_PP2, shards=3)
    arrays = plan_arrays(plan, LAYOUT, [0, 1, 2], 1001, kind="initial", stamp="s")
    rows = [
        AliasRow(alias="big", kind="local", model="org/big", provider="local", endpoint="", key_env=None, key_set=None)
    ]
    bill = make_bill(plan, arrays, rows, ProviderSnapshot())
    [jobs] = bill.jobs
    tasks, minutes = jobs.tasks, plan.generation.time_minutes
    assert (jobs.nodes, jobs.gpus_per_node, jobs.gpus_per_task) == (2, 4, 8)
    assert bill.gpu_hours == round(tasks * 2 * 4 * minutes / 60, 2) > 0
    assert bill.cpu_hours == round(tasks * 2 * plan.generation.cpus_per_task * minutes / 60, 2)
    assert bill.aliases[0].where.startswith("1 replica x (TP 4 x PP 2 = 8 GPUs over 2 nodes, 4 a node), vllm")
    # The leader, the proxy and the client on the first node, the follower alone on the second.
    servers = [s for s in bill.steps if "--job-name=server-big-0" in s]
    assert len(servers) == 2
    assert "--relative=0" in servers[0] and "--relative=1" in servers[1]
    others = [s for s in bill.steps if s not in servers]
    assert len(others) == 2 and all("--relative=0" in s for s in others)
    assert (bill.nodes, bill.steps_per_node) == (2, [3, 1])
    text = "\n".join(bill_lines(bill))
    assert "on 2 nodes (steps a node: node 0: 3, node 1: 1)" in text
    assert "each 2 nodes of 7 CPUs and 4 GPU(s) each (8 GPUs)" in text
    assert f"({tasks} task(s) x 2 nodes x 4 GPU(s) a node x {minutes} min)" in text
    shown = msgspec.json.decode(msgspec.json.encode(bill))
    assert (shown["nodes"], shown["steps_per_node"], shown["jobs"][0]["gpus_per_node"]) == (2, [3, 1], 4)


def test_the_bill_of_one_node_replicas_has_no_relative_steps() -> None:
    plan = _plan(Deployment(model_alias="moe", model="m", data_parallel=2, expert_parallel=True, replicas=2))
    arrays = plan_arrays(plan, LAYOUT, [0], 1001, kind="initial", stamp="s")
    rows = [AliasRow(alias="moe", kind="local", model="m", provider="local", endpoint="", key_env=None, key_set=None)]
    bill = make_bill(plan, arrays, rows, ProviderSnapshot())
    assert not any("--relative" in s for s in bill.steps)
    assert (bill.nodes, bill.steps_per_node) == (1, [len(bill.steps)])
    assert bill.aliases[0].where.startswith("2 replicas x (TP 1 x DP 2 = 2 GPUs, expert parallel), vllm")
    assert bill.gpu_hours == round(bill.jobs[0].tasks * 4 * plan.generation.time_minutes / 60, 2)


def test_sglang_is_named_in_the_bill() -> None:
    plan = _plan(Deployment(model_alias="gen", model="m", engine="sglang"))
    arrays = plan_arrays(plan, LAYOUT, [0], 1001, kind="initial", stamp="s")
    rows = [AliasRow(alias="gen", kind="local", model="m", provider="local", endpoint="", key_env=None, key_set=None)]
    bill = make_bill(plan, arrays, rows, ProviderSnapshot())
    assert bill.aliases[0].where.startswith("1 replica x (TP 1 = 1 GPU), sglang; endpoint:")


def test_the_dry_run_notes_the_capacity_it_assumes_for_sglang() -> None:
    plan = _plan(Deployment(model_alias="gen", model="m", engine="sglang", data_parallel=2))
    [note] = [n for n in plan_notes(plan) if n.startswith("gen:")]
    assert "ddslurm assumes 512 a replica for the clients (2 rank(s) x 256)" in note
    flagged = ServerSpec(extra_args=("--max-running-requests", "8"))
    sized = _plan(Deployment(model_alias="gen", model="m", engine="sglang", server=flagged))
    assert not [n for n in plan_notes(sized) if n.startswith("gen:")]
