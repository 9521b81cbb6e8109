"""The arrays a submission makes: chunks of shards (or of pulling allocations) under MaxArraySize, the automatic
retry levels after each, and a two-stage run's CPU-stage arrays; the dependencies between them."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import msgspec

from ddslurm.config import Plan, PlannedArray, RunLayout, SubmissionKind, SubmissionRecord
from ddslurm.planner._cpu_stage import cpu_stage_tasks
from ddslurm.planner.errors import LimitError, PlanError


def array_spec(count: int, throttle: int | None) -> str:
    """The ``--array=`` spec of an array of ``count`` tasks (ids 0 to count-1), ``%throttle`` appended."""
    spec = f"0-{count - 1}" if count > 1 else "0"
    return f"{spec}%{throttle}" if throttle else spec


def array_tasks(array: PlannedArray | SubmissionRecord) -> int:
    """Array tasks (jobs) of an array: its pulling allocations, or one per shard."""
    return array.tasks if array.tasks is not None else len(array.shards)


def pulling_tasks(plan: Plan, shards: int, kind: SubmissionKind) -> int | None:
    """Allocations of a pulling array over ``shards`` shards (None: one task per shard). The initial submission
    has the plan's ``allocations``; a retry as many as its shards need (``client_workers`` each), no more."""
    if plan.allocations is None:
        return None
    if kind == "initial":
        return min(plan.allocations, shards)
    return max(1, min(plan.allocations, -(-shards // plan.client_workers)))


def _split(items: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """``items`` in ``parts`` contiguous pieces whose sizes differ by at most one."""
    size, extra = divmod(len(items), parts)
    out: list[tuple[int, ...]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(items[start:end]))
        start = end
    return out


def plan_arrays(
    plan: Plan,
    layout: RunLayout,
    shards: Sequence[int],
    max_array_size: int,
    *,
    kind: SubmissionKind,
    stamp: str,
    gpu_done: Collection[int] = (),
) -> tuple[PlannedArray, ...]:
    """The arrays that submit ``shards``: chunks of at most ``max_array_size`` tasks (task ids stay below
    MaxArraySize) and, for the run's initial submission, ``retries`` automatic retry arrays per chunk, each
    after the previous array of its chunk. Every chunk's first array comes first, so that a submission stopped
    part-way has started as many shards as it could.

    With pulling allocations (the plan's ``allocations``) a chunk is an array of allocations over a pool of
    shards: its tasks claim the pool's shards until none is left.

    A two-stage run (the plan's ``stages``): each of those arrays runs the GPU stage, and is followed by a CPU-stage
    array over the same shards (``stage`` 1), a pulling array of CPU-only allocations (as many as the GPU array
    has tasks, fewer when each runs several shards at once: ``cpu_stage_tasks``), that starts when the GPU array
    has ended however it ended (``afterany``), and after the previous CPU-stage array of its chunk, so that it
    claims what that one left. ``gpu_done`` (a retry): shards whose GPU stage has a result get only a CPU-stage
    array."""
    if max_array_size < 1:
        raise LimitError(f"MaxArraySize is {max_array_size}: this cluster accepts no job arrays")
    staged = len(plan.stages) > 1
    cpu_only = [s for s in shards if s in set(gpu_done)] if staged else []
    shards = [s for s in shards if s not in set(cpu_only)]
    pulling = pulling_tasks(plan, len(shards), kind) if shards else None
    chunks: list[tuple[tuple[int, ...], int | None]]
    if pulling is None:
        chunks = [(tuple(shards[i : i + max_array_size]), None) for i in range(0, len(shards), max_array_size)]
    else:
        parts = -(-pulling // max_array_size)
        sizes = [len(p) for p in _split(range(pulling), parts)]
        chunks = [(pool, tasks) for pool, tasks in zip(_split(list(shards), parts), sizes, strict=True)]
    levels = 1 + (plan.retries if kind == "initial" else 0)
    arrays: list[PlannedArray] = []
    previous: list[int | None] = [None] * len(chunks)
    for level in range(levels):
        for c, (part, tasks) in enumerate(chunks):
            index = len(arrays)
            arrays.append(
                PlannedArray(
                    index=index,
                    kind=kind if level == 0 else "auto-retry",
                    shards=part,
                    tasks=tasks,
                    array=array_spec(tasks if tasks is not None else len(part), plan.max_concurrent),
                    after=previous[c],
                    script=str(layout.array_script(stamp, index)),
                )
            )
            previous[c] = index
    if not staged:
        return tuple(arrays)
    return _with_cpu_stage(plan, layout, arrays, cpu_only, max_array_size, kind=kind, stamp=stamp)


def _with_cpu_stage(
    plan: Plan,
    layout: RunLayout,
    gpu: Sequence[PlannedArray],
    cpu_only: Sequence[int],
    max_array_size: int,
    *,
    kind: SubmissionKind,
    stamp: str,
) -> tuple[PlannedArray, ...]:
    """``gpu`` (GPU-stage arrays), each followed by its CPU-stage array; first the CPU-stage arrays of
    ``cpu_only`` (shards whose GPU stage is done)."""
    out: list[PlannedArray] = []

    def cpu_array(shards: tuple[int, ...], tasks: int, array_kind: SubmissionKind, after: tuple[int, ...]) -> int:
        index = len(out)
        out.append(
            PlannedArray(
                index=index,
                kind=array_kind,
                shards=shards,
                tasks=tasks,
                array=array_spec(tasks, plan.max_concurrent),
                script=str(layout.array_script(stamp, index)),
                stage=1,
                after_any=after,
            )
        )
        return index

    for start in range(0, len(cpu_only), max_array_size):
        part = tuple(cpu_only[start : start + max_array_size])
        cpu_array(part, cpu_stage_tasks(plan, len(part), plan.allocations or len(part)), kind, ())
    moved: dict[int, int] = {}
    last_cpu: dict[tuple[int, ...], int] = {}
    for array in gpu:
        index = len(out)
        moved[array.index] = index
        after = None if array.after is None else moved[array.after]
        script = str(layout.array_script(stamp, index))
        out.append(msgspec.structs.replace(array, index=index, after=after, script=script, stage=0))
        previous = last_cpu.get(array.shards)
        depends = (index,) if previous is None else (index, previous)
        tasks = cpu_stage_tasks(plan, len(array.shards), array_tasks(array))
        last_cpu[array.shards] = cpu_array(array.shards, tasks, array.kind, depends)
    return tuple(out)


def failure_chain(arrays: Iterable[PlannedArray], array: PlannedArray, *, whole: bool = True) -> tuple[int, ...]:
    """The planned arrays whose failure an automatic retry array waits for (``--dependency=afternotok:...``):
    the array it follows, then every earlier level of its chain back to the chunk's first array, nearest first.
    Every one must have failed: when level 0 succeeds Slurm cancels level 1, and a level 2 that followed level 1
    alone would count that cancellation as a failure and start. ``()``: an array that follows none. ``arrays``:
    every array of the submission plan (the chain's earlier levels among them); without ``whole``, the chain as
    far as ``arrays`` knows it, else a :class:`PlanError` when one is missing."""
    by_index = {a.index: a for a in arrays}
    chain: list[int] = []
    step = array.after
    while step is not None:
        if not whole and step not in by_index:
            return (*chain, step)
        if step in chain or step not in by_index:
            raise PlanError(f"array {array.index} of the plan follows array {step}, which the plan does not have")
        chain.append(step)
        step = by_index[step].after
    return tuple(chain)
