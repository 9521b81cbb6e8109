"""The planner's cost model: from what the workspace measured (or stated defaults), the wall time, GPU-hours and
GPU-busy share one layout of allocations, replicas and client workers is predicted to take. Pure: no files, no
clock."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ddslurm.config import (
    Facts,
    FactUse,
    LayoutChoice,
    ModelFact,
    ModelShape,
    PartitionNodes,
    RecipeColumn,
    RunFile,
    ServingPlan,
    engine_flags,
)

DEFAULT_LOAD_S = 180.0
"""Seconds from a server step's start to its replica answering, when no run or calibration measured the model's
shape: a few minutes, the order of a 7-70B model's load from a shared filesystem and its CUDA graphs."""
DEFAULT_REQUEST_S = 10.0
"""Seconds one request takes with a replica at its capacity, when nothing was measured: a replica then completes
``capacity / 10`` requests per second."""
DEFAULT_OVERHEAD_S = 15.0
"""Seconds an allocation holds its GPUs beyond its model load and its generating (job start to servers' start,
first request after ready, last shard's end to job end)."""
DEFAULT_CLIENT_CPU_S = 0.011
"""CPU-seconds of the Data Designer client per request (docs/performance.md: about 11 ms)."""
DEFAULT_CPU_STAGE_RECORDS_PER_S = 2.0
"""Records one CPU-stage client worker generates per second (the hosted-only columns of a two-stage run)."""
CPU_STAGE_START_S = 20.0
"""Seconds from the last GPU shard's end to its CPU-stage allocation generating."""
DRAIN_SHARE = 0.5
"""A shard's last requests finish over half a request's time at capacity (``capacity / rate``) after its others."""


@dataclass(frozen=True, slots=True)
class DeploymentCost:
    """What the cost model knows of one deployment (in run-file order)."""

    alias: str
    gpus: int
    """GPUs of one replica (``tensor_parallel x pipeline_parallel x data_parallel``)."""
    capacity: int
    """Requests one replica runs at once (the plan's ``capacity``)."""
    requests_per_s: float
    """Requests one replica completes per second at its capacity."""
    load_s: float
    requests_per_record: float
    cpus: int = 1
    """CPUs of one replica's step (``server.cpus``)."""


@dataclass(frozen=True, slots=True)
class CostInputs:
    """The cost model's inputs, each number's origin in ``facts``."""

    shard_records: tuple[int, ...]
    """Records of each shard, in shard order (``plan_shards``)."""
    deployments: tuple[DeploymentCost, ...]
    cpus: int
    """``submission.cpus``: the client CPUs of an allocation, shared among its workers."""
    client_cpu_s: float
    overhead_s: float
    cpu_stage_records_per_s: float
    two_stage: bool
    facts: tuple[FactUse, ...] = ()
    proxy_cpus: int = 0
    """CPUs of an allocation's proxies (one a proxied deployment)."""
    nodes: PartitionNodes | None = None
    """The generation partition's GPU nodes; None: unknown (no layout is ruled out by them)."""
    memory: NodeMemory | None = None
    """What one allocation asks of a node's memory (``CostSources.memory``)."""
    runs: tuple[tuple[int, int], ...] = field(init=False)
    """The shards as runs of equal shards (:func:`shard_runs`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", shard_runs(self.shard_records))


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout: ``allocations`` (the shard count: one task per shard), ``replicas`` per allocation of each
    deployment, ``workers`` client steps per allocation, at most ``at_once`` allocations at once."""

    allocations: int
    replicas: tuple[int, ...]
    workers: int
    at_once: int


def shape_of(run: RunFile, index: int, gpu_type: str) -> ModelShape:
    return ModelShape.of(run.deployments[index], gpu_type)


def _column_requests(alias: str, columns: Sequence[RecipeColumn] | None) -> float:
    """Requests per record to ``alias`` when none were measured: the recipe columns that use it (1: unknown)."""
    if columns is None:
        return 1.0
    return float(sum(1 for c in columns if alias in c.aliases))


