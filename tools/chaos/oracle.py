"""The verdict on a collected dataset: does it equal the fault-free result of the same recipe?

Rows are compared as multisets on their deterministic columns (the stand-ins answer as a function of the
prompt), keyed by what decides a row's content: the seed row (``seed_id``) for seeded recipes, the sampler
values for seedless ones. The reference gives each key's row and, for ORDERED seeds, how often an unsharded run
uses each seed row; SHUFFLE uses every row once per cycle in a random order (and a random subset of the last,
partial cycle), so there the sorted use counts are compared.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def canonical(value: Any) -> str:
    """A value as comparable text: JSON with sorted keys (judge scores are structs), numbers as written."""
    return json.dumps(value, sort_keys=True, default=str)


Row = Mapping[str, Any]


@dataclass(frozen=True)
class Reference:
    """The fault-free result of a recipe: each key's row, and the uses per key of an unsharded run."""

    key_columns: tuple[str, ...]
    rows_by_key: dict[str, str]
    """key → the row's deterministic columns, canonical."""
    expected_counts: dict[str, int] | None
    """key → uses (ORDERED seeds); None where only the total is fixed."""
    records: int
    sorted_counts_only: bool = False
    """SHUFFLE: compare the sorted use counts (which row gets the extra use of a partial cycle is random)."""
    unique_column: str | None = None
    """Seedless: a per-record uuid; a repeated value is a duplicated record, a new one an extra record."""
    ignore_columns: tuple[str, ...] = ()


@dataclass
class Verdict:
    rows: int = 0
    lost: int = 0
    duplicated: int = 0
    changed: int = 0
    allowed_lost: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def reason(self) -> str:
        return "; ".join(self.problems)


def key_of(row: Row, key_columns: Sequence[str]) -> str:
    return canonical([row.get(c) for c in key_columns])


def content_of(row: Row, ignore: Iterable[str]) -> str:
    skip = set(ignore)
    return canonical({k: v for k, v in row.items() if k not in skip})


def build_reference(
    rows: Sequence[Row],
    *,
    key_columns: tuple[str, ...],
    records: int,
    mode: str,
    unique_column: str | None = None,
) -> Reference:
    """From an unsharded run's rows. ``mode``: ``ordered`` (its first ``records`` rows are the expected uses),
    ``shuffle`` (``rows`` cover every seed row; expected: every row ``records // M`` times, ``records % M`` of
    them once more), ``seedless`` (``rows`` cover every sampler combination; expected: ``records`` rows)."""
    ignore = (unique_column,) if unique_column else ()
    by_key: dict[str, str] = {}
    for row in rows:
        by_key.setdefault(key_of(row, key_columns), content_of(row, ignore))
    expected: dict[str, int] | None = None
    if mode == "ordered":
        expected = dict(Counter(key_of(r, key_columns) for r in rows[:records]))
    elif mode == "shuffle":
        keys = sorted(by_key)
        q, r = divmod(records, len(keys))
        expected = {k: q + (1 if i < r else 0) for i, k in enumerate(keys)}
    return Reference(
        key_columns=key_columns,
        rows_by_key=by_key,
        expected_counts=expected,
        records=records,
        sorted_counts_only=mode == "shuffle",
        unique_column=unique_column,
        ignore_columns=ignore,
    )


def judge(reference: Reference, rows: Sequence[Row], *, allowed_lost: int = 0) -> Verdict:
    """Rows lost, duplicated and changed against ``reference``; ``allowed_lost``: rows an accepted partial
    shard explains."""
    verdict = Verdict(rows=len(rows), allowed_lost=allowed_lost)
    changed_keys: list[str] = []
    for row in rows:
        key = key_of(row, reference.key_columns)
        want = reference.rows_by_key.get(key)
        if want is None or want != content_of(row, reference.ignore_columns):
            verdict.changed += 1
            changed_keys.append(key if want is not None else f"{key} (no such row in the reference)")
    got = Counter(key_of(r, reference.key_columns) for r in rows)
    if reference.expected_counts is not None:
        expected = reference.expected_counts
        if reference.sorted_counts_only:
            want_sorted = sorted(expected.values(), reverse=True)
            got_sorted = sorted(got.values(), reverse=True)
            width = max(len(want_sorted), len(got_sorted))
            want_sorted += [0] * (width - len(want_sorted))
            got_sorted += [0] * (width - len(got_sorted))
            pairs = list(zip(want_sorted, got_sorted, strict=True))
        else:
            pairs = [(expected.get(k, 0), got.get(k, 0)) for k in set(expected) | set(got)]
        verdict.lost = sum(max(0, w - g) for w, g in pairs)
        verdict.duplicated = sum(max(0, g - w) for w, g in pairs)
    elif reference.unique_column is not None:
        ids = Counter(r.get(reference.unique_column) for r in rows)
        repeated = sum(n - 1 for n in ids.values())
        verdict.duplicated = repeated + max(0, len(ids) - reference.records)
        verdict.lost = max(0, reference.records - len(ids))
    else:
        verdict.lost = max(0, reference.records - len(rows))
        verdict.duplicated = max(0, len(rows) - reference.records)
    if verdict.lost > allowed_lost:
        verdict.problems.append(
            f"{verdict.lost} row(s) lost ({len(rows)} of {reference.records}"
            + (f", {allowed_lost} explained by accepted partial shards" if allowed_lost else "")
            + ")"
        )
    elif verdict.lost < allowed_lost:
        verdict.problems.append(f"{verdict.lost} row(s) lost but accepted partial shards miss {allowed_lost}")
    if verdict.duplicated:
        verdict.problems.append(f"{verdict.duplicated} row(s) duplicated")
    if verdict.changed:
        verdict.problems.append(f"{verdict.changed} row(s) changed (keys {', '.join(changed_keys[:3])})")
    return verdict
