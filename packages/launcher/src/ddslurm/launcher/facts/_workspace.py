"""The workspace's facts as the launcher reads and writes them: read at submit for the planner's cost model (with
the generation partition's GPU type from ``sinfo``), and updated with what a finished run measured
(:func:`record_facts`, after ``collect``, ``report`` and a ``wait`` that ends succeeded).

The facts file (``<workspace>/facts.json``) holds numbers and names only (model paths, engine, parallel shape, GPU
type, run ids, recipe digests): never a prompt, a record, an endpoint's credentials or an environment value. Only the
user's own facts file is trusted: one that is not (another user's, one others can write, a link, a FIFO) is ignored
with a warning, never read in a way that blocks, and a run's facts replace it with a file of the user's own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import msgspec

from ddslurm.config import (
    LOCK_WAIT_S,
    ConfigError,
    Facts,
    PartitionNodes,
    RunLayout,
    facts_path,
    own_facts,
    update_facts,
)
from ddslurm.launcher.cluster._cluster import SINFO_FORMAT, NodeRow, parse_sinfo
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.facts._measure import Measured, measure, measured
from ddslurm.launcher.report import RunFacts, RunReport

GpuTypeOf = Callable[[str | None], str]
"""(the generation partition, None: the cluster's default) -> the GPU type of its nodes, "" when unknown."""


def workspace_facts(workspace: Path) -> tuple[Facts, str | None]:
    """The facts of ``workspace`` (none when it has no facts file) and, when its facts file is not the user's own,
    none and the warning the bill shows (:func:`~ddslurm.config.own_facts`); a damaged file of the user's is a
    :class:`SubmitError` naming it (nothing is changed: the user moves or fixes it)."""
    path = facts_path(workspace)
    try:
        return own_facts(path)
    except ConfigError as exc:
        raise SubmitError(
            f"{path}: the workspace's measured facts cannot be read ({exc}); fix or remove the file (the next run "
            "measures them again)"
        ) from exc


class PartitionGpuNodes:
    """The GPU nodes of each partition from one ``sinfo``, asked the first time they are needed and kept: what
    the GPU type (:func:`partition_gpu_type`) and the layouts' bounds (:func:`partition_nodes`) are read from."""

    def __init__(self, slurm: Slurm) -> None:
        self._slurm = slurm
        self._rows: list[NodeRow] | None = None

    def of(self, partition: str | None) -> tuple[str, list[NodeRow]] | None:
        """The partition's name (``None``: the cluster's default) and its nodes that have a GPU (none for a
        partition sinfo does not list); None when ``sinfo`` cannot be asked or names no default (never fatal:
        nothing is known of it)."""
        if self._rows is None:
            try:
                self._rows = parse_sinfo(self._slurm.sinfo_nodes(SINFO_FORMAT))
            except Exception:  # asked again next time: an unanswered sinfo is not an empty cluster
                return None
        rows = self._rows
        name = partition or next((r.partition for r in rows if r.default), None)
        return None if name is None else (name, [r for r in rows if r.partition == name and r.gpus > 0])


def _gpu_nodes(source: Slurm | PartitionGpuNodes) -> PartitionGpuNodes:
    return source if isinstance(source, PartitionGpuNodes) else PartitionGpuNodes(source)


def partition_gpu_type(source: Slurm | PartitionGpuNodes) -> GpuTypeOf:
    """The GPU type of a partition's GPU nodes: their one type, or "" when they have none, several, or sinfo cannot
    be asked (the cost model then keys its facts by an untyped shape; never fatal)."""
    nodes = _gpu_nodes(source)

    def of(partition: str | None) -> str:
        found = nodes.of(partition)
        if found is None:
            return ""
        rows = found[1]
        types = {t for r in rows for t in r.gpu_types}
        untyped = any(not r.gpu_types for r in rows)
        return next(iter(types)) if len(types) == 1 and not untyped else ""

    return of


NodesOf = Callable[[str | None], PartitionNodes | None]
"""(the generation partition, None: the cluster's default) -> its GPU nodes, None when unknown."""


def partition_nodes(source: Slurm | PartitionGpuNodes) -> NodesOf:
    """The GPU nodes of a partition: how many, and the CPUs, GPUs and memory of the smallest (what the planner
    fits a layout in); None when it has none or sinfo cannot be asked (the planner then rules
    nothing out by them; never fatal)."""
    nodes = _gpu_nodes(source)

    def of(partition: str | None) -> PartitionNodes | None:
        found = nodes.of(partition)
        if found is None or not found[1]:
            return None
        name, rows = found
        return PartitionNodes(
            partition=name,
            nodes=len({r.node for r in rows}),
            cpus=min(r.cpus for r in rows),
            gpus=min(r.gpus for r in rows),
            memory_mb=min(r.memory_mb for r in rows),
        )

    return of


def no_nodes(partition: str | None) -> PartitionNodes | None:
    """The partition's nodes when the scheduler is not asked (unit tests, ``prepare`` without one): unknown."""
    return None


def no_gpu_type(partition: str | None) -> str:
    """The GPU type when the scheduler is not asked (unit tests, ``prepare`` without a scheduler): unknown."""
    return ""


def run_workspace(layout: RunLayout) -> Path | None:
    """The workspace a run directory lies in (``<workspace>/runs/<run_id>``); None for one elsewhere."""
    runs = layout.root.parent
    return runs.parent if runs.name == "runs" else None


@dataclass(frozen=True, slots=True)
class Recorded:
    """What :func:`record_facts` did: the facts it wrote (empty when nothing new) and why not, when it did not."""

    measured: Measured | None
    skipped: str | None = None
    """Why nothing was recorded (the run did not succeed, it was recorded already)."""
    warnings: tuple[str, ...] = ()
    """What the command says besides (a facts file that was not the user's own, ignored)."""


def _stamp(now: datetime) -> str:
    return now.astimezone(UTC).isoformat(timespec="seconds")


Reading = tuple[RunFacts, RunReport]
"""A run as the report read it (:func:`~ddslurm.launcher.report.read_run`) and its numbers: a command that has
them (``report``) lends them, so the run directory and sacct are not read a second time."""


def record_facts(
    workspace: Path,
    layout: RunLayout,
    slurm: Slurm | None,
    *,
    now: datetime | None = None,
    reading: Reading | None = None,
    lock_wait_s: float = LOCK_WAIT_S,
) -> Recorded:
    """Measure the run (:func:`~ddslurm.launcher.facts._measure.measured`, or of ``reading`` when given) and merge its
    facts into the workspace's (locked read-modify-write, the lock waited for at most ``lock_wait_s`` seconds), for
    a run that succeeded (every shard has its winner). Idempotent: once any fact of this run is in the workspace,
    the run is not recorded again (not even its ``measured_at``). A facts file that is not the user's own is
    ignored (a warning), and the run's facts replace it with one of the user's own."""
    run_id = layout.run_id
    earlier, ignored = own_facts(facts_path(workspace))
    warnings = () if ignored is None else (ignored,)
    if _recorded(earlier, run_id):
        return Recorded(None, f"run {run_id} was recorded already (or measured nothing)")  # nothing read again
    found = measured(layout, slurm) if reading is None else measure(*reading)
    if not found.succeeded:
        return Recorded(None, "the run has not succeeded (not every shard has a winner)", warnings)
    at = _stamp(now or datetime.now(UTC))
    wrote = False

    def change(facts: Facts) -> Facts:
        nonlocal wrote
        if _recorded(facts, run_id):  # another ddslurm recorded it meanwhile
            return facts
        for model in found.models:
            facts = facts.with_model_run(msgspec.structs.replace(model, run_id=run_id, measured_at=at))
        if found.recipe is not None:  # medians with the earlier runs' (what it did not measure cleanly: theirs)
            facts = facts.with_recipe_run(msgspec.structs.replace(found.recipe, run_id=run_id, measured_at=at))
        wrote = bool(found.models) or found.recipe is not None
        return facts

    update_facts(facts_path(workspace), change, wait_s=lock_wait_s)
    if not wrote:
        return Recorded(None, f"run {run_id} was recorded already (or measured nothing)", warnings)
    return Recorded(found, warnings=warnings)


def _recorded(facts: Facts, run_id: str) -> bool:
    """Whether any fact of the workspace came from run ``run_id``."""
    return any(f.run_id == run_id for f in facts.models) or any(f.run_id == run_id for f in facts.recipes)


def record_after(
    layout: RunLayout,
    slurm: Slurm | None,
    err: TextIO,
    *,
    reading: Reading | None = None,
    lock_wait_s: float = LOCK_WAIT_S,
) -> None:
    """:func:`record_facts` for a command that saw the run end: never fails it, nor waits for ever on the facts'
    lock (``lock_wait_s``): a warning line on ``err`` instead."""
    workspace = run_workspace(layout)
    if workspace is None:
        return
    try:
        recorded = record_facts(workspace, layout, slurm, reading=reading, lock_wait_s=lock_wait_s)
    except Exception as exc:  # measuring is a by-product: the command's own result stands
        err.write(f"warning: the run's facts were not recorded in {facts_path(workspace)}: {exc}\n")
        return
    for warning in recorded.warnings:
        err.write(f"warning: {warning}\n")
    if recorded.measured is not None and recorded.measured.unclean:
        err.write(f"note: {recorded.measured.unclean} ({facts_path(workspace)})\n")
