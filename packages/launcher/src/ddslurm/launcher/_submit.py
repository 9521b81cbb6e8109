"""Submission: capture inputs, compile the plan, write the run directory, sbatch the array.

Everything that can be wrong with the inputs is checked before the run directory is created, so a refused
submission changes nothing on disk.
"""

from __future__ import annotations

import re
import secrets
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import (
    ConfigError,
    Plan,
    ProviderSnapshot,
    RunLayout,
    SubmissionKind,
    SubmissionRecord,
    atomic_write,
    encode,
    encode_pretty,
    load_profile,
    load_run_file,
    locate,
    make_private_dir,
    publish_once,
    read_yaml,
    sha256_bytes,
)
from ddslurm.launcher._render import render_generation
from ddslurm.launcher._seed import CountRows, SeedCapture, capture_seed, dd_seed_rows
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher._validate import dd_check_recipe
from ddslurm.launcher.errors import LauncherError, SubmitError
from ddslurm.planner import PlanError, PlanInputs, compile_plan
from ddslurm.providers import (
    AliasRow,
    Origin,
    ProvidersError,
    load_recipe,
    load_settings,
    missing_env,
    placeholder_secrets,
    resolve,
)
from ddslurm.providers.discovery import settings_dir

CheckRecipe = Callable[[dict[str, Any], Path, ProviderSnapshot], list[str]]
"""(recipe, its path, the snapshot) -> what Data Designer refuses in it, one line per problem."""


@dataclass(frozen=True, slots=True)
class Submitted:
    layout: RunLayout
    plan: Plan
    job_id: str
    aliases: tuple[AliasRow, ...]
    job_ids: tuple[str, ...] = ()


def new_run_id(name: str, now: datetime) -> str:
    return f"{name}-{now.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class Prepared:
    layout: RunLayout
    plan: Plan
    run_bytes: bytes
    recipe_bytes: bytes
    snapshot_bytes: bytes
    aliases: tuple[AliasRow, ...]
    seed: SeedCapture | None = None


_PLAN_FIELD = re.compile(r"^(?P<field>(?P<profile>profile\.)?[A-Za-z_]+(?:\[\d+\]|\.[A-Za-z_]+)*): ")


def place_error(message: str, run_path: Path, profile_path: Path) -> str:
    """A refusal that starts with its field (the planner's ``submission.memory: ...``; profile fields
    ``profile.gpus_per_node: ...``), placed at the file, line and column of that field."""
    match = _PLAN_FIELD.match(message)
    if match is None:
        return message
    path = profile_path if match.group("profile") else run_path
    field = match.group("field").removeprefix("profile.")
    steps: list[str | int] = [int(i) if i else name for name, i in re.findall(r"([A-Za-z_]+)|\[(\d+)\]", field)]
    try:
        line, col = locate(read_yaml(path), steps)
    except ConfigError:
        line, col = None, None
    where = str(path) if line is None else f"{path}:{line}:{col}"
    return f"{where}: {field}: {message[match.end() :]}"


def prepare(
    run_path: Path,
    profile_path: Path,
    env: Mapping[str, str],
    now: datetime,
    home: Path | None = None,
    *,
    count_seed_rows: CountRows = dd_seed_rows,
    check_recipe: CheckRecipe = dd_check_recipe,
) -> Prepared:
    """Validate and compile everything; touch nothing on disk. Last, Data Designer's own validation of the recipe
    (``check_recipe``, a subprocess of a few seconds): what it refuses would fail on the node."""
    try:
        run = load_run_file(run_path)
        profile = load_profile(profile_path)
        recipe_path = (run_path.parent / run.recipe).resolve()
        if not recipe_path.is_file():
            raise SubmitError(place_error(f"recipe: {recipe_path} does not exist", run_path, profile_path))
        recipe_bytes = recipe_path.read_bytes()
        recipe = load_recipe(recipe_path)
        settings = load_settings(settings_dir(env, home))
        resolution = resolve(recipe, Origin(recipe_path), settings, run.deployments, env, run_origin=Origin(run_path))
        snapshot: ProviderSnapshot = resolution.snapshot
        snapshot_bytes = encode_pretty(snapshot)
        layout = RunLayout.in_workspace(Path(profile.workspace), new_run_id(run.name, now))
        seed = capture_seed(recipe, recipe_path, layout, count_rows=count_seed_rows)
        if seed is not None:
            recipe_bytes = seed.recipe_bytes
        plan = compile_plan(
            PlanInputs(
                run=run,
                profile=profile,
                snapshot=snapshot,
                layout=layout,
                recipe_sha256=sha256_bytes(recipe_bytes),
                snapshot_sha256=sha256_bytes(snapshot_bytes),
                seed=None if seed is None else seed.plan,
            )
        )
        # Key values that are placeholders (EMPTY, none) are not secrets: the node does not scan output for them.
        plan = msgspec.structs.replace(plan, secret_env_unscanned=placeholder_secrets(plan.secret_env, env))
    except PlanError as exc:
        raise SubmitError(place_error(str(exc), run_path, profile_path)) from exc
    except (ConfigError, ProvidersError) as exc:
        raise SubmitError(str(exc)) from exc
    python = Path(profile.python_env) / "bin" / "ddslurm-runtime"
    if not python.exists():
        message = f"profile.python_env: {python} does not exist (the compute nodes run it)"
        raise SubmitError(place_error(message, run_path, profile_path))
    problems = check_recipe(recipe, recipe_path, snapshot)
    if problems:
        raise SubmitError(f"{recipe_path}: Data Designer refuses the recipe:\n" + "\n".join(f"  {p}" for p in problems))
    return Prepared(
        layout,
        plan,
        run_path.read_bytes(),
        recipe_bytes,
        snapshot_bytes,
        resolution.rows,
        seed,
    )


