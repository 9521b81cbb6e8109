"""When a run's attempts waited, queued, started, generated and published (:func:`timeline`), the spans they
generated in, and the records of every stage over time (:func:`throughput`); a set of spans counted once where
they overlap (:func:`union`, :func:`length`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

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


def throughput(
    facts: RunFacts, active: dict[Key, Span], bins: int = 24
) -> tuple[list[BatchPoint], list[RateBin], list[StageRate]]:
    """Every batch of every stage (its stage's running total), the records per second of each stage in ``bins``
    bins of one width from the first attempt's start to the run's last batch, and each stage's rows over the union
    of its attempts' generating spans."""
    staged = len(facts.plan.stages) > 1
    groups: list[tuple[str | None, list[AttemptFacts]]] = (
        [("gpu", [d for d in facts.attempts if d.stage == 0]), ("cpu", [d for d in facts.attempts if d.stage is None])]
        if staged
        else [(None, facts.attempts)]
    )
    points: list[BatchPoint] = []
    stages: list[StageRate] = []
    steps_of: list[tuple[str | None, list[tuple[datetime, int, str, int]]]] = []
    for stage, data in groups:
        steps = sorted((at, d.record.shard, d.record.attempt, rows) for d in data for at, rows in d.batches)
        total = 0
        for at, shard, attempt, rows in steps:
            total += rows
            points.append(BatchPoint(at=iso(at), shard=shard, attempt=attempt, rows=rows, total=total, stage=stage))
        spans = [a for d in data if (a := active.get(attempt_key(d, staged))) is not None]
        busy = length(spans)
        rate = round(total / busy, 3) if total and busy > 0 else None
        stages.append(StageRate(stage=stage, rows=total, active_s=round(busy, 3), records_per_second=rate))
        steps_of.append((stage, steps))
    points.sort(key=lambda p: (p.at, p.stage or ""))
    every = [at for _, steps in steps_of for at, *_ in steps]
    if not every:
        return points, [], stages
    starts = [t for d in facts.attempts if (t := moment(d.record.started_at)) is not None]
    first, last = min([*starts, *every]), max(every)
    width = max((last - first).total_seconds(), 1e-3) / bins
    rate_bins: list[RateBin] = []
    for stage, steps in steps_of:
        if not steps:
            continue
        counts = [0] * bins
        for at, _, _, rows in steps:
            counts[min(bins - 1, int((at - first).total_seconds() / width))] += rows
        rate_bins += [
            RateBin(
                start=iso(first + (last - first) * (i / bins)),
                end=iso(first + (last - first) * ((i + 1) / bins)),
                rows=n,
                rate=round(n / width, 3),
                stage=stage,
            )
            for i, n in enumerate(counts)
        ]
    return points, rate_bins, stages
