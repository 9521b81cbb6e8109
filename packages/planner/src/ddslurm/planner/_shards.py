"""The one function that decides every shard's records and, with a seed dataset, its block of seed rows.

Data Designer reads a seed dataset through a selection ``[start, end]`` (the whole dataset by default) of
``M`` rows. Record ``j`` of an unsharded run uses seed row ``start + j % M`` with ORDERED sampling; with
SHUFFLE, every ``M`` consecutive records use each row of the selection once (in random order) and the last
``R % M`` records a subset. A shard is given ``IndexRange(seed_start, seed_end)`` and Data Designer cycles
through that range from its first row, so a shard of records ``[a, b)`` reproduces the unsharded run exactly
when either

* it stays inside one cycle of the selection (``a % M + (b - a) <= M``): its range is the rows
  ``a % M .. a % M + (b - a) - 1``, or
* it starts where a cycle starts (``a % M == 0``): its range is the whole selection, cycled.

:func:`plan_shards` places the shard boundaries so that every shard satisfies one of the two, keeping the
sizes as even as those rules allow: sizes differ by at most one whenever the records fit in one cycle
(``num_records <= M``); otherwise shards hold whole cycles or parts of one cycle.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from ddslurm.config import ShardSpec
from ddslurm.planner.errors import PlanError


@dataclass(frozen=True, slots=True)
class SeedPool:
    """The seed rows Data Designer samples from: ``size`` rows starting at row ``start``."""

    start: int
    size: int


def _even(first: int, count: int, shards: int) -> list[tuple[int, int]]:
    base, extra = divmod(count, shards)
    out: list[tuple[int, int]] = []
    for index in range(shards):
        size = base + (1 if index < extra else 0)
        out.append((first, size))
        first += size
    return out


def _ranges(num_records: int, shards: int, cycle: int) -> list[tuple[int, int]]:
    """(first record, records) of each shard, with no shard crossing a cycle boundary unless it starts on one."""
    segments = [(first, min(cycle, num_records - first)) for first in range(0, num_records, cycle)]
    if shards <= len(segments):
        # Fewer shards than cycles: each shard takes whole cycles (it starts on a cycle boundary), the boundaries
        # placed at the cycles nearest to an even split of the records.
        bounds = [0]
        for i in range(1, shards):
            nearest = round(i * num_records / (shards * cycle))
            bounds.append(min(max(nearest, bounds[-1] + 1), len(segments) - (shards - i)))
        bounds.append(len(segments))
        return [(segments[lo][0], sum(size for _, size in segments[lo:hi])) for lo, hi in itertools.pairwise(bounds)]
    # More shards than cycles: every cycle gets shards in proportion to its records (at least one each, at most
    # one per record), and each shard stays inside its cycle.
    counts = [1] * len(segments)
    heap: list[tuple[float, int]] = [(-float(size), index) for index, (_, size) in enumerate(segments) if size > 1]
    heapq.heapify(heap)
    for _ in range(shards - len(segments)):
        _, index = heapq.heappop(heap)  # the cycle whose shards are largest now
        counts[index] += 1
        size = segments[index][1]
        if counts[index] < size:
            heapq.heappush(heap, (-size / counts[index], index))
    out = []
    for (first, size), count in zip(segments, counts, strict=True):
        out.extend(_even(first, size, count))
    return out


def plan_shards(num_records: int, shards: int, seed: SeedPool | None = None) -> tuple[ShardSpec, ...]:
    """Every shard's records and seed block. Without a seed: contiguous ranges whose sizes differ by at most one."""
    if shards < 1:
        raise PlanError(f"shards must be at least 1, got {shards}")
    if shards > num_records:
        raise PlanError(f"shards ({shards}) exceeds num_records ({num_records}); every shard needs a record")
    if seed is None:
        return tuple(
            ShardSpec(index=i, first_record=first, num_records=size)
            for i, (first, size) in enumerate(_even(0, num_records, shards))
        )
    if seed.size < 1 or seed.start < 0:
        raise PlanError(f"the seed dataset's selection has {seed.size} rows; Data Designer needs at least one")
    specs: list[ShardSpec] = []
    for index, (first, size) in enumerate(_ranges(num_records, shards, seed.size)):
        offset = first % seed.size
        rows = seed.size if offset == 0 and size >= seed.size else size
        if offset + rows > seed.size:  # _ranges never does this; refuse rather than read the wrong rows
            raise PlanError(f"shard {index} would cross a cycle of the seed dataset ({first}+{size} of {seed.size})")
        specs.append(
            ShardSpec(
                index=index,
                first_record=first,
                num_records=size,
                seed_start=seed.start + offset,
                seed_end=seed.start + offset + rows - 1,
            )
        )
    return tuple(specs)
