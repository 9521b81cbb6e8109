"""The validation and compilation stage of a submission (:func:`prepare_inputs`): the recipe loaded (a builder
script run in ``python_env``), its aliases resolved into the snapshot, its seed captured, Data Designer's check of
it and of its MCP tools, the workspace's facts and the partition's nodes for the cost model, and the planner's one
compilation of the plan; nothing is written. A refusal names the file, line and field it is about
(:func:`place_error`)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import (
    ConfigError,
    PartitionNodes,
    Plan,
    Prices,
    ProviderSnapshot,
    RecipeSource,
    RunFile,
    RunLayout,
    ServingPlan,
    UnsafePathError,
    check_workspace,
    encode_pretty,
    load_prices,
    sha256_bytes,
)
from ddslurm.launcher.cluster._doctor_checks import field_place
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._python_env import runtime_command, runtime_problem
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.facts._workspace import (
    GpuTypeOf,
    NodesOf,
    PartitionGpuNodes,
    no_gpu_type,
    no_nodes,
    partition_gpu_type,
    partition_nodes,
    workspace_facts,
)
from ddslurm.launcher.submission._aliases import EndpointCheck, refuse_failed_endpoints, run_aliases
from ddslurm.launcher.submission._inputs import SubmitInputs, read_inputs
from ddslurm.launcher.submission._mcp_check import dd_check_tools
from ddslurm.launcher.submission._recipe import StageRequest, script_environment, secret_names
from ddslurm.launcher.submission._recipe_at import place_refusal
from ddslurm.launcher.submission._run_dir import Prepared
from ddslurm.launcher.submission._seed import CountRows, SeedCapture, capture_seed, dd_seed_columns, dd_seed_rows
from ddslurm.launcher.submission._shardable import refuse_unshardable
from ddslurm.launcher.submission._validate import RecipeCheck, dd_check_recipe
from ddslurm.launcher.submission._workflow_stage import stage_run
from ddslurm.planner import (
    PlanError,
    PlanInputs,
    client_serving,
    compile_plan,
)
from ddslurm.providers import (
    Origin,
    ProvidersError,
    ResolutionError,
    placeholder_secrets,
    redact,
    secret_values,
)
from ddslurm.providers.discovery import settings_dir
from ddslurm.runtime import data_parallel_cpus

SeedColumns = Callable[[dict[str, Any]], list[str]]
"""(a seed source on the submit host) -> its column names as Data Designer reads them."""

CheckRecipe = Callable[
    [dict[str, Any], Path, ProviderSnapshot, ServingPlan | None, Path, RecipeSource | None], RecipeCheck
]
"""(recipe, its path, the snapshot, the plan's serving as a client sees it, ``<python_env>/bin/ddslurm-runtime``,
the builder script's record) -> what Data Designer there refuses in it, the columns as it reads them and the
plugins the recipe uses."""

CheckTools = Callable[[dict[str, Any], Origin, ProviderSnapshot, Mapping[str, str], Path, Path, EngineHost], list[str]]
"""(recipe, where it came from, the snapshot, the shell's environment, Data Designer's settings directory,
``<python_env>/bin/ddslurm-runtime``, which lists the tools, the engine host it is asked through) -> what is wrong
with the recipe's MCP tools (a stdio command not found, an ``allow_tools`` entry no provider offers)."""


def new_run_id(name: str, now: datetime) -> str:
    return f"{name}-{now.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


_PLAN_FIELD = re.compile(r"^(?P<field>(?P<profile>profile\.)?[A-Za-z_]+(?:\[\d+\]|\.[A-Za-z_][\w-]*)*): ")


def place_error(message: str, run_path: Path, profile_path: Path) -> str:
    """A refusal that starts with its field (the planner's ``submission.memory: ...``; profile fields
    ``profile.gpus_per_node: ...``), placed at the file, line and column of that field."""
    match = _PLAN_FIELD.match(message)
    if match is None:
        return message
    where, field = field_place(match.group("field"), run_path, profile_path)
    return f"{where}: {field}: {message[match.end() :]}"


def prepare(
    run_path: Path,
    profile_path: Path,
    env: Mapping[str, str],
    now: datetime,
    home: Path | None = None,
    **stages: Any,
) -> Prepared:
    """:func:`prepare_inputs` of the run file and profile read once (:func:`read_inputs`); ``stages``: its
    keyword arguments."""
    return prepare_inputs(read_inputs(run_path, profile_path), env, now, home, **stages)


def prepare_on_cluster(
    inputs: SubmitInputs,
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    home: Path | None = None,
    **stages: Any,
) -> Prepared:
    """:func:`prepare_inputs` as ``submit`` and its dry run call it: with the GPU type and the nodes of the
    generation partition, both from one ``sinfo``; ``stages``: its other keyword arguments."""
    gpu_nodes = PartitionGpuNodes(slurm)
    return prepare_inputs(
        inputs,
        env,
        now,
        home,
        gpu_type_of=partition_gpu_type(gpu_nodes),
        nodes_of=partition_nodes(gpu_nodes),
        **stages,
    )


def prepare_inputs(
    inputs: SubmitInputs,
    env: Mapping[str, str],
    now: datetime,
    home: Path | None = None,
    *,
    count_seed_rows: CountRows = dd_seed_rows,
    host: EngineHost = RUNTIME_PROCESS,
    check_recipe: CheckRecipe | None = None,
    seed_columns: SeedColumns = dd_seed_columns,
    check_tools: CheckTools = dd_check_tools,
    check_endpoints: EndpointCheck | None = None,
    gpu_type_of: GpuTypeOf = no_gpu_type,
    nodes_of: NodesOf = no_nodes,
    stage: StageRequest | None = None,
    calibration: bool = False,
) -> Prepared:
    """Validate and compile everything from ``inputs`` (the run file and profile as read once); touch nothing on
    disk. The planner's cost model gets the workspace's
    facts (``<workspace>/facts.json``; a damaged file is refused, naming it) and, for a run with deployments, the
    GPU type of the generation partition's nodes (``gpu_type_of``: ``sinfo`` for ``submit`` and its dry run; ""
    by default, and whenever it cannot be told) and those nodes (``nodes_of``: the layouts it considers are only
    those they hold). The recipe is loaded (a builder script runs) and
    checked (``check_recipe``, by default Data Designer's own validation asked of ``host``: a process of a few
    seconds) in the profile's ``python_env``, with the local aliases sized as the planner sizes a client
    (:func:`~ddslurm.planner.client_serving`: the node's values); what Data Designer refuses would fail on the
    node, and is reported after the planner's refusals; then its MCP tools (``check_tools``: the stdio servers'
    commands, the tools ``allow_tools`` names, listed in the profile's ``python_env``); with ``check_endpoints``
    (``submit --check-endpoints``), last, what every hosted endpoint answers with the key
    (:func:`~ddslurm.launcher.submission._aliases.refuse_failed_endpoints`). The planner compiles the plan once, whole
    (``calibration``: ``ddslurm tune``'s run, with its calibration levels); nothing amends it afterwards.
    A recipe that is a Data Designer workflow is prepared as its first stage's run, or ``stage``'s
    (:func:`~ddslurm.launcher.submission._workflow_stage.stage_run`)."""
    run, run_path, profile, profile_path = inputs.run, inputs.run_path, inputs.profile, inputs.profile_path
    try:
        problem = runtime_problem(profile.python_env)  # before anything in it runs
        if problem is not None:
            raise SubmitError(place_error(f"profile.python_env: {problem}", run_path, profile_path))
        runtime = runtime_command(profile.python_env)
        loaded, resolution = run_aliases(
            run,
            run_path,
            env,
            settings_dir(env, home),
            runtime=runtime,
            host=host,
            stage=stage,
            run_text=inputs.run_text,
        )
        recipe_path, recipe_bytes, recipe = loaded.path, loaded.stored, loaded.data
        place = None
        if loaded.workflow is not None:  # the run of one of its stages
            run, place = stage_run(run, run_path, profile_path, loaded.workflow, stage)
        refuse_unshardable(recipe, loaded.content_origin())
        if resolution.problems:
            raise ResolutionError(list(resolution.problems))
        snapshot: ProviderSnapshot = resolution.snapshot
        snapshot_bytes = encode_pretty(snapshot)
        refuse_shared_workspace(Path(profile.workspace), run_path, profile_path)
        layout = RunLayout.in_workspace(Path(profile.workspace), new_run_id(run.name, now))
        seed = capture_seed(recipe, recipe_path, layout, count_rows=count_seed_rows)
        if seed is not None:
            recipe_bytes = seed.recipe_bytes
        source = loaded.source_record(layout)
        # Nothing is written yet: the check runs the script itself where the node will run the run's copy of it.
        as_is = None if source is None else msgspec.structs.replace(source, file=source.origin)
        facts, ignored = workspace_facts(Path(profile.workspace))
        partition = run.submission.partition or profile.partition
        gpu_type = _gpu_type(gpu_type_of, partition) if run.deployments else ""
        nodes = _nodes(nodes_of, partition) if run.deployments else None
        recipe_key = sha256_bytes(loaded.stored)
        sized = client_serving(
            run,
            profile,
            facts=facts,
            gpu_type=gpu_type,
            recipe_key=recipe_key,
            seed=None if seed is None else seed.plan,
            nodes=nodes,
        )
        # the shell's secrets (read once): hidden from a builder script's second run, redacted from what it says
        hidden = secret_names(run, env, settings_dir(env, home)) | set(snapshot.secret_env_names())
        if check_recipe is not None:
            check = check_recipe(recipe, recipe_path, snapshot, sized, runtime, as_is)
        else:
            # A builder script run again by the check starts from the environment its first run had.
            scrubbed = script_environment(env, hidden)
            check = dd_check_recipe(
                recipe, recipe_path, snapshot, sized, runtime, as_is, host=host, env=scrubbed, run_config=run.run_config
            )
        seed_cols = seed_column_names(seed, seed_columns)
        plan = compile_plan(
            PlanInputs(
                run=run,
                profile=profile,
                snapshot=snapshot,
                layout=layout,
                recipe_sha256=sha256_bytes(recipe_bytes),
                recipe_key=recipe_key,
                snapshot_sha256=sha256_bytes(snapshot_bytes),
                seed=None if seed is None else seed.plan,
                recipe_source=source,
                recipe=recipe,
                columns=check.columns,
                seed_columns=seed_cols,
                plugins=check.plugins,
                data_designer_version=check.data_designer_version,
                facts=facts,
                gpu_type=gpu_type,
                nodes=nodes,
                prices=run_prices(run, run_path),
                workflow=place,
                # Key values that are placeholders (EMPTY, none) are not secrets: the node does not scan for them.
                placeholder_secret_env=frozenset(placeholder_secrets(snapshot.secret_env_names(), env)),
                calibration=calibration,
            )
        )
    except PlanError as exc:
        raise SubmitError(place_error(str(exc), run_path, profile_path)) from exc
    except (ConfigError, ProvidersError) as exc:
        raise SubmitError(str(exc)) from exc
    if check.run_config:  # the run file's own field, at its place, in Data Designer's words
        fields = [(".".join(("run_config", p.field)).rstrip("."), p.message) for p in check.run_config]
        raise SubmitError("\n".join(place_error(f"{at}: {message}", run_path, profile_path) for at, message in fields))
    if check.problems:
        # What the check (and a builder script it ran again) said, with every secret value of the shell redacted
        shown = secret_values(hidden, env)
        names = seed_cols  # with the recipe's columns, what a template can name
        lines = "\n".join(
            f"  {redact(place_refusal(p, recipe_path, recipe, columns_at=loaded.columns_at, names=names), shown)}"
            for p in check.problems
        )
        raise SubmitError(f"{recipe_path}: Data Designer refuses the recipe:\n{lines}")
    if snapshot.mcp_providers:
        problems = check_tools(recipe, loaded.content_origin(), snapshot, env, settings_dir(env, home), runtime, host)
        if problems:
            raise SubmitError("the recipe's MCP tools cannot be used:\n" + "\n".join(f"  {p}" for p in problems))
    if check_endpoints is not None:  # last: it asks every hosted endpoint over the network
        resolution = refuse_failed_endpoints(resolution, env, check_endpoints)
    return Prepared(
        layout,
        plan,
        inputs.run_bytes,
        recipe_bytes,
        snapshot_bytes,
        resolution.rows,
        seed,
        loaded.source,
        (*(() if ignored is None else (ignored,)), *data_parallel_warnings(plan, run, run_path, profile_path)),
    )


def data_parallel_warnings(plan: Plan, run: RunFile, run_path: Path, profile_path: Path) -> tuple[str, ...]:
    """A vLLM deployment with data parallel whose ``server.cpus`` is below the processes it keeps busy on its
    leader's node (one API server per data-parallel rank by default, and an engine core per rank there:
    :func:`ddslurm.runtime.data_parallel_cpus`), placed at that field: the engine runs, slower, on too few CPUs."""
    if plan.serving is None:
        return ()
    warnings: list[str] = []
    for dep in plan.serving.deployments:
        busy = data_parallel_cpus(dep)
        index = next((i for i, d in enumerate(run.deployments) if d.model_alias == dep.alias), None)
        if busy is None or index is None:
            continue
        where, field = field_place(f"deployments[{index}].server.cpus", run_path, profile_path)
        warnings.append(
            f"{where}: {field}: {dep.replicas[0].cpus} CPUs for {dep.alias!r}, whose vLLM runs {busy} busy "
            f"processes on its first node with data_parallel {dep.data_parallel} (an API server per data-parallel "
            "rank unless server.extra_args sets --api-server-count, and an engine core per rank there); raise "
            f"server.cpus to {busy}, or pass --api-server-count 1"
        )
    return tuple(warnings)


def refuse_shared_workspace(workspace: Path, run_path: Path, profile_path: Path) -> None:
    """A workspace (or its ``runs/``) another user can write, sticky or not, refused at the profile's
    ``workspace`` before anything in it is read (:func:`~ddslurm.config.check_workspace`)."""
    try:
        check_workspace(workspace)
    except UnsafePathError as exc:
        raise SubmitError(place_error(f"profile.workspace: {exc}", run_path, profile_path)) from None


def run_prices(run: RunFile, run_path: Path) -> Prices | None:
    """The run file's price file (``prices``, relative to the run file), read; None when it names none. A file
    that is not there is refused at the run file's ``prices`` field, a bad one at its own line."""
    if run.prices is None:
        return None
    path = run_path.parent / run.prices
    if not path.is_file():
        where, field = field_place("prices", run_path, run_path)
        raise ConfigError(f"{where}: {field}: no price file {path}")
    return load_prices(path)


def _nodes(nodes_of: NodesOf, partition: str | None) -> PartitionNodes | None:
    """The partition's GPU nodes; None when they cannot be told (never fatal: no layout is ruled out by them)."""
    try:
        return nodes_of(partition)
    except Exception:
        return None


def _gpu_type(gpu_type_of: GpuTypeOf, partition: str | None) -> str:
    """The partition's GPU type; "" when it cannot be told (never fatal: the facts are then untyped)."""
    try:
        return gpu_type_of(partition)
    except Exception:
        return ""


def seed_column_names(seed: SeedCapture | None, seed_columns: SeedColumns) -> tuple[str, ...]:
    """The seed dataset's columns as Data Designer reads them (the planner orders the dataset's columns by them);
    none without a seed dataset."""
    if seed is None or seed.source is None:
        return ()
    try:
        return tuple(seed_columns(seed.source))
    except Exception as exc:
        raise SubmitError(f"Data Designer cannot read the seed dataset's columns: {exc}") from exc