@dataclass(frozen=True, slots=True)
class CostSources:
    """What the cost model's inputs are read from besides the run file and its planned serving."""

    facts: Facts
    gpu_type: str
    recipe_key: str
    """The recipe's facts key (``Plan.recipe_facts_key()``: its digest as the run file names it)."""
    columns: Sequence[RecipeColumn] | None
    shard_records: tuple[int, ...]
    two_stage: bool
    nodes: PartitionNodes | None = None
    """The generation partition's GPU nodes (``sinfo``): layouts are only those its nodes hold; None: unknown."""
    memory: NodeMemory | None = None
    """What one GPU allocation asks of a node's memory; None: nothing (the site's default)."""


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """``--mem`` of a GPU allocation's node: ``submission.memory`` when the run file sets it, else the profile's
    ``memory_per_gpu`` x the node's GPUs (``_gpu_resources``)."""

    fixed_mb: int | None = None
    per_gpu_mb: int | None = None

    def of(self, node_gpus: int) -> int | None:
        """MB a node with ``node_gpus`` of the allocation's GPUs asks for; None: the site's default."""
        if self.fixed_mb is not None:
            return self.fixed_mb
        return None if self.per_gpu_mb is None else self.per_gpu_mb * node_gpus


def rate_at(fact: ModelFact, capacity: int) -> tuple[float | None, str]:
    """A replica's requests per second at ``capacity`` requests in flight, from ``fact``, and how: as measured at
    the same capacity; read off a calibration's sweep (linear between its points; below its first, in proportion
    to the requests in flight; above its last, its last: a replica's throughput stops growing as it saturates);
    None (the default is used) for a run's measurement at another capacity, whose relation to this one is unknown."""
    if fact.capacity == capacity:
        return fact.requests_per_s, ""
    points = sorted((p.in_flight, p.requests_per_s) for p in fact.sweep if p.requests_per_s > 0)
    if not points:
        return None, (
            f"measured at capacity {fact.capacity}, not this run's {capacity}, with no concurrency sweep to scale it "
            "by (ddslurm tune measures one): the default is used"
        )
    how = f"measured at capacity {fact.capacity}; read off its sweep at {capacity} in flight"
    first, last = points[0], points[-1]
    if capacity <= first[0]:
        return first[1] * capacity / first[0], how
    if capacity >= last[0]:
        return last[1], how + f" (its most, {last[0]}: no faster beyond)"
    for (lo, lo_rate), (hi, hi_rate) in itertools.pairwise(points):
        if lo <= capacity <= hi:
            return lo_rate + (hi_rate - lo_rate) * (capacity - lo) / (hi - lo), how
    return last[1], how  # unreachable: the points cover every capacity between the first and the last


OUTLIER = 3.0
"""A run's rate this many times above or below the median of the runs a fact rests on is flagged in the bill."""


def _rests_on(fact: ModelFact) -> str:
    """How many runs a fact's numbers are the median of, and a latest run far from them (flagged, not used)."""
    if fact.runs() < 2:
        return ""
    text = f"median of {fact.runs()} runs"
    latest = fact.samples[-1].requests_per_s
    ratio = latest / fact.requests_per_s if fact.requests_per_s > 0 else 1.0
    if ratio > OUTLIER or ratio < 1 / OUTLIER:
        text += f"; the latest run's {latest:g} (run {fact.samples[-1].run_id}) is an outlier, x{ratio:.2g} the median"
    return text


def _median_note(runs: int) -> str:
    return f"median of {runs} runs" if runs >= 2 else ""


def fact_rate(fact: ModelFact, capacity: int, flags: tuple[str, ...]) -> tuple[float | None, str]:
    """The rate ``fact`` gives a run at ``capacity`` with engine ``flags`` (:func:`rate_at`), None when it gives
    none (measured with other flags, or at another capacity with nothing to scale it by), and the bill's note."""
    if fact.flags != flags:  # quantization, prefix caching, ...: another engine's rate
        return None, f"measured with engine flags {list(fact.flags)}, this run has {list(flags)}: the default is used"
    rate, note = rate_at(fact, capacity)
    if rate is None:
        return None, note
    return rate, "; ".join(n for n in (note, _rests_on(fact)) if n)


