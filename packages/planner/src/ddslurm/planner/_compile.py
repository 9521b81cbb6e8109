"""Pure compilation of run file + recipe + snapshot + profile into an immutable, hashed plan."""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddslurm.config import (
    ClusterProfile,
    Facts,
    PartitionNodes,
    Plan,
    PluginRecord,
    Prices,
    ProviderSnapshot,
    RecipeColumn,
    RecipeSource,
    Resources,
    RunFile,
    RunLayout,
    SeedPlan,
    ServingPlan,
    ShardSpec,
    WorkflowPlace,
    calibration_levels,
)
from ddslurm.planner._allocations import Layout, node_memory, plan_layout
from ddslurm.planner._batches import plan_batches
from ddslurm.planner._cost import CostSources, node_cpus, proxies_cpus
from ddslurm.planner._cpu_stage import cpu_stage_workers
from ddslurm.planner._shards import plan_shards
from ddslurm.planner._slurm_units import check_time_limit, parse_memory_mb, parse_time_limit
from ddslurm.planner._spend import forecast_spend
from ddslurm.planner._stages import plan_stages
from ddslurm.planner.errors import PlanError


def ddslurm_version() -> str:
    """The installed ddslurm's version (its planner's distribution, the same in every package of the workspace);
    empty when it is not installed as a distribution."""
    try:
        return importlib.metadata.version("ddslurm-planner")
    except importlib.metadata.PackageNotFoundError:
        return ""


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
        ddslurm_version=ddslurm_version(),
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
