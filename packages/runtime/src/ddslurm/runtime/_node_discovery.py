"""Where the allocation's servers run: the GPUs and nodes Slurm gave it, checked against the plan, the address its
leader is reached at (as Slurm names it: :mod:`~ddslurm.runtime._leader_address` makes it an IP address of the
leader's host) and the addresses of its nodes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping

from ddslurm.config import ServingPlan
from ddslurm.runtime._leader_address import LOOPBACK, resolve_name
from ddslurm.runtime._serving import GpuMismatchError, NodeMismatchError


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """GPUs Slurm gave this step: CUDA_VISIBLE_DEVICES, else SLURM_JOB_GPUS."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS"):
        value = env.get(name, "").strip()
        if value:
            return [v for v in value.split(",") if v]
    return []


def check_gpus(serving: ServingPlan, env: Mapping[str, str]) -> list[str]:
    gpus = visible_gpus(env)
    if len(gpus) != serving.gpus:
        raise GpuMismatchError(
            f"the plan places {serving.gpus} GPU(s) but this allocation sees {len(gpus)} "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r}, "
            f"SLURM_JOB_GPUS={env.get('SLURM_JOB_GPUS', '')!r})"
        )
    return gpus


def check_nodes(serving: ServingPlan, env: Mapping[str, str]) -> None:
    """The allocation has the plan's ``serving.nodes`` nodes, as Slurm says (``SLURM_JOB_NUM_NODES``, else
    ``SLURM_NNODES``; outside Slurm, neither set, nothing to check): a replica's follower placed on a node the
    allocation lacks would never start."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = env.get(name, "").strip()
        if value:
            if value != str(serving.nodes):
                raise NodeMismatchError(
                    f"the plan places its servers on {serving.nodes} node(s) but this allocation has {value} "
                    f"({name}={value!r})"
                )
            return


def leader_address(
    env: Mapping[str, str], run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> str:
    """Where the followers of a replica that spans nodes reach its leader: the address Slurm knows this node by
    (``NodeAddr`` of ``scontrol show node $SLURMD_NODENAME -o``; the controller runs on the allocation's first
    node, the leaders' node), else the node's name; outside Slurm (no ``SLURMD_NODENAME``) loopback."""
    node = env.get("SLURMD_NODENAME", "").strip()
    if not node:
        return LOOPBACK
    try:
        out = run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return node
    if out.returncode == 0:
        for field in out.stdout.split():
            key, _, value = field.partition("=")
            if key == "NodeAddr" and value and value != "(null)":
                return value
    return node


def allocation_addresses(
    env: Mapping[str, str], run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> frozenset[str]:
    """The IP addresses of the allocation's nodes (``SLURM_JOB_NODELIST``): each node's ``NodeAddr`` and
    ``NodeHostName`` as ``scontrol show node`` says, resolved; outside Slurm, loopback. A replica's followers reach
    its leader's rendezvous from these (:func:`~ddslurm.runtime._listeners.check_rendezvous`)."""
    nodelist = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "").strip()
    if not nodelist:
        return frozenset({LOOPBACK})
    names: set[str] = set()
    try:
        out = run(["scontrol", "show", "node", nodelist, "-o"], capture_output=True, text=True, timeout=30, check=False)
        if out.returncode == 0:
            for field in out.stdout.split():
                key, _, value = field.partition("=")
                if key in ("NodeAddr", "NodeHostName") and value and value != "(null)":
                    names.add(value)
        if not names:
            out = run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=False
            )
            names.update(out.stdout.split() if out.returncode == 0 else ())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return frozenset(address for name in names for address in resolve_name(name))