def model_uses(fact: ModelFact | None, subject: str, capacity: int, flags: tuple[str, ...]) -> tuple[FactUse, FactUse]:
    """A deployment's model load and replica rate at ``capacity`` with engine ``flags``, as the cost model uses
    them: from ``fact`` (its shape's, None: none measured) where it gives them (:func:`fact_rate`), else the
    defaults; each with its origin, the runs it rests on and a note."""
    if fact is not None:  # the model load does not depend on the capacity
        load = FactUse(
            name="load_s",
            subject=subject,
            value=fact.load_s,
            origin=fact.measured_by,
            run_id=fact.run_id,
            runs=fact.runs(),
            note=_median_note(fact.runs()),
        )
    else:
        load = FactUse(name="load_s", subject=subject, value=DEFAULT_LOAD_S, origin="default")
    scaled, note = fact_rate(fact, capacity, flags) if fact is not None else (None, "")
    if fact is not None and scaled is not None:
        rate = FactUse(
            name="requests_per_s",
            subject=subject,
            value=scaled,
            origin=fact.measured_by,
            run_id=fact.run_id,
            runs=fact.runs(),
            note=note,
        )
    else:
        rate = FactUse(
            name="requests_per_s", subject=subject, value=capacity / DEFAULT_REQUEST_S, origin="default", note=note
        )
    return load, rate


def cost_inputs(run: RunFile, serving: ServingPlan, sources: CostSources) -> CostInputs:
    """The model's inputs for ``run`` (``serving``: its deployments as planned), from the workspace's ``facts`` of
    each deployment's model shape and of the recipe, else the stated defaults; every number with its origin."""
    facts, gpu_type, columns, two_stage = sources.facts, sources.gpu_type, sources.columns, sources.two_stage
    uses: list[FactUse] = []
    deployments: list[DeploymentCost] = []
    recipe = facts.recipe(sources.recipe_key)
    for index, (dep, planned) in enumerate(zip(run.deployments, serving.deployments, strict=True)):
        shape = shape_of(run, index, gpu_type)
        capacity = planned.capacity or 1
        subject = f"{dep.model_alias}:{shape.key()}"
        fact = facts.model(shape)
        load_use, rate_use = model_uses(fact, subject, capacity, engine_flags(dep.server.extra_args))
        uses += [load_use, rate_use]
        load, rate = load_use.value, rate_use.value
        if recipe is not None and dep.model_alias in recipe.requests_per_record:
            per_record = recipe.requests_per_record[dep.model_alias]
            uses.append(
                FactUse(
                    name="requests_per_record",
                    subject=dep.model_alias,
                    value=per_record,
                    origin=recipe.measured_by,
                    run_id=recipe.run_id,
                    runs=(runs := recipe.runs("requests_per_record", dep.model_alias)),
                    note=_median_note(runs),
                )
            )
        else:
            per_record = _column_requests(dep.model_alias, columns)
            uses.append(
                FactUse(name="requests_per_record", subject=dep.model_alias, value=per_record, origin="default")
            )
        gpus = dep.tensor_parallel * dep.pipeline_parallel * dep.data_parallel
        deployments.append(DeploymentCost(dep.model_alias, gpus, capacity, rate, load, per_record, dep.server.cpus))

    def recipe_number(name: str, measured: float | None, default: float) -> float:
        if measured is not None and recipe is not None:
            runs = recipe.runs(name)
            uses.append(
                FactUse(
                    name=name,
                    subject="recipe",
                    value=measured,
                    origin=recipe.measured_by,
                    run_id=recipe.run_id,
                    runs=runs,
                    note=_median_note(runs),
                )
            )
            return measured
        uses.append(FactUse(name=name, subject="recipe", value=default, origin="default"))
        return default

    client_cpu_s = recipe_number(
        "client_cpu_s_per_request", None if recipe is None else recipe.client_cpu_s_per_request, DEFAULT_CLIENT_CPU_S
    )
    overhead_s = recipe_number(
        "allocation_overhead_s", None if recipe is None else recipe.allocation_overhead_s, DEFAULT_OVERHEAD_S
    )
    cpu_stage = DEFAULT_CPU_STAGE_RECORDS_PER_S
    if two_stage:
        measured = None if recipe is None else recipe.cpu_stage_records_per_s
        cpu_stage = recipe_number("cpu_stage_records_per_s", measured, DEFAULT_CPU_STAGE_RECORDS_PER_S)
    return CostInputs(
        shard_records=sources.shard_records,
        deployments=tuple(deployments),
        cpus=run.submission.cpus,
        client_cpu_s=client_cpu_s,
        overhead_s=overhead_s,
        cpu_stage_records_per_s=cpu_stage,
        two_stage=two_stage,
        facts=tuple(uses),
        proxy_cpus=proxies_cpus(serving),
        nodes=sources.nodes,
        memory=sources.memory,
    )


