"""The report's numbers (:class:`~._model.RunReport`) made of a run's facts (:class:`~._read.RunFacts`): the
timeline of every attempt, records over time, usage per model, GPU-hours, failures by reason and the dataset's
columns. Pure: :func:`run_report` reads the facts (:func:`~._read.read_run`), the rest only computes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ddslurm.config import RunLayout, SubmissionRecord
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher.report._client_out import ClientOut
from ddslurm.launcher.report._model import (
    AttemptSpan,
    BatchPoint,
    ColumnReport,
    DatasetReport,
    FailureGroup,
    GpuUsage,
    JobAccounting,
    ModelUsage,
    Phase,
    PhaseName,
    RateBin,
    RunReport,
    iso,
    iso_or_none,
    moment,
    seconds_between,
)
from ddslurm.launcher.report._read import AttemptFacts, ParquetColumnFacts, RunFacts, read_run


def run_report(
    layout: RunLayout, slurm: Slurm | None = None, *, now: datetime | None = None, bins: int = 24
) -> RunReport:
    """The report's numbers. ``slurm``: the scheduler to ask for accounting (one ``sacct`` call for all of the
    run's arrays); None reads nothing from the scheduler and takes GPU time from the attempt records."""
    return numbers(read_run(layout, slurm), now=now, bins=bins)


def numbers(facts: RunFacts, *, now: datetime | None = None, bins: int = 24) -> RunReport:
    plan, data = facts.plan, facts.attempts
    spans = _timeline(facts)
    # A two-stage run's rows are written twice (GPU stage, then CPU stage): its records/s counts the final ones.
    batches, rate, generated = _throughput([d for d in data if d.stage is None], bins)
    models, notes = _models(facts)
    times = [t for s in spans for p in s.phases for t in (moment(p.start), moment(p.end)) if t is not None]
    times += [t for s in spans if (t := moment(s.ended_at)) is not None]
    submitted = sorted(s.submitted_at for s in facts.submissions)
    first = moment(submitted[0]) if submitted else (min(times) if times else None)
    last = max(times) if times else None
    starts = [t for item in data if (t := moment(item.record.started_at)) is not None]
    last_batch = moment(batches[-1].at) if batches else None
    per_second = None
    if starts and last_batch is not None and last_batch > min(starts):
        per_second = round(generated / (last_batch - min(starts)).total_seconds(), 3)
    gpu = _gpu(facts, spans)
    if gpu.source != "sacct" and plan.serving is not None:
        notes.append("Slurm's accounting (sacct) could not be read: GPU-hours allocated are the attempts' own spans")
    return RunReport(
        run_id=plan.run_id,
        run_name=plan.run_name,
        run_dir=str(facts.layout.root),
        generated_at=iso(now or datetime.now(UTC)),
        records_requested=plan.num_records,
        records_done=sum(w.rows for w in facts.winners.values()),
        shards=len(plan.shards),
        shards_done=len(facts.winners),
        attempts=len(data),
        first_submitted_at=iso_or_none(first),
        last_event_at=iso_or_none(last),
        wall_s=seconds_between(first, last),
        rows_generated=generated,
        records_per_second=per_second,
        timeline=spans,
        batches=batches,
        rate=rate,
        models=models,
        gpu=gpu,
        failures=_failures(data),
        dataset=_dataset(facts),
        columns=_columns(facts),
        notes=notes,
    )


# --- the timeline ---


def _phase(name: PhaseName, start: datetime | None, end: datetime | None) -> Phase | None:
    if start is None or end is None or end < start:
        return None
    return Phase(name=name, start=iso(start), end=iso(end), seconds=(end - start).total_seconds())


def _submission_of(item: AttemptFacts, subs: list[SubmissionRecord]) -> SubmissionRecord | None:
    record = item.record
    if item.array_task is not None:
        array = item.array_task.split("_", 1)[0]
        for sub in subs:
            if sub.array_job_id == array:
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


def _timeline(facts: RunFacts) -> list[AttemptSpan]:
    staged = len(facts.plan.stages) > 1
    spans: list[AttemptSpan] = []
    ended_by_job: dict[str, list[datetime]] = {}
    for item in facts.attempts:
        if (end := moment(item.record.ended_at)) is not None:
            ended_by_job.setdefault(item.record.job_id, []).append(end)
    for item in facts.attempts:
        record = item.record
        started = moment(record.started_at)
        ended = moment(record.ended_at)
        sub = _submission_of(item, facts.submissions)
        submitted = moment(sub.submitted_at) if sub is not None else None
        # in a pulling allocation, a later shard waited for an earlier one, not in the queue
        before = [e for e in ended_by_job.get(record.job_id, []) if started is not None and e <= started]
        queued_from = max(before) if before else submitted
        ready = _serving_ready(item)
        last_batch = item.batches[-1][0] if item.batches else None
        winner = facts.gpu_winners.get(record.shard) if item.stage == 0 else facts.winners.get(record.shard)
        won = winner is not None and winner.attempt == record.attempt
        published = moment(winner.published_at) if winner is not None and won else None
        generating_from = ready or started
        generating_to = last_batch if (won and last_batch is not None) else (ended or last_batch)
        phases = [
            _phase("queued", queued_from if not before else None, started),
            _phase("startup", started, ready),
            _phase("generating", generating_from, generating_to),
            _phase("publishing", last_batch, published) if won else None,
        ]
        spans.append(
            AttemptSpan(
                shard=record.shard,
                attempt=record.attempt,
                job=item.array_task or record.job_id,
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
                stage=("gpu" if item.stage == 0 else "cpu") if staged else None,
            )
        )
    return sorted(spans, key=lambda s: (s.shard, s.started_at))


