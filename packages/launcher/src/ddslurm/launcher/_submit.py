"""Submission: capture inputs, compile the plan, check the scheduler's limits, write the run directory, sbatch
the arrays.

Everything that can be wrong with the inputs, and whether the arrays fit in the scheduler's limits, is checked
before the run directory is created, so a refused submission changes nothing on disk. The arrays are written
(``submit-plan.json``) before the first sbatch and each is recorded as it is submitted, so a submission that
stops part-way is an explicit state of the run (``ddslurm submit --continue`` finishes it).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import (
    ConfigError,
    LockHeldError,
    PartitionNodes,
    Plan,
    PlannedArray,
    Prices,
    ProviderSnapshot,
    RecipeSource,
    RunFile,
    RunLayout,
    SchedulerLimits,
    ServingPlan,
    SubmissionKind,
    SubmissionRecord,
    UnsafePathError,
    atomic_write,
    check_workspace,
    compact_ranges,
    encode,
    encode_pretty,
    exclusive_lock,
    load_prices,
    publish_once,
    sha256_bytes,
)
from ddslurm.launcher._aliases import EndpointCheck, refuse_failed_endpoints, run_aliases
from ddslurm.launcher._doctor_checks import check_jobs, check_profile_first, field_place
from ddslurm.launcher._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher._facts import (
    GpuTypeOf,
    NodesOf,
    PartitionGpuNodes,
    no_gpu_type,
    no_nodes,
    partition_gpu_type,
    partition_nodes,
    workspace_facts,
)
from ddslurm.launcher._mcp_check import dd_check_tools
from ddslurm.launcher._python_env import runtime_command, runtime_problem
from ddslurm.launcher._recipe import StageRequest, script_environment, secret_names
from ddslurm.launcher._recipe_at import place_refusal
from ddslurm.launcher._render import render_generation
from ddslurm.launcher._run_dir import NOTHING_LEFT, Prepared, write_run_dir
from ddslurm.launcher._seed import CountRows, SeedCapture, capture_seed, dd_seed_columns, dd_seed_rows
from ddslurm.launcher._shardable import refuse_unshardable
from ddslurm.launcher._slurm import Slurm, SlurmTimeoutError
from ddslurm.launcher._submit_inputs import SubmitInputs, read_inputs
from ddslurm.launcher._validate import RecipeCheck, dd_check_recipe
from ddslurm.launcher._workflow_stage import stage_run
from ddslurm.launcher.errors import LauncherError, SlurmError, SubmitError, WriteError
from ddslurm.planner import (
    LimitError,
    PlanError,
    PlanInputs,
    SubmissionPlan,
    array_tasks,
    batch_warnings,
    client_serving,
    compile_plan,
    failure_chain,
    plan_submission,
    plural,
)
from ddslurm.providers import (
    AliasRow,
    Origin,
    ProvidersError,
    ResolutionError,
    missing_env,
    placeholder_secrets,
    redact,
    secret_values,
)
from ddslurm.providers.discovery import settings_dir

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


@dataclass(frozen=True, slots=True)
class Submitted:
    layout: RunLayout
    plan: Plan
    job_id: str
    aliases: tuple[AliasRow, ...]
    job_ids: tuple[str, ...] = ()
    arrays: tuple[PlannedArray, ...] = ()
    warnings: tuple[str, ...] = ()


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
    (:func:`~ddslurm.launcher._aliases.refuse_failed_endpoints`). The planner compiles the plan once, whole
    (``calibration``: ``ddslurm tune``'s run, with its calibration levels); nothing amends it afterwards.
    A recipe that is a Data Designer workflow is prepared as its first stage's run, or ``stage``'s
    (:func:`~ddslurm.launcher._workflow_stage.stage_run`)."""
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
        refuse_unshardable(recipe, loaded.origin)
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
        lines = "\n".join(f"  {redact(place_refusal(p, recipe_path, recipe), shown)}" for p in check.problems)
        raise SubmitError(f"{recipe_path}: Data Designer refuses the recipe:\n{lines}")
    if snapshot.mcp_providers:
        problems = check_tools(recipe, Origin(loaded.origin), snapshot, env, settings_dir(env, home), runtime, host)
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
        () if ignored is None else (ignored,),
    )


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


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """What the planner refuses while planning a submission's arrays (they do not fit the scheduler's limits) is
    the launcher's :class:`SubmitError`, with the planner's numbers."""
    try:
        yield
    except LimitError as exc:
        raise SubmitError(str(exc)) from exc


