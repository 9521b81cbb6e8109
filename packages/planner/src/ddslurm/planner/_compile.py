"""Pure compilation of run file + recipe + snapshot + profile into an immutable, hashed plan."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    DeploymentPlan,
    Engine,
    Facts,
    PartitionNodes,
    Plan,
    PluginRecord,
    Prediction,
    Prices,
    ProviderSnapshot,
    RecipeColumn,
    RecipeSource,
    ReplicaPlan,
    Resources,
    RunFile,
    RunLayout,
    SeedPlan,
    ServingPlan,
    ShardSpec,
    WorkflowPlace,
    calibration_levels,
)
from ddslurm.planner._batches import plan_batches
from ddslurm.planner._choose import choose
from ddslurm.planner._cost import (
    CostSources,
    NodeMemory,
    allocation_gpus,
    client_cpus,
    cost_inputs,
    node_cpus,
    proxies_cpus,
)
from ddslurm.planner._cpu_stage import cpu_stage_workers
from ddslurm.planner._shards import plan_shards
from ddslurm.planner._spend import forecast_spend
from ddslurm.planner._stages import plan_stages
from ddslurm.planner.errors import PlanError

_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


def parse_time_limit(value: str | int, field: str = "time_limit") -> int:
    """Slurm time formats to whole minutes (rounded up, as Slurm does): ``90``, ``1:30:00``, ``2-00:00:00``.
    ``field`` names the setting in error messages (``submission.time_limit``)."""
    if isinstance(value, int):
        if value < 1:
            raise PlanError(f"{field}: must be at least 1 minute, got {value}")
        return value
    match = _TIME.match(value.strip())
    if not match:
        raise PlanError(f"{field}: {value!r} is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)")
    days = int(match.group("days") or 0)
    parts = [int(p) for p in (match.group("a"), match.group("b"), match.group("c")) if p is not None]
    if match.group("days") is not None:
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = 0, parts[0], 0
    total = days * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)
    if total < 1:
        raise PlanError(f"{field}: {value!r} is shorter than one minute")
    return total


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything the compiler reads; digests are of the copies stored in the run's inputs."""

    run: RunFile
    profile: ClusterProfile
    snapshot: ProviderSnapshot
    layout: RunLayout
    recipe_sha256: str
    snapshot_sha256: str
    seed: SeedPlan | None = None
    """The recipe's seed dataset as captured into the run's inputs (its rows decide the shards' seed blocks)."""
    recipe_source: RecipeSource | None = None
    """The builder script the recipe was made from, when it was made by one."""
    plugins: tuple[PluginRecord, ...] = ()
    """The Data Designer plugins the recipe uses, as the profile's ``python_env`` has them."""
    data_designer_version: str = ""
    """The Data Designer version of the profile's ``python_env`` (``Plan.data_designer_version``)."""
    workflow: WorkflowPlace | None = None
    """For a stage of a Data Designer workflow: its place (``Plan.workflow``)."""
    recipe: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The recipe as stored in the run's inputs (the stage split reads its processors and profilers)."""
    columns: tuple[RecipeColumn, ...] | None = None
    """The recipe's columns as Data Designer reads them, in recipe order (the stage split and the final column
    order are planned from them); None: not read (columns Data Designer refuses)."""
    seed_columns: tuple[str, ...] = ()
    """The seed dataset's columns, in its order (they lead the final column order)."""
    facts: Facts = dataclasses.field(default_factory=Facts)
    """What earlier runs and calibrations of the workspace measured (the cost model's inputs)."""
    gpu_type: str = ""
    """The GPU type of the generation partition's nodes (``sinfo``); empty: untyped or unknown."""
    recipe_key: str = ""
    """The recipe's digest before its seed is pointed at the run's copy (``Plan.recipe_key``)."""
    nodes: PartitionNodes | None = None
    """The generation partition's GPU nodes (``sinfo``): the cost model considers only layouts they hold (their
    CPUs, their number at once); None: unknown."""
    prices: Prices | None = None
    """The run file's price file, read (``Plan.prices``)."""
    placeholder_secret_env: frozenset[str] = frozenset()
    """Secret variables whose value in the submitting shell is a placeholder (``EMPTY``, ``none``): not secrets,
    so the node does not scan its output for them (``Plan.secret_env_unscanned``)."""
    calibration: bool = False
    """A calibration run (``ddslurm tune``): the plan's ``calibrate`` levels, 1, 2, 4 ... up to each deployment's
    capacity, every capacity too."""