def proxies_cpus(serving: ServingPlan) -> int:
    """CPUs of an allocation's proxies: one proxy a proxied deployment."""
    return serving.proxy_cpus * sum(1 for d in serving.deployments if d.proxy)


def node_cpus(client_cpus: int, server_cpus: Iterable[int], proxy_cpus: int) -> int:
    """CPUs of one GPU allocation's node (``--cpus-per-task``): the clients' (``submission.cpus``), every replica's
    step and the proxies'. What the plan asks Slurm for and what the layout search fits in a node."""
    return client_cpus + sum(server_cpus) + proxy_cpus


def allocation_cpus(replicas: Sequence[int], inputs: CostInputs) -> int:
    """:func:`node_cpus` of a candidate's ``replicas`` of each deployment."""
    servers = (d.cpus for r, d in zip(replicas, inputs.deployments, strict=True) for _ in range(r))
    return node_cpus(inputs.cpus, servers, inputs.proxy_cpus)


def node_misfit(replicas: Sequence[int], node_gpus: int, inputs: CostInputs) -> str | None:
    """What a node of an allocation of ``replicas`` (``node_gpus`` of its GPUs on one node) asks for beyond the
    partition's smallest GPU node (its CPUs, GPUs or memory), in words; None when it fits, or the nodes are not
    known."""
    nodes = inputs.nodes
    if nodes is None:
        return None
    cpus = allocation_cpus(replicas, inputs)
    if cpus > nodes.cpus:
        return (
            f"{cpus} CPUs a node (submission.cpus {inputs.cpus}, server.cpus of each replica, one for each proxy), "
            f"where its smallest GPU node has {nodes.cpus}"
        )
    if node_gpus > nodes.gpus:
        return f"{node_gpus} GPUs a node, where its GPU node with the fewest has {nodes.gpus}"
    memory = inputs.memory.of(node_gpus) if inputs.memory is not None else None
    if memory is not None and nodes.memory_mb and memory > nodes.memory_mb:
        return (
            f"{memory} MB of memory a node (submission.memory, or the profile's memory_per_gpu x {node_gpus} "
            f"GPUs), where its smallest GPU node has {nodes.memory_mb} MB"
        )
    return None


def allocation_gpus(replicas: Sequence[int], inputs: CostInputs) -> int:
    """GPUs one allocation holds: every deployment's replicas x its replica's GPUs."""
    return sum(r * d.gpus for r, d in zip(replicas, inputs.deployments, strict=True))