def check_environment(plan: Plan, env: Mapping[str, str]) -> None:
    """Every variable the jobs get by name (API keys, ``server.env_from``) is set in the submitting shell."""
    missing = missing_env(list(plan.secret_env), env)
    if missing:
        raise SubmitError(
            f"API-key variable(s) {', '.join(missing)} are unset or empty in this shell; the run's providers "
            "need them (export them and try again)"
        )
    missing = missing_env(list(plan.server_secret_env), env)
    if missing:
        raise SubmitError(
            f"variable(s) {', '.join(missing)} named by server.env_from are unset or empty in this shell; the run's "
            "model servers need them (export them and try again)"
        )


def secret_warnings(slurm: Slurm, plan: Plan) -> tuple[str, ...]:
    """Where the cluster keeps the run's secret values beyond the job itself: with ``AccountingStoreFlags``
    holding ``job_env``, slurmdbd stores every batch job's environment, API keys included, in its database for as
    long as it keeps job records (Slurm keeps it in its state directory only while the job lives)."""
    names = sorted({*plan.secret_env, *plan.server_secret_env} - set(plan.secret_env_unscanned))
    try:
        stored = bool(names) and slurm.config().stores_job_env
    except SlurmError:
        return ()
    if not stored:
        return ()
    return (
        f"this cluster stores every batch job's environment in its accounting database (AccountingStoreFlags "
        f"includes job_env): the values of {', '.join(names)} will be kept there with the job records, readable by "
        "Slurm's administrators (and by anyone with sacct --env-vars rights); see docs/architecture.md#threat-model",
    )


def read_limits(slurm: Slurm, plan: Plan) -> SchedulerLimits:
    """The scheduler limits the run's generation jobs must fit in (its account, QOS and partition)."""
    res = plan.generation
    return slurm.limits(account=res.account, qos=res.qos, partition=res.partition)


def first_script(plan: Plan, layout: RunLayout, planned: SubmissionPlan) -> str:
    """The batch script of a submission's first array (what ``sbatch --test-only`` is asked about)."""
    first = planned.arrays[0]
    return render_generation(plan, layout, list(first.shards), tasks=first.tasks, stage=first.stage)


def new_stamp(now: datetime) -> str:
    """Names one submission's batch scripts (``generate-<stamp>-<NNNN>.sbatch``)."""
    return f"{now.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"


class PartialSubmitError(LauncherError):
    """sbatch failed or timed out after some arrays of a submission were submitted: the run exists, part of it
    is queued, and the message says which shards were submitted, which were not, and how to go on."""

    def __init__(
        self,
        layout: RunLayout,
        *,
        submitted: list[tuple[PlannedArray, str]],
        missing: list[PlannedArray],
        cause: BaseException,
        planned: bool,
        maybe_submitted: bool = False,
    ) -> None:
        self.layout, self.submitted, self.missing, self.cause = layout, submitted, missing, cause
        self.planned, self.maybe_submitted = planned, maybe_submitted
        total = len(submitted) + len(missing)
        lines = [
            f"the submission of run {layout.run_id} stopped after {len(submitted)} of {total} array(s): "
            f"{cause or type(cause).__name__}"
        ]
        lines += [f"  submitted:     {_array_line(a, job)}" for a, job in submitted[:12]]
        if len(submitted) > 12:
            lines.append(f"                 ... and {len(submitted) - 12} more")
        lines += [f"  not submitted: {_array_line(a, None)}" for a in missing[:12]]
        if len(missing) > 12:
            lines.append(f"                 ... and {len(missing) - 12} more")
        root = layout.root
        if planned:
            lines += [
                "  The run's submission is incomplete (ddslurm status shows the unsubmitted shards). Either",
                f"    submit the rest:               ddslurm submit --continue {root}",
                f"    or cancel what was submitted:  ddslurm cancel {root}",
            ]
        else:
            lines += [
                "  The shards not submitted have no task queued. Either",
                f"    submit them again:             ddslurm retry {root}",
                f"    or cancel what was submitted:  ddslurm cancel {root}",
            ]
        if maybe_submitted:
            lines.append(
                "  (the last sbatch may have reached Slurm before it was stopped: --continue looks for its job in "
                "the queue by its batch script and records it instead of submitting it again)"
            )
        super().__init__("\n".join(lines))


