"""Submission: capture inputs, compile the plan, write the run directory, sbatch the array.

Everything that can be wrong with the inputs is checked before the run directory is created, so a refused
submission changes nothing on disk.
"""

from __future__ import annotations

import copy as copy_module
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
    make_private_dir,
    publish_once,
    sha256_bytes,
    sha256_file,
)
from ddslurm.launcher._render import render_generation
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher.errors import LauncherError, SubmitError
from ddslurm.planner import PlanError, PlanInputs, compile_plan
from ddslurm.providers import (
    AliasRow,
    Origin,
    ProvidersError,
    load_recipe,
    load_settings,
    missing_env,
    recipe_section,
    resolve,
)
from ddslurm.providers.discovery import settings_dir


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
    seed: Path | None = None


@dataclass(frozen=True, slots=True)
class Seed:
    source: Path
    recipe_bytes: bytes


def capture_seed(recipe: dict[str, Any], recipe_path: Path, layout: RunLayout) -> Seed | None:
    """A local seed file of the recipe, resolved against the recipe's directory, becomes part of the run's
    inputs: the stored recipe points at the copy, so nodes never depend on the submitter's working directory."""
    seed = recipe_section(recipe).get("seed_config")
    source = seed.get("source") if isinstance(seed, dict) else None
    if not isinstance(source, dict) or source.get("seed_type", "local") != "local" or "path" not in source:
        return None
    path = Path(str(source["path"]))
    resolved = path if path.is_absolute() else (recipe_path.parent / path).resolve()
    if not resolved.is_file():
        raise SubmitError(
            f"{recipe_path}: seed_config.source.path: {resolved} is not a file (relative paths are relative to "
            "the recipe)"
        )
    copy = copy_module.deepcopy(recipe)
    recipe_section(copy)["seed_config"]["source"]["path"] = str(layout.seed_dir / resolved.name)
    # JSON is YAML too: the stored recipe stays loadable by Data Designer and by ddslurm's YAML reader.
    return Seed(source=resolved, recipe_bytes=encode_pretty(copy))


def prepare(
    run_path: Path, profile_path: Path, env: Mapping[str, str], now: datetime, home: Path | None = None
) -> Prepared:
    """Validate and compile everything; touch nothing on disk."""
    try:
        run = load_run_file(run_path)
        profile = load_profile(profile_path)
        recipe_path = (run_path.parent / run.recipe).resolve()
        if not recipe_path.is_file():
            raise SubmitError(f"{run_path}: recipe: {recipe_path} does not exist")
        recipe_bytes = recipe_path.read_bytes()
        recipe = load_recipe(recipe_path)
        settings = load_settings(settings_dir(env, home))
        resolution = resolve(recipe, Origin(recipe_path), settings, run.deployments, env)
        snapshot: ProviderSnapshot = resolution.snapshot
        snapshot_bytes = encode_pretty(snapshot)
        layout = RunLayout.in_workspace(Path(profile.workspace), new_run_id(run.name, now))
        seed = capture_seed(recipe, recipe_path, layout)
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
            )
        )
        if seed is not None:
            plan = msgspec.structs.replace(
                plan, seed_file=str(layout.seed_dir / seed.source.name), seed_sha256=sha256_file(seed.source)
            )
    except (ConfigError, ProvidersError, PlanError) as exc:
        raise SubmitError(str(exc)) from exc
    python = Path(profile.python_env) / "bin" / "ddslurm-runtime"
    if not python.exists():
        raise SubmitError(f"{profile_path}: python_env: {python} does not exist (the compute nodes run it)")
    return Prepared(
        layout,
        plan,
        run_path.read_bytes(),
        recipe_bytes,
        snapshot_bytes,
        resolution.rows,
        seed.source if seed else None,
    )


def write_run_dir(p: Prepared) -> None:
    layout = p.layout
    make_private_dir(layout.root)
    for d in (layout.inputs, layout.submissions, layout.logs, layout.shards):
        make_private_dir(d)
    for spec in p.plan.shards:
        shard = layout.shard(spec.index)
        make_private_dir(shard.dir)
        make_private_dir(shard.attempts)
    if p.seed is not None and p.plan.seed_file is not None:
        make_private_dir(layout.seed_dir)
        data = p.seed.read_bytes()
        if sha256_bytes(data) != p.plan.seed_sha256:
            raise SubmitError(f"{p.seed}: changed while the run was being submitted")
        atomic_write(Path(p.plan.seed_file), data)
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
    automatic retry arrays; secret variables travel by name (``--export=NAMES``). Returns the array ids."""
    missing = missing_env(list(plan.secret_env), env)
    if missing:
        raise SubmitError(
            f"API-key variable(s) {', '.join(missing)} are unset or empty in this shell; the run's providers "
            "need them (export them and try again)"
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
    job_id = slurm.sbatch(str(script_path), export=plan.secret_env, env=env)
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
