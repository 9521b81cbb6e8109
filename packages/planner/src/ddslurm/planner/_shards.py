"""The one function that decides every shard's records and, with a seed dataset, places the shard boundaries so
that each shard has a block of seed rows.

Which rows a shard of records ``[a, b)`` reads is config's rule (:func:`ddslurm.config.shard_seed_rows`): a shard
reproduces the unsharded run exactly when it stays inside one cycle of the recipe's selection of ``M`` rows
(``a % M + (b - a) <= M``) or starts where a cycle starts (``a % M == 0``). :func:`plan_shards` places the
boundaries so that every shard satisfies one of the two, keeping the sizes as even as those rules allow: sizes
differ by at most one whenever the records fit in one cycle (``num_records <= M``); otherwise shards hold whole
cycles or parts of one cycle.
"""

from __future__ import annotations

import heapq
import itertools

from ddslurm.config import SeedRows, ShardSpec, shard_seed_rows
from ddslurm.planner.errors import PlanError


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


def plan_shards(num_records: int, shards: int, seed: SeedRows | None = None) -> tuple[ShardSpec, ...]:
    """Every shard's records and its block of ``seed`` (the recipe's selection of seed rows). Without a seed:
    contiguous ranges whose sizes differ by at most one."""
    if shards < 1:
        raise PlanError(f"shards must be at least 1, got {shards}")
    if shards > num_records:
        raise PlanError(f"shards ({shards}) exceeds num_records ({num_records}); every shard needs a record")
    if seed is None:
        return tuple(
            ShardSpec(index=i, first_record=first, num_records=size)
            for i, (first, size) in enumerate(_even(0, num_records, shards))
        )
    if seed.rows < 1 or seed.start < 0:
        raise PlanError(f"the seed dataset's selection has {seed.rows} rows; Data Designer needs at least one")
    specs: list[ShardSpec] = []
    for index, (first, size) in enumerate(_ranges(num_records, shards, seed.rows)):
        try:  # _ranges never places a shard without a block; refuse rather than read the wrong rows
            rows = shard_seed_rows(seed, first, size)
        except ValueError as exc:
            raise PlanError(f"shard {index}: {exc}") from None
        specs.append(
            ShardSpec(index=index, first_record=first, num_records=size, seed_start=rows.start, seed_end=rows.end)
        )
    return tuple(specs)
