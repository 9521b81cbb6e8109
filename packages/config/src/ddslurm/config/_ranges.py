"""Lists of shard or task numbers as text (``0-2,5,7-8``): what the batch script passes as ``--pool``, what users
give as ``--shards`` and what Slurm prints for array tasks. One writer, one reader."""

from __future__ import annotations

from collections.abc import Sequence


def compact_ranges(numbers: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``0-2,5,7-8`` (sorted, duplicates dropped); ``""`` for none."""
    parts: list[str] = []
    ordered = sorted(set(numbers))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            lo, hi = ordered[start], ordered[i - 1]
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
            start = i
    return ",".join(parts)


def expand_ranges(spec: str) -> list[int]:
    """``0-3,7,9-10`` → ``[0, 1, 2, 3, 7, 9, 10]``, in the order given; ValueError for anything else."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = (side.strip() for side in part.partition("-"))
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"not a list of numbers and ranges such as 1,3,5-7: {spec!r}")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