def _array_line(array: PlannedArray, job: str | None) -> str:
    what = {"initial": "", "retry": "retry", "auto-retry": "automatic retry"}[array.kind]
    head = f"array job {job}: " if job else ""
    tasks = plural(array_tasks(array), "task" if array.tasks is None else "pulling allocation")
    if array.stage is not None:
        what = ", ".join(w for w in (what, "CPU stage" if array.stage == 1 else "GPU stage") if w)
    return f"{head}shards {compact_ranges(array.shards)} ({tasks}{', ' if what else ''}{what})"


class SubmitLockedError(LauncherError):
    """Another ddslurm holds the run's submit lock (it is submitting arrays of the run now)."""


@contextlib.contextmanager
def submit_lock(layout: RunLayout) -> Iterator[None]:
    """Held while arrays of the run are submitted: a second submitter of the same run is refused
    (:class:`SubmitLockedError`; :func:`~ddslurm.config.exclusive_lock`, tried once)."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(layout.submit_lock, wait_s=0))
        except LockHeldError:
            raise SubmitLockedError(
                f"another ddslurm is submitting arrays of run {layout.run_id} now ({layout.submit_lock}); "
                "wait for it to finish, then look at ddslurm status"
            ) from None
        yield


def submit_arrays(
    layout: RunLayout,
    plan: Plan,
    arrays: Sequence[PlannedArray],
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    submitted: Mapping[int, str] | None = None,
    planned: bool = True,
    plan_arrays: Sequence[PlannedArray] = (),
) -> list[str]:
    """sbatch ``arrays`` in order, recording each as it is submitted (``plan_index`` when ``planned``).
    ``submitted``: the plan's arrays submitted earlier (index → job id), for the dependencies of automatic
    retries; ``plan_arrays``: every array of the plan when ``arrays`` is only part of it (``submit --continue``),
    so that an automatic retry waits for every earlier level of its chain (:func:`failure_chain`). Stops before
    the next sbatch when the run was cancelled meanwhile. On a failure raises :class:`PartialSubmitError`, naming
    what was and was not submitted."""
    every = [*plan_arrays, *(a for a in arrays if a.index not in {p.index for p in plan_arrays})]
    ids: dict[int, str] = dict(submitted or {})
    before = [(a, ids[a.index]) for a in arrays if a.index in ids]
    done: list[tuple[PlannedArray, str]] = []
    todo = [a for a in arrays if a.index not in ids]
    for n, array in enumerate(todo):
        try:
            if os.path.lexists(layout.cancelled):
                raise LauncherError("the run was cancelled (ddslurm cancel) while it was being submitted")
            chain = failure_chain(every, array)
            for follows in (*chain, *array.after_any):
                if follows not in ids:
                    raise LauncherError(f"array {follows} of the plan, which array {array.index} follows, has no job")
            after_any = tuple(ids[i] for i in array.after_any)
            job_id = _sbatch(
                layout,
                plan,
                array,
                slurm,
                env,
                now,
                after_failure_of=tuple(ids[i] for i in chain),
                after_any=after_any,
                planned=planned,
            )
        except (LauncherError, OSError, KeyboardInterrupt) as exc:
            raise PartialSubmitError(
                layout,
                submitted=before + done,
                missing=todo[n:],
                cause=exc,
                planned=planned,
                maybe_submitted=isinstance(exc, SlurmTimeoutError | KeyboardInterrupt | _Unrecorded),
            ) from exc
        ids[array.index] = job_id
        done.append((array, job_id))
        if os.path.lexists(layout.cancelled):  # cancelled while this array was being submitted: it goes too
            slurm.scancel([job_id])
            raise PartialSubmitError(
                layout,
                submitted=before + done,
                missing=todo[n + 1 :],
                cause=LauncherError("the run was cancelled (ddslurm cancel) while it was being submitted"),
                planned=planned,
            )
    return [job for _, job in done]


class _Unrecorded(LauncherError):
    """sbatch submitted the array but its submission record could not be written."""


def submit_shards(
    layout: RunLayout,
    plan: Plan,
    shards: list[int],
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    kind: SubmissionKind = "initial",
    gpu_done: Collection[int] = (),
) -> list[str]:
    """Submit ``shards`` of a written run directory as arrays no larger than the cluster's MaxArraySize (for
    the initial submission, each followed by the plan's automatic retry arrays), after checking that they fit
    in the scheduler's limits (``ddslurm.planner.plan_submission``). The jobs get exactly the environment built
    here, never the user's login environment: the exported names and a minimal allow-list (``Slurm.sbatch``:
    ``--export=ALL`` from that environment). The initial submission writes its plan first (``submit-plan.json``).
    Returns the array ids."""
    check_environment(plan, env)
    with refusals():
        planned = plan_submission(
            plan, layout, shards, read_limits(slurm, plan), kind=kind, stamp=new_stamp(now), gpu_done=gpu_done
        )
    with submit_lock(layout):
        if kind == "initial" and not publish_once(layout.submit_plan, encode_pretty(planned.record(now))):
            raise LauncherError(f"run {layout.run_id} was submitted already ({layout.submit_plan} exists)")
        return submit_arrays(layout, plan, planned.arrays, slurm, env, now, planned=kind == "initial")


def exported_names(plan: Plan) -> tuple[str, ...]:
    """The variables a generation job gets from the submitting shell, by name (values never written anywhere):
    the hosted providers' API keys (for the client step) and ``server.env_from`` (for the server steps)."""
    return tuple(sorted({*plan.secret_env, *plan.server_secret_env}))


