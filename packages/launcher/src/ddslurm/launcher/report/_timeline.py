"""When a run's attempts waited, queued, started, generated and published (:func:`timeline`), the spans they
generated in, and the records of every stage over time (:func:`throughput`); a set of spans counted once where
they overlap (:func:`union`, :func:`length`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from datetime import datetime, timedelta

from ddslurm.config import SubmissionRecord, attempt_job
from ddslurm.launcher.report._model import (
    AttemptSpan,
    BatchPoint,
    Phase,
    PhaseName,
    RateBin,
    StageRate,
    iso,
    iso_or_none,
    moment,
)
from ddslurm.launcher.report._read import AttemptFacts, RunFacts

Span = tuple[datetime, datetime]
Key = tuple[int, str | None, str]


def union(spans: Iterable[Span]) -> list[Span]:
    """The spans merged where they overlap or touch, in order."""
    merged: list[Span] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def length(spans: Iterable[Span]) -> float:
    """Seconds covered by at least one of the spans (their union's length: overlaps counted once)."""
    return sum(((end - start).total_seconds() for start, end in union(spans)), 0.0)


def _stage_name(item: AttemptFacts, staged: bool) -> str | None:
    return ("gpu" if item.stage == 0 else "cpu") if staged else None


def attempt_key(item: AttemptFacts, staged: bool) -> Key:
    """An attempt as the timeline names it: shard, stage (``gpu``, ``cpu``, or None), attempt id."""
    return item.record.shard, _stage_name(item, staged), item.record.attempt


def generating_spans(spans: list[AttemptSpan]) -> dict[Key, Span]:
    """Each attempt's generating span (serving ready, or its start, to its last batch), by shard, stage, attempt."""
    out: dict[Key, Span] = {}
    for span in spans:
        for phase in span.phases:
            start, end = moment(phase.start), moment(phase.end)
            if phase.name == "generating" and start is not None and end is not None:
                out[(span.shard, span.stage, span.attempt)] = (start, end)
    return out


# --- the timeline ---


def _phase(name: PhaseName, start: datetime | None, end: datetime | None) -> Phase | None:
    if start is None or end is None or end < start:
        return None
    return Phase(name=name, start=iso(start), end=iso(end), seconds=(end - start).total_seconds())


def _submission_of(item: AttemptFacts, subs: list[SubmissionRecord]) -> SubmissionRecord | None:
    record = item.record
    if item.array_task is not None:
        for sub in subs:
            if sub.array_job_id == item.array_task.array_job_id:
                return sub
    started = moment(record.started_at)
    covering = [
        s
        for s in subs
        if record.shard in s.shards and (started is None or (moment(s.submitted_at) or started) <= started)
    ]
    return covering[-1] if covering else None


def _serving_ready(item: AttemptFacts) -> datetime | None:
    """The first time the attempt's batch output says serving was ready within the attempt's own span."""
    started = moment(item.record.started_at)
    ended = moment(item.record.ended_at)
    for at in item.serving_ready:
        if started is None or at < started or (ended is not None and at > ended):
            continue
        return at
    return None


def timeline(facts: RunFacts) -> list[AttemptSpan]:
    staged = len(facts.plan.stages) > 1
    spans: list[AttemptSpan] = []
    ended_by_job: dict[str, list[datetime]] = {}
    gpu_ended: list[datetime] = []  # a two-stage run's GPU-stage attempts: the CPU stage's arrays wait for them
    for item in facts.attempts:
        if (end := moment(item.record.ended_at)) is not None:
            ended_by_job.setdefault(item.record.job_id, []).append(end)
            if staged and item.stage == 0:
                gpu_ended.append(end)
    for item in facts.attempts:
        record = item.record
        started = moment(record.started_at)
        ended = moment(record.ended_at)
        sub = _submission_of(item, facts.submissions)
        submitted = moment(sub.submitted_at) if sub is not None else None
        # in a pulling allocation, a later shard waited for an earlier one, not in the queue
        before = [e for e in ended_by_job.get(record.job_id, []) if started is not None and e <= started]
        queued_from = max(before) if before else submitted
        # a CPU-stage array waits for the GPU stage (its dependency) before it is queued at all
        awaited = [e for e in gpu_ended if staged and item.stage is None and started is not None and e <= started]
        waited_until = max(awaited) if awaited and submitted is not None and max(awaited) > submitted else None
        ready = _serving_ready(item)
        last_batch = item.batches[-1][0] if item.batches else None
        winner = facts.gpu_winners.get(record.shard) if item.stage == 0 else facts.winners.get(record.shard)
        won = winner is not None and winner.attempt == record.attempt
        published = moment(winner.published_at) if winner is not None and won else None
        generating_from = ready or started
        generating_to = last_batch if (won and last_batch is not None) else (ended or last_batch)
        phases = [
            _phase("waiting", queued_from if not before else None, waited_until),
            _phase("queued", (waited_until or queued_from) if not before else None, started),
            _phase("startup", started, ready),
            _phase("generating", generating_from, generating_to),
            _phase("publishing", last_batch, published) if won else None,
        ]
        if record.spare:  # begun in a running allocation, its client waited for a worker's slot, then generated
            generating_at = moment(record.generating_at)
            phases = [
                _phase("spare", started, generating_at or ended),
                _phase("generating", generating_at, generating_to),
                _phase("publishing", last_batch, published) if won else None,
            ]
        spans.append(
            AttemptSpan(
                shard=record.shard,
                attempt=record.attempt,
                job=attempt_job(record),
                node=record.node,
                state=record.state,
                reason=record.reason,
                rows=record.rows,
                winner=won,
                submitted_at=sub.submitted_at if sub is not None else None,
                started_at=record.started_at,
                serving_ready_at=iso_or_none(ready),
                last_batch_at=iso_or_none(last_batch),
                ended_at=record.ended_at,
                published_at=winner.published_at if won and winner is not None else None,
                phases=[p for p in phases if p is not None],
                stage=_stage_name(item, staged),
            )
        )
    return sorted(spans, key=lambda s: (s.shard, s.started_at))


# --- records over time ---

_ROUND_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""Bin widths the records-over-time chart may take: round numbers of seconds, so its bars line up with the time
axis' ticks."""


def bin_width(span_s: float, bins: int) -> int:
    """The smallest round width (:data:`_ROUND_S`, else whole days) that covers ``span_s`` in at most ``bins``
    bins (one more when the first is aligned earlier)."""
    wanted = span_s / max(bins, 1)
    for width in _ROUND_S:
        if width >= wanted:
            return width
    return 86400 * math.ceil(wanted / 86400)


def _clipped(spans: list[Span], start: datetime, end: datetime) -> float:
    """Seconds of ``spans`` (a union: no overlaps) within ``start``..``end``."""
    return sum(max(0.0, (min(e, end) - max(s, start)).total_seconds()) for s, e in spans)


def _spread(data: list[AttemptFacts], active: dict[Key, Span], staged: bool) -> list[tuple[datetime, datetime, int]]:
    """Each batch as (from, to, rows): the rows it added, made from the attempt's previous batch (its first: from
    the start of its generating span) to the batch."""
    out: list[tuple[datetime, datetime, int]] = []
    for item in data:
        span = active.get(attempt_key(item, staged))
        previous = span[0] if span is not None else None
        for at, rows in item.batches:
            begun = previous if previous is not None and previous < at else at
            out.append((begun, at, rows))
            previous = at
    return out


def _bin_rows(pieces: list[tuple[datetime, datetime, int]], start: datetime, end: datetime, first: bool) -> float:
    """Rows of ``pieces`` made within ``start``..``end`` (a piece of no length counts in the bin it ends in, the
    end included; ``first``: the first bin, which holds its start too)."""
    rows = 0.0
    for begun, at, n in pieces:
        seconds = (at - begun).total_seconds()
        if seconds <= 0:
            rows += n if start < at <= end or (first and at == start) else 0
        else:
            rows += n * max(0.0, (min(at, end) - max(begun, start)).total_seconds()) / seconds
    return rows


def throughput(
    facts: RunFacts, active: dict[Key, Span], bins: int = 24
) -> tuple[list[BatchPoint], list[RateBin], list[StageRate]]:
    """Every batch of every stage (its stage's running total), each stage's rows over the union of its attempts'
    generating spans, and the same over time: at most about ``bins`` bins of one round width (:func:`bin_width`)
    from the first attempt's start to the run's last batch, each its stage's rows made in it over the time of it
    its stage was generating, so that the bars agree with the stage's rate."""
    staged = len(facts.plan.stages) > 1
    groups: list[tuple[str | None, list[AttemptFacts]]] = (
        [("gpu", [d for d in facts.attempts if d.stage == 0]), ("cpu", [d for d in facts.attempts if d.stage is None])]
        if staged
        else [(None, facts.attempts)]
    )
    points: list[BatchPoint] = []
    stages: list[StageRate] = []
    pieces_of: list[tuple[str | None, list[tuple[datetime, datetime, int]], list[Span]]] = []
    for stage, data in groups:
        steps = sorted((at, d.record.shard, d.record.attempt, rows) for d in data for at, rows in d.batches)
        total = 0
        for at, shard, attempt, rows in steps:
            total += rows
            points.append(BatchPoint(at=iso(at), shard=shard, attempt=attempt, rows=rows, total=total, stage=stage))
        spans = union(a for d in data if (a := active.get(attempt_key(d, staged))) is not None)
        busy = length(spans)
        rate = round(total / busy, 3) if total and busy > 0 else None
        stages.append(StageRate(stage=stage, rows=total, active_s=round(busy, 3), records_per_second=rate))
        if steps:
            pieces_of.append((stage, _spread(data, active, staged), spans))
    points.sort(key=lambda p: (p.at, p.stage or ""))
    every = [at for _, pieces, _ in pieces_of for _, at, _ in pieces]
    if not every:
        return points, [], stages
    starts = [t for d in facts.attempts if (t := moment(d.record.started_at)) is not None]
    first, last = min([*starts, *every]), max(every)
    width = bin_width((last - first).total_seconds(), bins)
    origin = datetime.fromtimestamp(math.floor(first.timestamp() / width) * width, first.tzinfo)
    count = max(1, math.ceil((last - origin).total_seconds() / width))
    edges = [origin + timedelta(seconds=width * i) for i in range(count + 1)]
    rate_bins: list[RateBin] = []
    for stage, pieces, spans in pieces_of:
        for start, end in itertools.pairwise(edges):
            made, generating = _bin_rows(pieces, start, end, start == origin), _clipped(spans, start, end)
            rate_bins.append(
                RateBin(
                    start=iso(start),
                    end=iso(end),
                    rows=round(made, 3),
                    generating_s=round(generating, 3),
                    rate=round(made / generating, 3) if generating > 0 else None,
                    stage=stage,
                )
            )
    return points, rate_bins, stages