_MEM = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)
_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory_mb(value: str, field: str = "memory") -> int:
    """Slurm memory sizes (``500``, ``500M``, ``16G``, ``1T``; default unit MB) to whole megabytes. ``field`` names
    the setting in error messages (``submission.memory``)."""
    match = _MEM.match(value.strip())
    if not match:
        raise PlanError(f"{field}: {value!r} is not a Slurm size such as 16G or 500M")
    return max(1, math.ceil(float(match.group("n")) * _MB[match.group("unit").upper()]))


VLLM_DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's ``max_num_seqs`` when ``--max-num-seqs`` is not given: what one replica runs at once (the rest queue).

Source: ``EngineArgs._set_default_args`` in ``vllm/engine/arg_utils.py`` of vllm-project/vllm (the 0.11 series,
commit 99d7eb5d6a51): for ``UsageContext.OPENAI_API_SERVER`` (``vllm serve``) ``default_max_num_seqs`` is 256 on
GPUs, raised to 1024 on GPUs with at least 70 GiB that are not A100s ("For GPUs like H100 and MI300x"), and
128 x world size on CPUs; ``SchedulerConfig``'s own fallback (128) applies only outside these usage contexts.

The submit host cannot tell which GPUs a node has, so the planner takes the general GPU value, 256. On a larger
GPU the client then keeps 256 requests per replica in flight where the server would run 1024 (set
``--max-num-seqs`` in ``server.extra_args`` to use them); it never sends more than the server runs, so no request
waits in vLLM's queue while Data Designer's per-request timeout runs."""


CAPACITY_FLAGS: dict[Engine, str] = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}
"""The flag that sets the sequences one engine rank runs at once. SGLang sizes its own from the GPUs' memory when
the flag is not given; the submit host cannot know it, so ddslurm assumes :data:`VLLM_DEFAULT_MAX_NUM_SEQS` for
both engines unless the flag is in ``server.extra_args``."""


def server_capacity(extra_args: tuple[str, ...], field: str = "server.extra_args", engine: Engine = "vllm") -> int:
    """Sequences one engine rank runs at once: the last ``--max-num-seqs N`` or ``--max-num-seqs=N`` (vLLM; its
    parser also takes ``--max_num_seqs``), or ``--max-running-requests`` (SGLang), in ``extra_args`` (the last one
    wins, as in argparse), else :data:`VLLM_DEFAULT_MAX_NUM_SEQS`. ``field`` names the setting in error
    messages."""
    flag = CAPACITY_FLAGS[engine]
    capacity = VLLM_DEFAULT_MAX_NUM_SEQS
    for index, token in enumerate(extra_args):
        name, inline, value = token.partition("=")
        if (name.replace("_", "-") if engine == "vllm" else name) != flag:
            continue
        if not inline:
            value = extra_args[index + 1] if index + 1 < len(extra_args) else ""
        try:
            capacity = int(value)
        except ValueError:
            capacity = 0
        if capacity < 1:
            raise PlanError(f"{field}: {name} needs a whole number of at least 1, got {value!r}")
    return capacity


def _shape(dep: Deployment) -> str:
    """``tensor_parallel 4 x pipeline_parallel 2 = 8 GPUs`` (the factors that are not 1, tensor parallel always)."""
    factors = [f"tensor_parallel {dep.tensor_parallel}"]
    factors += [f"pipeline_parallel {dep.pipeline_parallel}"] * (dep.pipeline_parallel > 1)
    factors += [f"data_parallel {dep.data_parallel}"] * (dep.data_parallel > 1)
    gpus = dep.tensor_parallel * dep.pipeline_parallel * dep.data_parallel
    return f"{' x '.join(factors)} = {gpus} GPU{'s' if gpus > 1 else ''}"


def _replica_nodes(run: RunFile, index: int, per_node: int) -> int:
    """The nodes one replica of ``run.deployments[index]`` spans (1: it fits on a node), or PlanError with the
    numbers when its shape cannot be placed on whole nodes."""
    dep = run.deployments[index]
    tp, pp, dp = dep.tensor_parallel, dep.pipeline_parallel, dep.data_parallel
    where, alias = f"deployments[{index}]", f"(model alias {dep.model_alias!r})"
    if tp > per_node:
        raise PlanError(
            f"{where}.tensor_parallel: {tp} is more than the {per_node} GPUs of one node {alias}; tensor parallel "
            "never crosses a node: use pipeline_parallel or data_parallel for a replica bigger than a node"
        )
    if per_node % tp:
        raise PlanError(f"{where}.tensor_parallel: {tp} does not divide the {per_node} GPUs of a node {alias}")
    gpus = tp * pp * dp
    if dep.expert_parallel and gpus == 1:
        raise PlanError(
            f"{where}.expert_parallel: true, but one replica has 1 GPU ({_shape(dep)}) {alias}; expert parallel "
            "shards the experts over a replica's GPUs: set tensor_parallel or data_parallel above 1, or remove it"
        )
    if gpus <= per_node:
        return 1
    if gpus % per_node:
        raise PlanError(
            f"{where}: one replica needs {_shape(dep)}, more than the {per_node} GPUs of a node and not a whole "
            f"number of nodes ({gpus} / {per_node} = {gpus / per_node:.2f}) {alias}; a replica bigger than a node "
            f"spans whole nodes: make its GPUs a multiple of {per_node}"
        )
    nodes = gpus // per_node
    if dp > 1 and pp > 1:
        raise PlanError(
            f"{where}.data_parallel: {dp} with pipeline_parallel {pp} in a replica that spans {nodes} nodes "
            f"({_shape(dep)}, {per_node} a node) {alias}; a replica across nodes is either pipeline parallel or "
            "data parallel: set one of them to 1"
        )
    if dp > 1 and dep.engine == "sglang":
        raise PlanError(
            f"{where}.data_parallel: {dp} in an SGLang replica that spans {nodes} nodes ({_shape(dep)}, {per_node} "
            f"a node) {alias}; SGLang runs data parallel across nodes only with DP attention (--enable-dp-attention), "
            "where its ranks split one tensor-parallel group instead of each holding tensor_parallel GPUs. Use "
            "pipeline_parallel to span nodes, data_parallel within one node, or engine: vllm"
        )
    # Each node runs data_parallel / nodes ranks of tensor_parallel GPUs, a whole number: tensor_parallel divides
    # the node's GPUs, so data_parallel = (gpus_per_node / tensor_parallel) x nodes.
    if declared_replicas(dep) > 1:
        field, alone = f"{where}.replicas", f"it has replicas: {dep.replicas}"
    elif len(run.deployments) > 1:
        others = ", ".join(repr(d.model_alias) for i, d in enumerate(run.deployments) if i != index)
        field, alone = "deployments", f"the run also deploys {others}"
    else:
        return nodes
    raise PlanError(
        f"{field}: a replica of {dep.model_alias!r} spans "
        f"{nodes} nodes ({_shape(dep)}, {per_node} a node), so it must be the allocation's only replica, but "
        f"{alone}. Every endpoint and every replica's API is served from the allocation's first node, on "
        "sockets and loopback ports no other user can reach; a replica whose API ran on another node would "
        "need a listener other users could reach first. Use allocations: K to run K such replicas (one an "
        "allocation, each pulling shards), or data_parallel to run several engine ranks behind one API, and "
        "serve the other models in their own run"
    )


def declared_replicas(dep: Deployment) -> int:
    """The replicas per allocation a deployment asks for: its number, or 1 for ``replicas: auto``."""
    return 1 if dep.replicas == "auto" else dep.replicas


def plan_serving(
    run: RunFile, profile: ClusterProfile, partition: str | None, counts: Sequence[int] | None = None
) -> ServingPlan:
    """Place the replicas on the allocation's nodes, or say which numbers disagree. ``counts``: each
    deployment's replicas per allocation as the layout chose them (None: as declared, ``auto`` 1).

    A replica of ``tensor_parallel x pipeline_parallel x data_parallel`` GPUs that fits on a node gets one step of
    that many GPUs, and all such replicas of the run share the allocation's one node. A bigger replica spans
    ``GPUs / gpus_per_node`` whole nodes, one step of all the node's GPUs on each, and is the allocation's only
    replica (its API, like every endpoint, on the first node)."""
    per_node = profile.gpus_per_node
    if per_node == 0:
        raise PlanError(
            "profile.gpus_per_node: 0, but the run deploys models (deployments); set the GPUs of a node of the "
            "profile's partition"
        )
    if partition is not None and partition == profile.cpu_partition and partition != profile.partition:
        raise PlanError(
            f"submission.partition: {partition!r} is the profile's CPU-only partition, but the run deploys models "
            "that need GPUs; use a GPU partition"
        )
    deployments: list[DeploymentPlan] = []
    total, nodes = 0, 1
    for index, dep in enumerate(run.deployments):
        where, alias = f"deployments[{index}]", f"(model alias {dep.model_alias!r})"
        spans = _replica_nodes(run, index, per_node)
        count = declared_replicas(dep) if counts is None else counts[index]
        if dep.server.port is not None and dep.server.port + count - 1 > 65535:
            raise PlanError(f"{where}.server.port: {dep.server.port} + {count} replicas exceeds 65535 {alias}")
        gpus = dep.tensor_parallel * dep.pipeline_parallel * dep.data_parallel
        step_gpus = gpus if spans == 1 else per_node
        replicas = tuple(
            ReplicaPlan(
                index=r,
                gpus=step_gpus,
                cpus=dep.server.cpus,
                port=None if dep.server.port is None else dep.server.port + r,
                nodes=spans,
            )
            for r in range(count)
        )
        total += step_gpus * count
        nodes = max(nodes, spans)
        capacity = dep.data_parallel * server_capacity(dep.server.extra_args, f"{where}.server.extra_args", dep.engine)
        deployments.append(
            DeploymentPlan(
                alias=dep.model_alias,
                model=dep.model,
                served_model_name=dep.served_name,
                tensor_parallel=dep.tensor_parallel,
                replicas=replicas,
                startup_timeout=dep.server.startup_timeout,
                restarts=dep.server.restarts,
                extra_args=dep.server.extra_args,
                env=dict(dep.server.env),
                proxy=True,
                # SGLang has no Unix-domain socket option: a loopback port, planned per job unless server.port.
                listen="tcp" if dep.server.port is not None or dep.engine == "sglang" else "unix",
                env_from=dep.server.env_from,
                capacity=capacity,
                max_parallel_requests=count * capacity,
                engine=dep.engine,
                pipeline_parallel=dep.pipeline_parallel,
                data_parallel=dep.data_parallel,
                expert_parallel=dep.expert_parallel,
            )
        )
    if total > per_node:
        detail = " + ".join(f"{d.alias}: {len(d.replicas)} x {d.replica_gpus}" for d in deployments)
        raise PlanError(
            f"deployments: the deployments need {total} GPUs ({detail}) but a node has {per_node} (replicas x "
            "GPUs of a replica; replicas that fit on a node share the allocation's one node): use fewer replicas "
            "or smaller ones, or more allocations (allocations: K, each with its own replicas)"
        )
    return ServingPlan(
        deployments=tuple(deployments),
        gpus=total,
        gpu_request=profile.gpu_request,
        container_runtime=profile.container_runtime,
        vllm_executable=profile.vllm_executable,
        vllm_image=profile.vllm_image,
        container_mounts=profile.container_mounts,
        nodes=nodes,
        sglang_executable=profile.sglang_executable,
        sglang_image=profile.sglang_image,
    )


MIN_TIME_LIMIT_MINUTES = 2
SLURM_SIGNAL_SLACK_S = 60
"""Slurm may send the time-limit warning (``#SBATCH --signal=B:USR1@N``) up to this much earlier than asked."""


def check_time_limit(value: str | int) -> int:
    """The generation time limit in minutes, refused when it leaves no useful time: Slurm's time-limit warning
    may arrive up to a minute early, and the attempt stops generating when it does."""
    minutes = parse_time_limit(value, "submission.time_limit")
    if minutes < MIN_TIME_LIMIT_MINUTES:
        raise PlanError(
            f"submission.time_limit: {value!r} is {minutes} minute(s); at least {MIN_TIME_LIMIT_MINUTES} are "
            f"needed, because Slurm may send the time-limit warning up to {SLURM_SIGNAL_SLACK_S} s early and the "
            "attempt stops generating when it arrives"
        )
    return minutes


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


def _layout_of(inputs: PlanInputs, two_stage: bool) -> Layout:
    run = inputs.run
    return plan_layout(
        run,
        inputs.profile,
        CostSources(
            facts=inputs.facts,
            gpu_type=inputs.gpu_type,
            recipe_key=inputs.recipe_key or inputs.recipe_sha256,
            columns=inputs.columns,
            shard_records=tuple(s.num_records for s in _shards(run, inputs.seed)),
            two_stage=two_stage,
            nodes=inputs.nodes,
            memory=node_memory(run, inputs.profile),
        ),
    )


def _shards(run: RunFile, seed: SeedPlan | None) -> tuple[ShardSpec, ...]:
    if run.shards > run.num_records:
        raise PlanError(
            f"shards: {run.shards} shards for {run.num_records} records; every shard needs at least one record"
        )
    return plan_shards(run.num_records, run.shards, None if seed is None else seed.pool)


def client_serving(
    run: RunFile,
    profile: ClusterProfile,
    *,
    facts: Facts | None = None,
    gpu_type: str = "",
    recipe_key: str = "",
    seed: SeedPlan | None = None,
    nodes: PartitionNodes | None = None,
) -> ServingPlan | None:
    """The plan's ``serving`` as each client step sees it (its share of the replicas' capacity), before the rest
    is planned: what the submit-time check of the recipe sizes the local aliases' requests with. Given the
    facts, GPU type, recipe facts key, seed and nodes that :func:`compile_plan` gets, it is that plan's ``serving``
    for a recipe whose columns are not known yet (requests per record from the facts, else 1 per alias; one
    stage)."""
    if not run.deployments:
        return None
    sources = CostSources(
        facts=facts or Facts(),
        gpu_type=gpu_type,
        recipe_key=recipe_key,
        columns=None,
        shard_records=tuple(s.num_records for s in _shards(run, seed)),
        two_stage=False,
        nodes=nodes,
        memory=node_memory(run, profile),
    )
    return plan_layout(run, profile, sources).serving


def check_hosted_limits(run: RunFile, snapshot: ProviderSnapshot) -> None:
    """Each ``hosted_limits`` entry names a hosted provider the run's aliases use; :class:`PlanError` otherwise,
    starting with its field (placed in the run file by the launcher)."""
    hosted = sorted({p.name for p in snapshot.providers if not p.local})
    for name in run.hosted_limits:
        if name not in hosted:
            used = ", ".join(hosted) if hosted else "none: no alias of the run is hosted"
            raise PlanError(
                f"hosted_limits.{name}: no hosted alias of the run uses provider {name!r} (the hosted providers it "
                f"uses: {used})"
            )


def compile_plan(inputs: PlanInputs) -> Plan:
    check_time_limit(inputs.run.submission.time_limit)
    run, profile = inputs.run, inputs.profile
    sub = run.submission
    for field, value in (("submission.memory", sub.memory), ("collection.memory", run.collection.memory)):
        if value is not None:
            parse_memory_mb(value, field)
    check_hosted_limits(run, inputs.snapshot)
    secret_env = hosted_key_names(inputs.snapshot)
    staging = plan_stages(run, inputs.recipe, inputs.columns, inputs.seed_columns)
    stages = staging.stages
    shards = _shards(run, inputs.seed)
    chosen = _layout_of(inputs, two_stage=bool(stages))
    serving = chosen.serving
    generation = _gpu_resources(run, profile, serving) if serving is not None else _cpu_resources(run, profile)
    col = run.collection
    collection = Resources(
        partition=col.partition or profile.cpu_partition or profile.partition,
        account=sub.account or profile.account,
        time_minutes=parse_time_limit(col.time_limit, "collection.time_limit"),
        cpus_per_task=col.cpus,
        memory=col.memory,
        gres="none",
        extra_sbatch=profile.extra_sbatch,
    )
    layout = inputs.layout
    allocations = chosen.allocations
    predicted = chosen.prediction.chosen.shard_record_s if chosen.prediction is not None else None
    buffer_size, batching = plan_batches(run.buffer_size, [s.num_records for s in shards], predicted)
    return Plan(
        run_id=layout.run_id,
        run_name=run.name,
        num_records=run.num_records,
        shards=shards,
        seed=inputs.seed,
        resume=run.resume,
        buffer_size=buffer_size,
        max_concurrent=chosen.max_concurrent,
        allocations=allocations.count,
        client_workers=allocations.workers,
        retries=run.retries,
        client_retries=run.client_retries,
        provider_wait_s=run.provider_wait,
        hosted_limits=dict(run.hosted_limits),
        run_config=dict(run.run_config),
        prices=inputs.prices,
        recipe_file=str(layout.recipe),
        recipe_sha256=inputs.recipe_sha256,
        recipe_key=inputs.recipe_key,
        recipe_source=inputs.recipe_source,
        plugins=tuple(sorted(inputs.plugins, key=lambda p: p.name)),
        data_designer_version=inputs.data_designer_version,
        workflow=inputs.workflow,
        snapshot_file=str(layout.snapshot),
        snapshot_sha256=inputs.snapshot_sha256,
        secret_env=secret_env,
        secret_env_unscanned=tuple(n for n in secret_env if n in inputs.placeholder_secret_env),
        python_env=profile.python_env,
        generation=generation,
        collection=collection,
        client_cpus=allocations.client_cpus,
        serving=serving,
        max_empty_outputs=run.max_empty_outputs,
        server_secret_env=tuple(sorted({name for dep in run.deployments for name in dep.server.env_from})),
        stages=stages,
        stage_reason=staging.reason,
        cpu_stage=_cpu_resources(run, profile, cpu_partition_only=True) if stages else None,
        cpu_stage_workers=cpu_stage_workers(run, stages),
        column_order=staging.column_order,
        calibrate=calibration_levels_of(serving) if inputs.calibration else (),
        gpu_type=inputs.gpu_type,
        prediction=chosen.prediction,
        batching=batching,
        spend=forecast_spend(
            run.num_records,
            inputs.snapshot,
            inputs.facts.recipe(inputs.recipe_key or inputs.recipe_sha256),
            inputs.prices,
            prediction=chosen.prediction,
            generation=generation,
            gpus=serving.gpus if serving is not None else 0,
        ),
    )


def calibration_levels_of(serving: ServingPlan | None) -> tuple[int, ...]:
    """A calibration run's levels (``Plan.calibrate``): 1, 2, 4 ... up to each deployment's capacity, every
    capacity too; :class:`PlanError` for a run without deployments, which has nothing to calibrate."""
    if serving is None:
        raise PlanError("deployments: a calibration run needs a deployment to measure")
    capacities = {d.capacity or 1 for d in serving.deployments}
    return tuple(sorted({level for c in capacities for level in calibration_levels(c)}))


def node_memory(run: RunFile, profile: ClusterProfile) -> NodeMemory:
    """What a GPU allocation's node asks for of memory: ``submission.memory``, else the profile's
    ``memory_per_gpu`` x its GPUs (one rule for ``--mem`` and for the layouts a node holds)."""
    fixed = run.submission.memory
    if fixed is not None:
        return NodeMemory(fixed_mb=parse_memory_mb(fixed, "submission.memory"))
    if profile.memory_per_gpu is not None:
        return NodeMemory(per_gpu_mb=parse_memory_mb(profile.memory_per_gpu, "profile.memory_per_gpu"))
    return NodeMemory()


def _gpu_resources(run: RunFile, profile: ClusterProfile, serving: ServingPlan) -> Resources:
    """Each node of a GPU allocation: ``--gres``/``--gpus``, ``--cpus-per-task`` and ``--mem`` are what every node
    gets; the first node (client, proxies, leaders) needs the most, and Slurm gives every node the same."""
    sub = run.submission
    server_cpus = (r.cpus for d in serving.deployments for r in d.replicas)
    memory = sub.memory
    if memory is None and (per_node := node_memory(run, profile).of(serving.gpus)) is not None:
        memory = f"{per_node}M"
    return Resources(
        partition=sub.partition or profile.partition,
        nodes=serving.nodes,
        account=sub.account or profile.account,
        qos=sub.qos,
        time_minutes=parse_time_limit(sub.time_limit, "submission.time_limit"),
        cpus_per_task=node_cpus(sub.cpus, server_cpus, proxies_cpus(serving)),
        memory=memory,
        gres=f"gpu:{serving.gpus}" if serving.gpu_request == "gres" else "none",
        gpus=serving.gpus if serving.gpu_request == "gpus" else None,
        constraint=sub.constraint,
        reservation=sub.reservation,
        extra_sbatch=(*profile.extra_sbatch, *sub.extra_sbatch),
    )


def _cpu_resources(run: RunFile, profile: ClusterProfile, *, cpu_partition_only: bool = False) -> Resources:
    """A CPU-only allocation: a hosted-only run's generation, or a two-stage run's CPU stage (always on the
    profile's CPU partition, whatever ``submission.partition`` names for the GPU stage)."""
    sub = run.submission
    partition = profile.cpu_partition or profile.partition if cpu_partition_only else None
    return Resources(
        partition=partition or sub.partition or profile.cpu_partition or profile.partition,
        account=sub.account or profile.account,
        qos=sub.qos,
        time_minutes=parse_time_limit(sub.time_limit, "submission.time_limit"),
        cpus_per_task=sub.cpus,
        memory=sub.memory,
        gres="none",
        constraint=None if cpu_partition_only else sub.constraint,
        reservation=sub.reservation,
        extra_sbatch=(*profile.extra_sbatch, *sub.extra_sbatch),
    )


def hosted_key_names(snapshot: ProviderSnapshot) -> tuple[str, ...]:
    """The API-key variables of the hosted providers and of the MCP providers, sorted: what the submitting shell
    must export. A local provider's key variable names the attempt's own token, which the node makes and only the
    client holds."""
    hosted = {p.api_key_env for p in snapshot.providers if p.api_key_env and not p.local}
    return tuple(sorted(hosted | {*snapshot.mcp_secret_env_names()}))