# --- records over time ---


def _throughput(data: list[AttemptFacts], bins: int = 24) -> tuple[list[BatchPoint], list[RateBin], int]:
    steps: list[tuple[datetime, int, str, int]] = []
    for item in data:
        steps.extend((at, item.record.shard, item.record.attempt, rows) for at, rows in item.batches)
    steps.sort()
    points: list[BatchPoint] = []
    total = 0
    for at, shard, attempt, rows in steps:
        total += rows
        points.append(BatchPoint(at=iso(at), shard=shard, attempt=attempt, rows=rows, total=total))
    if not steps:
        return points, [], 0
    starts = [t for item in data if (t := moment(item.record.started_at)) is not None]
    first = min([*starts, steps[0][0]])
    last = steps[-1][0]
    span = max((last - first).total_seconds(), 1e-3)
    width = span / bins
    counts = [0] * bins
    for at, _, _, rows in steps:
        counts[min(bins - 1, int((at - first).total_seconds() / width))] += rows
    rate = [
        RateBin(
            start=iso(first + (last - first) * (i / bins)),
            end=iso(first + (last - first) * ((i + 1) / bins)),
            rows=n,
            rate=round(n / width, 3),
        )
        for i, n in enumerate(counts)
    ]
    return points, rate, total


# --- models ---


def _models(facts: RunFacts) -> tuple[list[ModelUsage], list[str]]:
    plan = facts.plan
    local = {d.alias: d for d in plan.serving.deployments} if plan.serving is not None else {}
    served = {d.served_model_name: d.alias for d in local.values()}
    usage: dict[str, ModelUsage] = {}
    notes: list[str] = []
    without = 0
    for item in facts.attempts:
        parsed = item.client_out
        if parsed is None:
            continue
        if not parsed.usage and item.record.client_runs:
            without += 1

        def entry_of(model: str, parsed: ClientOut = parsed) -> ModelUsage:
            alias, provider = parsed.aliases.get(model, (served.get(model, model), None))
            if alias not in usage:
                usage[alias] = ModelUsage(alias=alias, model=model, provider=provider, local=alias in local)
            return usage[alias]

        for model, checks in parsed.health_checks.items():
            entry_of(model).health_checks += checks
        for u in parsed.usage:
            entry = entry_of(u.model)
            entry.summaries += 1
            entry.requests += u.requests
            entry.successful += u.successful
            entry.failed += u.failed
            entry.input_tokens += u.input_tokens
            entry.output_tokens += u.output_tokens
            entry.total_tokens += u.total_tokens
            entry.tokens_per_second += u.tps
    for entry in usage.values():
        entry.error_rate = round(entry.failed / entry.requests, 4) if entry.requests else 0.0
        entry.tokens_per_second = round(entry.tokens_per_second, 1)
    if without:
        notes.append(
            f"{without} attempt(s) ran the generation step without a Data Designer usage summary in client.out "
            "(killed or failed before Data Designer returned): their requests are not counted"
        )
    if usage:
        notes.append(
            "requests are those of Data Designer's usage summaries; its health checks (one request per model each "
            "time the generation step starts) are counted apart; latency per request is not in its summary"
        )
    return sorted(usage.values(), key=lambda m: (not m.local, m.alias)), notes


# --- GPU time ---


def _on_gpus(spans: list[AttemptSpan]) -> list[AttemptSpan]:
    """The attempts that held the GPUs: all of a single-stage run's, a two-stage run's GPU-stage ones."""
    return [span for span in spans if span.stage != "cpu"]


def _generating_seconds(spans: list[AttemptSpan]) -> dict[str, float]:
    """Seconds of generation (serving ready → end of generation) per attempt id, of the attempts on the GPUs."""
    out: dict[str, float] = {}
    for span in _on_gpus(spans):
        key = f"{span.shard}/{span.stage or ''}/{span.attempt}"
        out[key] = sum(p.seconds for p in span.phases if p.name == "generating")
    return out


