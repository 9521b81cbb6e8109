"""The run directory, written whole or not at all: the inputs a submission validated (:class:`Prepared`), copied
into a hidden sibling and renamed into place once complete."""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from ddslurm.config import (
    Plan,
    RunLayout,
    UnsafePathError,
    atomic_write,
    encode_pretty,
    fsync_dir,
    make_private_dir,
)
from ddslurm.launcher.errors import SubmitError, WriteError
from ddslurm.launcher.submission._seed import SeedCapture
from ddslurm.providers import AliasRow


@dataclass(frozen=True, slots=True)
class Prepared:
    layout: RunLayout
    plan: Plan
    run_bytes: bytes
    recipe_bytes: bytes
    snapshot_bytes: bytes
    aliases: tuple[AliasRow, ...]
    seed: SeedCapture | None = None
    recipe_source: bytes | None = None
    """The builder script the recipe was made by (``recipe: build.py``), stored as ``inputs/recipe-source.py``."""
    warnings: tuple[str, ...] = ()
    """What the bill and ``submit`` say besides (a workspace facts file that is not the user's own, ignored)."""


def copy_seed(seed: SeedCapture, layout: RunLayout, into: RunLayout) -> None:
    """Copy the seed files into the run's inputs (``into``: where the run directory of ``layout`` is being
    built), each checked against the digest the plan records."""
    root = into.root / Path(seed.plan.root).relative_to(layout.root)
    make_private_dir(root.parent, exist_ok=True)
    make_private_dir(root, exist_ok=True)
    for source, entry in zip(seed.sources, seed.plan.files, strict=True):
        data = source.read_bytes()
        if not entry.holds(data):
            raise SubmitError(f"{source}: changed while the run was being submitted")
        target = root / entry.path
        for parent in reversed(target.relative_to(root).parents[:-1]):
            make_private_dir(root / parent, exist_ok=True)
        atomic_write(target, data)


def _write_inputs(p: Prepared, into: RunLayout) -> None:
    """The run directory's contents, written into ``into`` (the plan names its final place, ``p.layout``)."""
    make_private_dir(into.root)
    for d in (into.inputs, into.submissions, into.logs, into.shards):
        make_private_dir(d)
    for spec in p.plan.shards:
        shard = into.shard(spec.index)
        make_private_dir(shard.dir)
        make_private_dir(shard.attempts)
    if p.seed is not None:
        copy_seed(p.seed, p.layout, into)
    atomic_write(into.run_file, p.run_bytes)
    atomic_write(into.recipe, p.recipe_bytes)
    if p.recipe_source is not None:
        atomic_write(into.recipe_source, p.recipe_source)
    atomic_write(into.snapshot, p.snapshot_bytes)
    atomic_write(into.plan, encode_pretty(p.plan))


NOTHING_LEFT = "nothing was submitted and no run directory was left"


def write_run_dir(p: Prepared) -> None:
    """Write the run directory whole or not at all: it is built in a hidden sibling (``.<run_id>.partial-<hex>``,
    0700) and renamed into place once complete, so no reader ever sees part of it. A write that fails (a full
    disk or quota: any OSError) removes what was made and raises :class:`WriteError`."""
    final = p.layout.root
    staging = RunLayout(final.with_name(f".{final.name}.partial-{secrets.token_hex(4)}"))
    try:
        make_private_dir(final.parent, exist_ok=True)
        if os.path.lexists(final):
            raise UnsafePathError(f"{final}: already exists")
        _write_inputs(p, staging)
        # rename(2) would replace an empty directory made at ``final`` meanwhile, never a run: a run id is unique
        staging.root.rename(final)
        fsync_dir(final.parent)
    except OSError as exc:
        shutil.rmtree(staging.root, ignore_errors=True)
        raise WriteError(f"the run directory {final}", exc, NOTHING_LEFT) from exc
    except BaseException:
        shutil.rmtree(staging.root, ignore_errors=True)
        raise
