"""Pure compilation of run file + recipe + snapshot + profile into an immutable, hashed plan."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ddslurm.config import (
    ClusterProfile,
    DeploymentPlan,
    Plan,
    ProviderSnapshot,
    RecipeSource,
    ReplicaPlan,
    Resources,
    RunFile,
    RunLayout,
    SeedPlan,
    ServingPlan,
)
from ddslurm.planner._shards import SeedPool, plan_shards
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
    """The builder script the recipe was made from, when it was made by one (provenance)."""


_MEM = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)
_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory_mb(value: str, field: str = "memory") -> int:
    """Slurm memory sizes (``500``, ``500M``, ``16G``, ``1T``; default unit MB) to whole megabytes. ``field`` names
    the setting in error messages (``submission.memory``)."""
    match = _MEM.match(value.strip())
    if not match:
        raise PlanError(f"{field}: {value!r} is not a Slurm size such as 16G or 500M")
    return max(1, math.ceil(float(match.group("n")) * _MB[match.group("unit").upper()]))


def plan_serving(run: RunFile, profile: ClusterProfile, partition: str | None) -> ServingPlan:
    """Place every replica on the one node of the allocation, or say which numbers disagree."""
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
    total = 0
    for index, dep in enumerate(run.deployments):
        tp = dep.tensor_parallel
        where, alias = f"deployments[{index}]", f"(model alias {dep.model_alias!r})"
        if tp > per_node:
            raise PlanError(f"{where}.tensor_parallel: {tp} is more than the {per_node} GPUs of one node {alias}")
        if per_node % tp:
            raise PlanError(f"{where}.tensor_parallel: {tp} does not divide the {per_node} GPUs of a node {alias}")
        if dep.server.port is not None and dep.server.port + dep.replicas - 1 > 65535:
            raise PlanError(f"{where}.server.port: {dep.server.port} + {dep.replicas} replicas exceeds 65535 {alias}")
        replicas = tuple(
            ReplicaPlan(
                index=r,
                gpus=tp,
                cpus=dep.server.cpus,
                port=None if dep.server.port is None else dep.server.port + r,
            )
            for r in range(dep.replicas)
        )
        total += tp * dep.replicas
        deployments.append(
            DeploymentPlan(
                alias=dep.model_alias,
                model=dep.model,
                served_model_name=dep.served_model_name or dep.model,
                tensor_parallel=tp,
                replicas=replicas,
                startup_timeout=dep.server.startup_timeout,
                extra_args=dep.server.extra_args,
                env=dict(dep.server.env),
                proxy=dep.replicas > 1,
                env_from=dep.server.env_from,
            )
        )
    if total > per_node:
        detail = " + ".join(f"{d.alias}: {len(d.replicas)} x {d.tensor_parallel}" for d in deployments)
        raise PlanError(
            f"deployments: the deployments need {total} GPUs ({detail}) but a node has {per_node}; "
            "use fewer replicas or a smaller tensor_parallel (one allocation is one node)"
        )
    return ServingPlan(
        deployments=tuple(deployments),
        gpus=total,
        gpu_request=profile.gpu_request,
        container_runtime=profile.container_runtime,
        vllm_executable=profile.vllm_executable,
        vllm_image=profile.vllm_image,
        container_mounts=profile.container_mounts,
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


def compile_plan(inputs: PlanInputs) -> Plan:
    check_time_limit(inputs.run.submission.time_limit)
    run, profile = inputs.run, inputs.profile
    sub = run.submission
    serving: ServingPlan | None = None
    if run.deployments:
        partition = sub.partition or profile.partition
        serving = plan_serving(run, profile, partition)
        server_cpus = sum(r.cpus for d in serving.deployments for r in d.replicas)
        proxy_cpus = serving.proxy_cpus * sum(1 for d in serving.deployments if d.proxy)
        memory = sub.memory
        if memory is None and profile.memory_per_gpu is not None:
            memory = f"{parse_memory_mb(profile.memory_per_gpu, 'profile.memory_per_gpu') * serving.gpus}M"
        generation = Resources(
            partition=partition,
            account=sub.account or profile.account,
            qos=sub.qos,
            time_minutes=parse_time_limit(sub.time_limit, "submission.time_limit"),
            cpus_per_task=sub.cpus + server_cpus + proxy_cpus,
            memory=memory,
            gres=f"gpu:{serving.gpus}" if serving.gpu_request == "gres" else "none",
            gpus=serving.gpus if serving.gpu_request == "gpus" else None,
            constraint=sub.constraint,
            reservation=sub.reservation,
            extra_sbatch=(*profile.extra_sbatch, *sub.extra_sbatch),
        )
    else:
        generation = Resources(
            partition=sub.partition or profile.cpu_partition or profile.partition,
            account=sub.account or profile.account,
            qos=sub.qos,
            time_minutes=parse_time_limit(sub.time_limit, "submission.time_limit"),
            cpus_per_task=sub.cpus,
            memory=sub.memory,
            gres="none",
            constraint=sub.constraint,
            reservation=sub.reservation,
            extra_sbatch=(*profile.extra_sbatch, *sub.extra_sbatch),
        )
    for field, value in (("submission.memory", sub.memory), ("collection.memory", run.collection.memory)):
        if value is not None:
            parse_memory_mb(value, field)
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
    if run.shards > run.num_records:
        raise PlanError(
            f"shards: {run.shards} shards for {run.num_records} records; every shard needs at least one record"
        )
    layout = inputs.layout
    return Plan(
        run_id=layout.run_id,
        run_name=run.name,
        num_records=run.num_records,
        shards=plan_shards(
            run.num_records,
            run.shards,
            None if inputs.seed is None else SeedPool(inputs.seed.pool_start, inputs.seed.pool_size),
        ),
        seed=inputs.seed,
        resume=run.resume,
        buffer_size=min(run.buffer_size, run.num_records),
        max_concurrent=run.max_concurrent,
        retries=run.retries,
        client_retries=run.client_retries,
        recipe_file=str(layout.recipe),
        recipe_sha256=inputs.recipe_sha256,
        recipe_source=inputs.recipe_source,
        snapshot_file=str(layout.snapshot),
        snapshot_sha256=inputs.snapshot_sha256,
        secret_env=hosted_key_names(inputs.snapshot),
        python_env=profile.python_env,
        generation=generation,
        collection=collection,
        client_cpus=sub.cpus,
        serving=serving,
        max_empty_outputs=run.max_empty_outputs,
        server_secret_env=tuple(sorted({name for dep in run.deployments for name in dep.server.env_from})),
    )


def hosted_key_names(snapshot: ProviderSnapshot) -> tuple[str, ...]:
    """The API-key variables of the hosted providers, sorted: what the submitting shell must export. A local
    provider's key variable names the attempt's own token, which the node makes and only the client holds."""
    return tuple(sorted({p.api_key_env for p in snapshot.providers if p.api_key_env and not p.local}))