def job_variables(plan: Plan) -> tuple[str, ...]:
    """Every variable of the submitting environment a generation job gets besides ``_slurm.NODE_ENV_ALLOWED``
    (which has no ``HOME``: a container runtime that needs settings finds them in the cluster's configuration,
    or in ``server.env``)."""
    return exported_names(plan)


def _sbatch(
    layout: RunLayout,
    plan: Plan,
    array: PlannedArray,
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    after_failure_of: tuple[str, ...] = (),
    after_any: tuple[str, ...] = (),
    planned: bool,
) -> str:
    """``after_failure_of``: an automatic retry's chain (the array it follows first, then every earlier level)."""
    shards = list(array.shards)
    script = render_generation(
        plan,
        layout,
        shards,
        after_failure_of=after_failure_of,
        tasks=array.tasks,
        stage=array.stage,
        after_any=after_any,
    )
    script_path = Path(array.script)
    atomic_write(script_path, script.encode(), mode=0o700)
    if not layout.script.exists():
        atomic_write(layout.script, script.encode(), mode=0o700)
    job_id = slurm.sbatch(str(script_path), export=job_variables(plan), env=env)
    record = SubmissionRecord(
        array_job_id=job_id,
        shards=array.shards,
        tasks=array.tasks,
        submitted_at=now.isoformat(),
        script=str(script_path),
        kind=array.kind,
        after=after_failure_of[0] if after_failure_of else None,
        plan_index=array.index if planned else None,
        stage=array.stage,
        after_any=after_any,
    )
    try:
        published = publish_once(layout.submissions / f"{job_id}.json", encode(record))
    except OSError as exc:
        raise _Unrecorded(f"array job {job_id} was submitted but its record could not be written: {exc}") from exc
    if not published:
        raise _Unrecorded(f"job {job_id} was submitted but {layout.submissions} already records that id")
    return job_id