def copy_seed(seed: SeedCapture) -> None:
    """Copy the seed files into the run's inputs, each checked against the digest the plan records."""
    root = Path(seed.plan.root)
    make_private_dir(root.parent, exist_ok=True)
    make_private_dir(root, exist_ok=True)
    for source, entry in zip(seed.sources, seed.plan.files, strict=True):
        data = source.read_bytes()
        if sha256_bytes(data) != entry.sha256:
            raise SubmitError(f"{source}: changed while the run was being submitted")
        target = root / entry.path
        for parent in reversed(target.relative_to(root).parents[:-1]):
            make_private_dir(root / parent, exist_ok=True)
        atomic_write(target, data)


def write_run_dir(p: Prepared) -> None:
    layout = p.layout
    make_private_dir(layout.root)
    for d in (layout.inputs, layout.submissions, layout.logs, layout.shards):
        make_private_dir(d)
    for spec in p.plan.shards:
        shard = layout.shard(spec.index)
        make_private_dir(shard.dir)
        make_private_dir(shard.attempts)
    if p.seed is not None:
        copy_seed(p.seed)
    atomic_write(layout.run_file, p.run_bytes)
    atomic_write(layout.recipe, p.recipe_bytes)
    atomic_write(layout.snapshot, p.snapshot_bytes)
    atomic_write(layout.plan, encode_pretty(p.plan))


def submit_shards(
    layout: RunLayout,
    plan: Plan,
    shards: list[int],
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    kind: SubmissionKind = "initial",
) -> list[str]:
    """sbatch ``shards`` as arrays no larger than the cluster's MaxArraySize, each followed by the plan's
    automatic retry arrays. The jobs get exactly the environment built here, never the user's login environment:
    the exported names and a minimal allow-list (``Slurm.sbatch``: ``--export=ALL`` from that environment).
    Returns the array ids."""
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
    chunk = slurm.max_array_size()
    submitted: list[str] = []
    for start in range(0, len(shards), chunk):
        part = shards[start : start + chunk]
        job_id = _sbatch(layout, plan, part, slurm, env, now, kind=kind, after=None)
        submitted.append(job_id)
        previous = job_id
        for _ in range(plan.retries if kind == "initial" else 0):
            previous = _sbatch(layout, plan, part, slurm, env, now, kind="auto-retry", after=previous)
            submitted.append(previous)
    return submitted


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
    shards: list[int],
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    kind: SubmissionKind,
    after: str | None,
) -> str:
    script = render_generation(plan, layout, shards, after_failure_of=after)
    script_path = layout.root / f"generate-{now.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}.sbatch"
    atomic_write(script_path, script.encode(), mode=0o700)
    if not layout.script.exists():
        atomic_write(layout.script, script.encode(), mode=0o700)
    job_id = slurm.sbatch(str(script_path), export=job_variables(plan), env=env)
    record = SubmissionRecord(
        array_job_id=job_id,
        shards=tuple(shards),
        submitted_at=now.isoformat(),
        script=str(script_path),
        kind=kind,
        after=after,
    )
    if not publish_once(layout.submissions / f"{job_id}.json", encode(record)):
        raise LauncherError(f"job {job_id} was submitted but {layout.submissions} already records that id")
    return job_id


def submit(
    run_path: Path,
    profile_path: Path,
    *,
    slurm: Slurm,
    env: Mapping[str, str],
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    home: Path | None = None,
) -> Submitted:
    now = clock()
    prepared = prepare(run_path, profile_path, env, now, home)
    write_run_dir(prepared)
    try:
        job_ids = submit_shards(
            prepared.layout, prepared.plan, [s.index for s in prepared.plan.shards], slurm, env, now
        )
    except LauncherError:
        if not any(prepared.layout.submissions.iterdir()):
            shutil.rmtree(prepared.layout.root, ignore_errors=True)
        raise
    return Submitted(prepared.layout, prepared.plan, job_ids[0], prepared.aliases, tuple(job_ids))