def _gpu(facts: RunFacts, spans: list[AttemptSpan]) -> GpuUsage:
    plan, subs = facts.plan, facts.submissions
    plan_gpus = plan.serving.gpus if plan.serving is not None else 0
    generating = sum(_generating_seconds(spans).values()) * plan_gpus / 3600
    jobs: list[JobAccounting] = []
    cpu_arrays = {s.array_job_id for s in subs if s.stage == 1}  # a two-stage run's CPU stage: no GPU
    if facts.accounting is not None:
        for row in facts.accounting:
            # a cluster that does not account gres/gpu: the plan's request (none for the CPU stage's jobs)
            gpus = row.gpus or (0 if row.job_id in cpu_arrays else plan_gpus)
            name = f"{row.job_id}_{row.task}" if row.task is not None else row.job_id
            jobs.append(JobAccounting(job=name, state=row.state, elapsed_s=row.elapsed_s, gpus=gpus))
        allocated = sum(j.elapsed_s * j.gpus for j in jobs) / 3600
    else:
        seconds = 0.0
        for span in _on_gpus(spans):
            if (spent := seconds_between(moment(span.started_at), moment(span.ended_at))) is not None:
                seconds += spent
        allocated = seconds * plan_gpus / 3600
    return GpuUsage(
        allocated_gpu_hours=round(allocated, 6),
        generating_gpu_hours=round(generating, 6),
        utilisation=round(generating / allocated, 4) if allocated > 0 else None,
        source="sacct" if facts.accounting is not None else "attempt records",
        jobs=jobs,
    )


# --- failures ---


def _failures(data: list[AttemptFacts]) -> list[FailureGroup]:
    groups: dict[str, FailureGroup] = {}
    for item in data:
        record = item.record
        if record.state not in ("failed", "partial", "cancelled"):
            continue
        reason = record.reason or record.state
        group = groups.setdefault(reason, FailureGroup(reason=reason, count=0, shards=[], attempts=[]))
        group.count += 1
        if record.shard not in group.shards:
            group.shards.append(record.shard)
        group.attempts.append(record.attempt)
        group.message = group.message or record.message
    return sorted(groups.values(), key=lambda g: (-g.count, g.reason))


# --- the dataset ---


def _dataset(facts: RunFacts) -> DatasetReport | None:
    manifest = facts.manifest
    if manifest is None:
        return None
    return DatasetReport(
        path=str(facts.layout.dataset),
        rows=manifest.rows,
        files=len(manifest.files),
        bytes=sum(f.size for f in manifest.files),
        partial_shards=[s.shard for s in manifest.shards if s.partial],
    )


def _stat_text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parquet_columns(files: list[ParquetColumnFacts]) -> dict[str, ColumnReport]:
    """The dataset's columns from its Parquet statistics: rows, nulls (unknown once a chunk does not count them),
    and the extremes over every chunk (those of the first chunks where later ones cannot be compared)."""
    columns: dict[str, ColumnReport] = {}
    extremes: dict[str, tuple[Any, Any]] = {}
    for column in files:
        path = column.path
        entry = columns.setdefault(
            path,
            ColumnReport(
                name=path,
                type=column.physical_type
                if column.logical_type in ("None", "")
                else f"{column.logical_type} ({column.physical_type})",
                rows=0,
                nulls=0,
            ),
        )
        for chunk in column.chunks:
            entry.rows = (entry.rows or 0) + chunk.rows
            if not chunk.statistics:
                entry.nulls = None
                continue
            if entry.nulls is not None:
                entry.nulls = entry.nulls + chunk.null_count if chunk.null_count is not None else None
            if chunk.min_max is not None:
                low, high = chunk.min_max
                lo, hi = extremes.get(path, (low, high))
                try:
                    extremes[path] = (min(lo, low), max(hi, high))
                except TypeError:
                    extremes[path] = (lo, hi)
    for path, (lo, hi) in extremes.items():
        columns[path].min, columns[path].max = _stat_text(lo), _stat_text(hi)
    return columns


def _columns(facts: RunFacts) -> list[ColumnReport]:
    """The Parquet columns, with Data Designer's per-shard analysis (``column_statistics``) added to them."""
    columns = _parquet_columns(facts.parquet)
    histograms: dict[str, dict[str, int]] = {}
    weights: dict[str, dict[str, tuple[float, int]]] = {}
    for statistics in facts.analyses:
        for stat in statistics:
            if not isinstance(stat, dict) or not isinstance(stat.get("column_name"), str):
                continue
            name = stat["column_name"]
            entry = columns.setdefault(name, ColumnReport(name=name, type=stat.get("pyarrow_dtype")))
            entry.column_type = stat.get("column_type") or entry.column_type
            if isinstance(stat.get("num_unique"), int):
                entry.unique_max = max(entry.unique_max or 0, stat["num_unique"])
            records = stat.get("num_records") if isinstance(stat.get("num_records"), int) else 0
            for key in ("output_tokens_mean", "input_tokens_mean"):
                if isinstance(stat.get(key), (int, float)) and records:
                    total, n = weights.setdefault(name, {}).get(key, (0.0, 0))
                    weights[name][key] = (total + float(stat[key]) * records, n + records)
            hist = (stat.get("distribution") or {}).get("histogram") if stat.get("distribution") else None
            if isinstance(hist, dict):
                merged = histograms.setdefault(name, {})
                for category, count in zip(hist.get("categories") or [], hist.get("counts") or [], strict=False):
                    merged[str(category)] = merged.get(str(category), 0) + int(count)
    for name, merged in histograms.items():
        columns[name].top_values = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    for name, means in weights.items():
        for key, (total, n) in means.items():
            setattr(columns[name], key, round(total / n, 3))
    return list(columns.values())