def submit(
    run_path: Path,
    profile_path: Path,
    *,
    slurm: Slurm,
    env: Mapping[str, str],
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    home: Path | None = None,
    check_endpoints: EndpointCheck | None = None,
    calibration: bool = False,
    host: EngineHost = RUNTIME_PROCESS,
    stage: StageRequest | None = None,
) -> Submitted:
    """Validate and compile, read the scheduler's limits and plan the arrays within them (refusing, with the
    numbers, what does not fit), all before anything is written; then write the run directory and the
    submission plan, and submit the arrays. A failure before the first array was submitted removes the run
    directory again; a later one (or a timeout) raises :class:`PartialSubmitError` and leaves an incomplete run.
    The stages, each once: the run file and profile read (:func:`read_inputs`), the profile checked against the
    cluster, the inputs validated and the plan compiled (:func:`prepare_inputs`), the arrays planned within the
    scheduler's limits and the jobs checked, the run directory written, the arrays submitted.
    ``check_endpoints``: ask the hosted endpoints first (``--check-endpoints``); ``calibration``: ``ddslurm
    tune``'s run, planned with its calibration levels; ``host``: how the
    profile's ``python_env`` is asked about Data Designer (:mod:`ddslurm.launcher._engine_host`); ``stage``: a later
    stage of a Data Designer workflow (``ddslurm workflow``)."""
    now = clock()
    inputs = read_inputs(run_path, profile_path)
    checked = check_profile_first(inputs, slurm, env, host)
    gpu_nodes = PartitionGpuNodes(slurm)  # one sinfo for the GPU type and the layouts' bounds
    prepared = prepare_inputs(
        inputs,
        env,
        now,
        home,
        host=host,
        check_endpoints=check_endpoints,
        gpu_type_of=partition_gpu_type(gpu_nodes),
        nodes_of=partition_nodes(gpu_nodes),
        stage=stage,
        calibration=calibration,
    )
    layout, plan = prepared.layout, prepared.plan
    check_environment(plan, env)
    with refusals():
        planned = plan_submission(
            plan, layout, [s.index for s in plan.shards], read_limits(slurm, plan), stamp=new_stamp(now)
        )
    check_jobs(checked, plan, first_script(plan, layout, planned))
    write_run_dir(prepared)
    try:
        with submit_lock(layout):
            publish_once(layout.submit_plan, encode_pretty(planned.record(now)))
            job_ids = submit_arrays(layout, plan, planned.arrays, slurm, env, now)
    except PartialSubmitError as exc:
        if exc.submitted or exc.maybe_submitted:
            raise
        shutil.rmtree(layout.root, ignore_errors=True)  # nothing reached Slurm: leave nothing behind
        if isinstance(exc.cause, LauncherError):
            raise exc.cause from None
        if isinstance(exc.cause, OSError):
            raise WriteError(f"the batch script of run {layout.run_id}", exc.cause, NOTHING_LEFT) from exc.cause
        raise SubmitError(f"nothing was submitted: {exc.cause}") from exc.cause
    except OSError as exc:  # the submit lock or the submission plan, before any sbatch
        shutil.rmtree(layout.root, ignore_errors=True)
        raise WriteError(f"the submission plan of run {layout.run_id}", exc, NOTHING_LEFT) from exc
    warnings = (*prepared.warnings, *batch_warnings(plan), *secret_warnings(slurm, plan))
    return Submitted(layout, plan, job_ids[0], prepared.aliases, tuple(job_ids), planned.arrays, warnings)
