"""Lists of shard or task numbers as text (``0-2,5,7-8``): what the batch script passes as ``--pool``, what users
give as ``--shards`` and what Slurm prints for array tasks. One writer, one reader."""

from __future__ import annotations

from collections.abc import Callable, Sequence


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


MAX_NUMBER = 4_000_000
"""The largest number a list may hold when its caller gives no bound: Slurm's largest array index
(``MaxArraySize`` is at most 4000001)."""


def expand_ranges(
    spec: str,
    *,
    below: int = MAX_NUMBER + 1,
    what: str = "number",
    have: str | None = None,
    error: Callable[[str], Exception] = ValueError,
) -> list[int]:
    """``0-3,7,9-10`` → ``[0, 1, 2, 3, 7, 9, 10]``, in the order given; ValueError for anything else.

    Every number must be below ``below`` (a run's shard count; by default Slurm's largest array), and the list
    may name at most ``below`` numbers in all (only repeats could make more): both are checked on the text,
    before anything is expanded, so ``0-999999999`` costs nothing. Those two are ``error(message)`` (a caller's
    own error class), the message of a number past the bound ``no {what} N: {have}`` (``have`` by default: the
    numbers go from 0 to ``below - 1``)."""
    parts: list[tuple[int, int]] = []
    for part in spec.split(","):
        first, _, last = (side.strip() for side in part.partition("-"))
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"not a list of numbers and ranges such as 1,3,5-7: {spec!r}")
        parts.append((int(first), int(last or first)))
    total = 0
    for lo, hi in parts:
        if max(lo, hi) >= below:
            raise error(
                f"no {what} {max(lo, hi)}: {have if have is not None else f'the {what}s go from 0 to {below - 1}'}"
            )
        total += max(0, hi - lo + 1)
        if total > below:
            raise error(f"lists more {what}s than the {below} there are (it repeats some)")
    out: list[int] = []
    for lo, hi in parts:
        out.extend(range(lo, hi + 1))
    return out