def client_cpus(workers: int, cpus: int) -> int:
    """CPUs of each of an allocation's ``workers`` client steps (``submission.cpus`` shared, at least 1)."""
    return max(1, cpus // workers)


def record_seconds(candidate: Candidate, inputs: CostInputs) -> float:
    """Seconds one allocation takes per record, all its workers together: the slowest deployment's requests per
    record over its replicas' rate, or what the client CPUs can send when that is slower."""
    busiest = max(
        (
            d.requests_per_record / (r * d.requests_per_s)
            for r, d in zip(candidate.replicas, inputs.deployments, strict=True)
        ),
        default=0.0,
    )
    per_record = sum(d.requests_per_record for d in inputs.deployments)
    cpus = candidate.workers * client_cpus(candidate.workers, inputs.cpus)
    return max(busiest, per_record * inputs.client_cpu_s / cpus)


def drain_seconds(inputs: CostInputs) -> float:
    """Seconds a shard's last requests take after its others: half the slowest request time at capacity."""
    return DRAIN_SHARE * max(
        (d.capacity / d.requests_per_s for d in inputs.deployments if d.requests_per_record > 0), default=0.0
    )


def shard_runs(records: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """(records of a shard, shards) of each run of consecutive equal shards."""
    return tuple((size, len(list(group))) for size, group in itertools.groupby(records))


def fill_slots(
    runs: Sequence[tuple[int, int]], slots: int, start: float, per_record: float, fixed: float
) -> tuple[list[float], list[int]]:
    """Shards in order (``runs``: :func:`shard_runs`) onto the earliest free of ``slots`` worker slots (ties: the
    lowest slot), all free at ``start``; a shard of ``n`` records takes ``n x per_record + fixed`` seconds.
    Returns each slot's end and the index of its last shard (-1: none).

    Exactly the greedy, in closed form over each run of equal shards: while the slots' free times lie within one
    shard's duration, the next shards go round the slots in the order they come free (each goes to the back when
    given one), so whole rounds are added at once."""
    ends = [start] * slots
    last = [-1] * slots
    level = True  # every slot free at the same time: their order is the slots' own
    index = 0
    for size, count in runs:
        duration = size * per_record + fixed
        stop = index + count
        while index < stop:
            left = stop - index
            order = range(slots) if level else sorted(range(slots), key=lambda s: (ends[s], s))
            if level or slots == 1 or ends[order[-1]] - ends[order[0]] < duration:
                rounds, extra = divmod(left, slots)
                if rounds:
                    step = rounds * duration
                    for position, slot in enumerate(order):
                        ends[slot] += step + (duration if position < extra else 0.0)
                        last[slot] = index + (rounds - (position >= extra)) * slots + position
                else:
                    for position in range(extra):
                        slot = order[position]
                        ends[slot] += duration
                        last[slot] = index + position
                level = level and extra == 0
                index = stop
                continue
            level = False
            free = [(ends[s], s) for s in range(slots)]
            heapq.heapify(free)
            for _ in range(min(left, slots)):
                at, slot = heapq.heappop(free)
                ends[slot] = at + duration
                last[slot] = index
                index += 1
                heapq.heappush(free, (ends[slot], slot))
    return ends, last


def _allocations(
    candidate: Candidate, inputs: CostInputs, hold: float, per_record: float
) -> tuple[float, float, int, float]:
    """Seconds the allocations hold their GPUs (summed), the last allocation's end, the last GPU shard to end
    (the first of those ending last; -1 unless two-stage) and the longest any one allocation runs: shards in
    order onto the earliest free worker slot of the allocations that run at once; an allocation waiting for one to
    end (the array's throttle) starts when it does."""
    drain = drain_seconds(inputs)
    records = inputs.shard_records
    shards = len(records)
    if candidate.allocations == shards:  # one task per shard: a slot of the throttle is held shard by shard
        ends, last = fill_slots(inputs.runs, min(candidate.at_once, shards), 0.0, per_record, hold + drain)
        held = sum(n * per_record + hold + drain for n in records)
        wall = max(ends)
        longest = max(records) * per_record + hold + drain
    else:
        running = min(candidate.at_once, candidate.allocations)
        workers = candidate.workers
        ends, last = fill_slots(inputs.runs, running * workers, hold, per_record * workers, drain)
        finished = ends if workers == 1 else [max(ends[a * workers : (a + 1) * workers]) for a in range(running)]
        held, wall = sum(finished), max(finished)
        longest = wall
        # Allocations beyond those the budget runs at once start as one ends and find no shard left.
        waiting = candidate.allocations - running
        if waiting:
            free = sorted(finished)
            for _ in range(waiting):
                begin = heapq.heappop(free)
                heapq.heappush(free, begin + inputs.overhead_s)
                held += inputs.overhead_s
                wall = max(wall, begin + inputs.overhead_s)
    if not inputs.two_stage:
        return held, wall, -1, longest
    latest = max(ends)
    final = min(last[s] for s in range(len(ends)) if ends[s] == latest and last[s] >= 0)
    return held, wall, final, longest


def predict(candidate: Candidate, inputs: CostInputs) -> LayoutChoice:
    """The wall time, GPU-hours and GPU-busy share of ``candidate`` (docs/run-files.md, "How the layout is
    chosen")."""
    gpus = allocation_gpus(candidate.replicas, inputs)
    hold = max((d.load_s for d in inputs.deployments), default=0.0) + inputs.overhead_s
    per_record = record_seconds(candidate, inputs)
    held, wall, last, longest = _allocations(candidate, inputs, hold, per_record)
    allocated = gpus * held
    if inputs.two_stage:
        wall += inputs.shard_records[last] / inputs.cpu_stage_records_per_s + CPU_STAGE_START_S
    records = sum(inputs.shard_records)
    busy = sum(records * d.requests_per_record / d.requests_per_s * d.gpus for d in inputs.deployments)
    return LayoutChoice(
        allocations=candidate.allocations,
        replicas=candidate.replicas,
        client_workers=candidate.workers,
        two_stage=inputs.two_stage,
        gpus_at_once=min(candidate.at_once, candidate.allocations) * gpus,
        wall_s=wall,
        gpu_hours=allocated / 3600,
        gpu_busy=min(1.0, busy / allocated) if allocated > 0 else 0.0,
        allocation_s=longest,
        shard_record_s=per_record * candidate.workers,
    )
