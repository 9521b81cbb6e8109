"""The run's layout: the allocations and their client workers by the fixed rule, or the cost model's choice within
``gpus`` and ``deadline``; each client step's share of the replicas' capacity; what a GPU node asks for of
memory."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from ddslurm.config import ClusterProfile, Prediction, RunFile, ServingPlan
from ddslurm.planner._choose import choose
from ddslurm.planner._cost import CostSources, NodeMemory, allocation_gpus, client_cpus, cost_inputs
from ddslurm.planner._serving_plan import plan_serving
from ddslurm.planner._slurm_units import parse_memory_mb, parse_time_limit
from ddslurm.planner.errors import PlanError


@dataclass(frozen=True, slots=True)
class Allocations:
    """How the shards are spread over jobs: ``count`` pulling allocations (None: one array task per shard), each
    running ``workers`` client steps of ``client_cpus`` CPUs at once."""

    count: int | None
    workers: int
    client_cpus: int


def plan_allocations(run: RunFile, serving: ServingPlan | None) -> Allocations:
    """Resolve ``allocations`` and ``client_workers`` (``auto`` or numbers) against the shards and the servers by
    the fixed rule: the layout of ``allocations: K`` without ``gpus``, and the GPUs at once that bound the cost
    model's choice otherwise (:func:`plan_layout`); it refuses the numbers that cannot be met.

    ``client_workers: auto``: one client step per model-server replica (one Data Designer process keeps about one
    replica's worth of requests in flight; ~11 ms of CPU per request, docs/performance.md), never more than the
    client CPUs (``submission.cpus``, shared among the workers) or the shards; 1 for hosted-only runs.
    ``allocations: auto``: hosted-only runs keep one task per shard (no servers to keep warm); with deployments
    one allocation per ``workers`` shards, so each shard starts at once and servers start once per allocation,
    at most ``max_concurrent`` (more allocations could not run at once anyway).
    """
    shards, cpus = run.shards, run.submission.cpus
    if isinstance(run.client_workers, int):
        if run.client_workers > cpus:
            raise PlanError(
                f"client_workers: {run.client_workers} client steps need at least {run.client_workers} CPUs, but "
                f"submission.cpus (the client CPUs, shared among them) is {cpus}"
            )
        workers = min(run.client_workers, shards)
    elif serving is not None:
        workers = max(1, min(sum(len(d.replicas) for d in serving.deployments), cpus, shards))
    else:
        workers = 1
    if isinstance(run.allocations, int):
        if run.allocations > shards:
            raise PlanError(
                f"allocations: {run.allocations} allocations for {shards} shards; an allocation needs at least one "
                "shard (use at most as many allocations as shards)"
            )
        count = run.allocations
    elif serving is None:
        count = shards
    else:
        count = math.ceil(shards / workers)
        if run.max_concurrent is not None:
            count = min(count, run.max_concurrent)
    if count == shards:
        return Allocations(None, 1, cpus)  # one task per shard: task i runs shard i
    return Allocations(count, workers, max(1, cpus // workers))


def _shared(serving: ServingPlan | None, allocations: Allocations) -> ServingPlan | None:
    """Client workers share the replicas: together they keep exactly their capacity in flight (a request that
    waits in vLLM's queue spends its Data Designer timeout there)."""
    if serving is None or allocations.workers <= 1:
        return serving
    shared = tuple(
        msgspec.structs.replace(d, max_parallel_requests=-(-d.max_parallel_requests // allocations.workers))
        if d.max_parallel_requests is not None
        else d
        for d in serving.deployments
    )
    return msgspec.structs.replace(serving, deployments=shared)


@dataclass(frozen=True, slots=True)
class Layout:
    """The run's layout: the replicas placed, the allocations and workers, the array's throttle, and the cost
    model's prediction (None: the run file fixes the allocations without ``gpus``, or no deployments)."""

    serving: ServingPlan | None
    allocations: Allocations
    max_concurrent: int | None
    prediction: Prediction | None = None


def plan_layout(run: RunFile, profile: ClusterProfile, sources: CostSources) -> Layout:
    """The allocations, replicas and client workers of the run. With ``allocations: auto`` or ``gpus``, the cost
    model's choice (``_choose``) within ``gpus`` (without it, within the GPUs the fixed rule of
    :func:`plan_allocations` would hold at once); otherwise that rule. Each client step's share of the replicas'
    capacity is applied (:func:`_shared`)."""
    if not run.deployments:
        return Layout(None, plan_allocations(run, None), run.max_concurrent)
    partition = run.submission.partition or profile.partition
    serving = plan_serving(run, profile, partition)
    fixed = plan_allocations(run, serving)  # refuses the impossible numbers the run file sets
    if run.allocations != "auto" and run.gpus is None:
        return Layout(_shared(serving, fixed), fixed, run.max_concurrent)
    deadline_s = None if run.deadline is None else parse_time_limit(run.deadline, "deadline") * 60
    inputs = cost_inputs(run, serving, sources)
    shard_records = sources.shard_records
    declared = tuple(len(d.replicas) for d in serving.deployments)
    one = allocation_gpus(declared, inputs)
    shards = len(shard_records)
    if run.gpus is not None:
        if run.gpus < one:
            detail = " + ".join(f"{d.alias}: {r} x {d.gpus}" for r, d in zip(declared, inputs.deployments, strict=True))
            raise PlanError(
                f"gpus: {run.gpus}, but one allocation of the deployments holds {one} GPUs ({detail}, replicas x "
                f"GPUs of a replica); set gpus to at least {one}"
            )
        budget = run.gpus
    else:
        budget = min(fixed.count or shards, run.max_concurrent or shards) * one
    spans = tuple(d.replicas[0].nodes for d in serving.deployments)
    time_limit_s = parse_time_limit(run.submission.time_limit, "submission.time_limit") * 60
    chosen = choose(run, profile.gpus_per_node, spans, inputs, budget, deadline_s, time_limit_s)
    candidate = chosen.candidate
    serving = plan_serving(run, profile, partition, candidate.replicas)
    if candidate.allocations == shards:
        allocations = Allocations(None, 1, run.submission.cpus)
    else:
        allocations = Allocations(
            candidate.allocations, candidate.workers, client_cpus(candidate.workers, run.submission.cpus)
        )
    throttle = candidate.at_once if candidate.at_once < candidate.allocations else run.max_concurrent
    return Layout(_shared(serving, allocations), allocations, throttle, chosen.prediction)


def node_memory(run: RunFile, profile: ClusterProfile) -> NodeMemory:
    """What a GPU allocation's node asks for of memory: ``submission.memory``, else the profile's
    ``memory_per_gpu`` x its GPUs (one rule for ``--mem`` and for the layouts a node holds)."""
    fixed = run.submission.memory
    if fixed is not None:
        return NodeMemory(fixed_mb=parse_memory_mb(fixed, "submission.memory"))
    if profile.memory_per_gpu is not None:
        return NodeMemory(per_gpu_mb=parse_memory_mb(profile.memory_per_gpu, "profile.memory_per_gpu"))
    return NodeMemory()
