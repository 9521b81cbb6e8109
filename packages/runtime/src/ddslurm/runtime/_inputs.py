"""The inputs of a run's attempts: the plan, recipe, provider snapshot and seed files in the run directory, each
checked against the digest recorded for it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import (
    Plan,
    ProviderSnapshot,
    RunLayout,
    SeedPlan,
    UnsafePathError,
    check_run_tree,
    digest,
    read_plan,
    read_regular,
    read_yaml,
    sha256_bytes,
    sha256_file,
    to_builtins,
)
from ddslurm.runtime.errors import InputsError


@dataclass(frozen=True, slots=True)
class Inputs:
    plan: Plan
    plan_sha256: str
    recipe: Mapping[str, Any]
    snapshot: ProviderSnapshot


def check_seed(seed: SeedPlan) -> None:
    """The captured seed files are exactly those the plan lists, unchanged (a directory source would read an
    added file as another seed row)."""
    root = Path(seed.root)
    listed = {entry.path: entry for entry in seed.files}
    try:
        found = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}
    except OSError as exc:
        raise InputsError(f"cannot read the run's seed dataset {root}: {exc}") from exc
    extra = sorted(found - listed.keys())
    if extra:
        raise InputsError(f"{root / extra[0]}: not part of the run's seed dataset; the run's inputs were modified")
    for entry in seed.files:
        path = root / entry.path
        try:
            actual = sha256_file(path)
        except OSError as exc:
            raise InputsError(f"cannot read the run's seed file {path}: {exc}") from exc
        if path.is_symlink() or actual != entry.sha256:
            raise InputsError(f"{path}: sha256 differs from the plan; the run's inputs were modified")


def load_inputs(layout: RunLayout, *, plan_sha256: str | None = None) -> Inputs:
    """Read the plan, recipe and snapshot from the run directory and check their recorded digests.

    The run directory must be one only this user can change (:func:`~ddslurm.config.check_run_tree`), and the
    plan the one the job was submitted with: ``plan_sha256`` is the digest the batch script carries (another
    user who swapped a queued run's directory for one of theirs would otherwise receive the run's API keys)."""
    try:
        check_run_tree(layout.root)
    except UnsafePathError as exc:
        raise InputsError(f"{exc}; refusing to run from it") from None
    try:
        plan = read_plan(layout.plan)
        recipe_bytes = read_regular(Path(plan.recipe_file))
        snapshot_bytes = read_regular(Path(plan.snapshot_file))
        checked = [
            (plan.recipe_file, recipe_bytes, plan.recipe_sha256),
            (plan.snapshot_file, snapshot_bytes, plan.snapshot_sha256),
        ]
        if plan.recipe_source is not None and plan.recipe_source.rebuild:  # the node runs this copy of the script
            source = plan.recipe_source
            checked.append((source.file, read_regular(Path(source.file)), source.sha256))
    except (OSError, msgspec.DecodeError, Exception) as exc:
        raise InputsError(f"cannot read the run's inputs in {layout.root}: {exc}") from exc
    for name, data, recorded in checked:
        if sha256_bytes(data) != recorded:
            raise InputsError(f"{name}: sha256 differs from the plan; the run's inputs were modified")
    if plan.seed is not None:
        check_seed(plan.seed)
    snapshot = msgspec.json.decode(snapshot_bytes, type=ProviderSnapshot)
    recipe = to_builtins(read_yaml(Path(plan.recipe_file)))
    found = digest(plan)
    if plan_sha256 is not None and found != plan_sha256:
        raise InputsError(
            f"{layout.plan}: sha256 {found[:12]}... is not the submitted plan's {plan_sha256[:12]}...; the run "
            "directory was replaced after submission"
        )
    return Inputs(plan=plan, plan_sha256=found, recipe=recipe, snapshot=snapshot)


def stage_inputs(inputs: Inputs, stage: int | None) -> Inputs:
    """The inputs as a stage of a two-stage run sees them: the CPU stage (1) runs no model server and
    ``cpu_stage_workers`` client steps at once per allocation, sharing its CPUs. ValueError for a stage the plan
    does not have."""
    plan = inputs.plan
    if stage is None:
        return inputs
    if len(plan.stages) < 2 or stage not in (0, 1):
        raise ValueError(f"stage {stage} does not exist: the run has {max(1, len(plan.stages))} stage(s)")
    if stage == 0:
        return inputs
    cpus = plan.cpu_stage.cpus_per_task if plan.cpu_stage is not None else plan.client_cpus
    workers = max(1, plan.cpu_stage_workers)
    cpu_plan = msgspec.structs.replace(plan, serving=None, client_workers=workers, client_cpus=max(1, cpus // workers))
    return dataclasses.replace(inputs, plan=cpu_plan)
