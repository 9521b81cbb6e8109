"""The report's numbers (:class:`~._model.RunReport`) made of a run's facts (:class:`~._read.RunFacts`): the
timeline of every attempt, records over time, usage per model, GPU-hours, failures by reason and the dataset's
columns. Pure: :func:`run_report` reads the facts (:func:`~._read.read_run`), the rest only computes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from ddslurm.config import Plan, Prediction, RunLayout, ServingPlan, SubmissionRecord, attempt_job
from ddslurm.launcher._hosted_spend import HostedSpend
from ddslurm.launcher._slurm import Accounting, Slurm
from ddslurm.launcher.report._client_out import ClientOut
from ddslurm.launcher.report._model import (
    AllocationGpu,
    AttemptSpan,
    BatchPoint,
    ColumnReport,
    Compared,
    DatasetReport,
    FailureGroup,
    GpuUsage,
    HostedKeyReport,
    HostedMinute,
    HostedModelReport,
    HostedReport,
    JobAccounting,
    ModelUsage,
    Phase,
    PhaseName,
    PredictedMeasured,
    RateBin,
    ReplicaGpu,
    RunReport,
    StageRate,
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
    run's arrays); None reads nothing from the scheduler, and the GPU time allocated is then unknown."""
    return numbers(read_run(layout, slurm), now=now, bins=bins)


Span = tuple[datetime, datetime]
Key = tuple[int, str | None, str]


def numbers(facts: RunFacts, *, now: datetime | None = None, bins: int = 24) -> RunReport:
    plan, data = facts.plan, facts.attempts
    spans = _timeline(facts)
    active = _active(spans)
    batches, rate, stages = _throughput(facts, active, bins)
    # A two-stage run's rows are written twice (GPU stage, then CPU stage): its records/s counts the final ones,
    # over the time anything was generating (either stage).
    generated = stages[-1].rows if stages else 0
    models, notes = _models(facts, active)
    times = [t for s in spans for p in s.phases for t in (moment(p.start), moment(p.end)) if t is not None]
    times += [t for s in spans if (t := moment(s.ended_at)) is not None]
    submitted = sorted(s.submitted_at for s in facts.submissions)
    first = moment(submitted[0]) if submitted else (min(times) if times else None)
    last = max(times) if times else None
    busy = length(active.values())
    per_second = round(generated / busy, 3) if generated and busy > 0 else None
    gpu, gpu_notes = _gpu(facts, active)
    notes += gpu_notes
    gpu = _priced(gpu, plan)
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
        stages=stages,
        timeline=spans,
        batches=batches,
        rate=rate,
        models=models,
        gpu=gpu,
        predicted=predicted_measured(plan.prediction, spans, gpu) if plan.serving is not None else None,
        hosted=None if facts.hosted is None else hosted_report(facts.hosted),
        failures=_failures(data),
        dataset=_dataset(facts),
        columns=_columns(facts),
        notes=notes,
    )


def _priced(gpu: GpuUsage, plan: Plan) -> GpuUsage:
    """``gpu`` with its allocated GPU-hours' money, when the run's price file prices the generation partition."""
    prices, partition = plan.prices, plan.generation.partition
    price = prices.partitions.get(partition) if prices is not None and partition is not None else None
    if prices is None or price is None or price.gpu_hour is None or gpu.allocated_gpu_hours is None:
        return gpu
    return msgspec.structs.replace(
        gpu, allocated_cost=gpu.allocated_gpu_hours * price.gpu_hour, currency=prices.currency
    )


def hosted_report(spend: HostedSpend) -> HostedReport:
    """The report's hosted-key section of what the run's gates recorded."""
    names = {k.key: k.provider for k in spend.keys}
    models = [
        HostedModelReport(
            provider=m.provider,
            key_env=m.key_env,
            model=m.model,
            aliases=list(m.aliases),
            requests=m.spent.requests,
            succeeded=m.spent.succeeded,
            limited=m.spent.limited,
            failed=m.spent.failed,
            unanswered=m.spent.unanswered,
            unreached=m.spent.unreached,
            input_tokens=m.spent.input_tokens,
            output_tokens=m.spent.output_tokens,
            cost=m.spent_cost,
            kept_requests=m.kept.requests,
            kept_input_tokens=m.kept.input_tokens,
            kept_output_tokens=m.kept.output_tokens,
            kept_cost=m.kept_cost,
        )
        for m in spend.models
    ]
    keys = [
        HostedKeyReport(
            provider=k.provider,
            key_env=k.key_env,
            requests_per_minute=k.requests_per_minute,
            tokens_per_minute=k.tokens_per_minute,
            in_flight=k.in_flight,
            stated_in_flight=k.stated_in_flight,
            stated_requests_per_minute=k.stated_requests_per_minute,
            stated_tokens_per_minute=k.stated_tokens_per_minute,
        )
        for k in spend.keys
    ]
    minutes = [
        HostedMinute(provider=names.get(m.key, m.key), start=iso(datetime.fromtimestamp(m.start, UTC)),
                     requests=m.requests, limited=m.limited)
        for m in spend.minutes
    ]  # fmt: skip
    kept = [m.kept_cost for m in spend.models if m.kept_cost is not None]
    return HostedReport(
        currency=spend.currency,
        models=models,
        keys=keys,
        minutes=minutes,
        cost=spend.spent_cost,
        kept_cost=sum(kept) if kept else None,
        kept_rows=spend.kept_rows,
        cost_per_1000_kept_rows=spend.cost_per_1000_kept_rows,
        unpriced=list(spend.unpriced),
    )


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


def _key(item: AttemptFacts, staged: bool) -> Key:
    """An attempt as the timeline names it: shard, stage (``gpu``, ``cpu``, or None), attempt id."""
    return item.record.shard, _stage_name(item, staged), item.record.attempt


def _active(spans: list[AttemptSpan]) -> dict[Key, Span]:
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


def _timeline(facts: RunFacts) -> list[AttemptSpan]:
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


def _throughput(
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
        spans = [a for d in data if (a := active.get(_key(d, staged))) is not None]
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


# --- models ---


def usage_alias(parsed: ClientOut, model: str, served: dict[str, str]) -> tuple[str, str | None]:
    """The alias and provider a usage summary's model name stands for: as the model-config lines above it say,
    else the deployment that serves that name (``served``: served model name -> alias), else the name itself."""
    return parsed.aliases.get(model, (served.get(model, model), None))


def _models(facts: RunFacts, active: dict[Key, Span]) -> tuple[list[ModelUsage], list[str]]:
    """Usage per alias summed over every attempt's summaries; its tokens per second over the union of the
    generating spans of the attempts that used it."""
    plan = facts.plan
    staged = len(plan.stages) > 1
    used: dict[str, list[Span]] = {}
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
            alias, provider = usage_alias(parsed, model, served)
            if alias not in usage:
                usage[alias] = ModelUsage(alias=alias, model=model, provider=provider, local=alias in local)
            return usage[alias]

        for model, checks in parsed.health_checks.items():
            entry_of(model).health_checks += checks
        span = active.get(_key(item, staged))
        for u in parsed.usage:
            entry = entry_of(u.model)
            if span is not None:
                used.setdefault(entry.alias, []).append(span)
            entry.summaries += 1
            entry.requests += u.requests
            entry.successful += u.successful
            entry.failed += u.failed
            entry.input_tokens += u.input_tokens
            entry.output_tokens += u.output_tokens
            entry.total_tokens += u.total_tokens
    for entry in usage.values():
        entry.error_rate = round(entry.failed / entry.requests, 4) if entry.requests else 0.0
        if entry.alias in used:
            busy = length(used[entry.alias])
            entry.active_s = round(busy, 3)
            entry.tokens_per_second = round(entry.total_tokens / busy, 1) if busy > 0 else None
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


def _allocation(item: AttemptFacts) -> str:
    """The allocation an attempt ran in, named as sacct names it (``<array>_<task>``), else its job id."""
    return attempt_job(item.record)


def _replicas(serving: ServingPlan, logged: dict[tuple[str, int], list[Span]]) -> list[ReplicaGpu]:
    """Every replica of the plan with the seconds its busy log covers, to the millisecond (0 without one: it never
    had work)."""
    return [
        ReplicaGpu(
            alias=d.alias,
            replica=r.index,
            gpus=d.replica_gpus,
            busy_s=round(length(logged.get((d.alias, r.index), [])), 3),
        )
        for d in serving.deployments
        for r in d.replicas
    ]


def _gpu(facts: RunFacts, active: dict[Key, Span]) -> tuple[GpuUsage, list[str]]:
    """GPU time allocated (sacct) and generating: per allocation that held GPUs, the sum over its replicas of the
    union of the spans in which the replica had work (its busy log) x the replica's GPUs; without any busy log,
    the union of its attempts' generating spans x its GPUs; at most what sacct allocated it."""
    plan, subs = facts.plan, facts.submissions
    staged = len(plan.stages) > 1
    plan_gpus = plan.serving.gpus if plan.serving is not None else 0
    cpu_arrays = {s.array_job_id for s in subs if s.stage == 1}  # a two-stage run's CPU stage: no GPU
    jobs: list[JobAccounting] = []
    accounted: dict[str, list[Accounting]] = {}
    for row in facts.accounting or []:
        # a cluster that does not account gres/gpu: the plan's request (none for the CPU stage's jobs)
        gpus = row.gpus or (0 if row.job_id in cpu_arrays else plan_gpus)
        name = f"{row.job_id}_{row.task}" if row.task is not None else row.job_id
        jobs.append(JobAccounting(job=name, state=row.state, elapsed_s=row.elapsed_s, gpus=gpus))
        accounted.setdefault(name, []).append(row)
    on_gpus = [d for d in facts.attempts if plan_gpus and (d.stage == 0 or not staged)]
    by_allocation: dict[str, list[AttemptFacts]] = {}
    for item in on_gpus:
        by_allocation.setdefault(_allocation(item), []).append(item)
    allocations: list[AllocationGpu] = []
    for name, items in by_allocation.items():
        logged: dict[tuple[str, int], list[Span]] = {}
        for folder in sorted({i.serving_dir for i in items if i.serving_dir}):
            for replica, spans in facts.busy.get(folder, {}).items():
                logged.setdefault(replica, []).extend(spans)
        rows = accounted.get(name, [])
        gpus = max((r.gpus for r in rows), default=0) or plan_gpus
        allocated = float(sum(r.elapsed_s * (r.gpus or plan_gpus) for r in rows)) if rows else None
        # Behind proxies (every plan since they were), the busy logs are the whole truth: an allocation with none
        # had no request in flight, so it generated nothing (a hosted judge that hung until the time limit), not
        # "its attempts' spans". Only plans from before the proxies fall back to the attempts.
        proxied = plan.serving is not None and all(d.proxy for d in plan.serving.deployments)
        replicas = _replicas(plan.serving, logged) if (logged or proxied) and plan.serving is not None else []
        source: Literal["proxy", "attempts"] = "proxy" if replicas else "attempts"
        if replicas:
            busy_s = length(span for spans in logged.values() for span in spans)
            generating = sum(r.busy_s * r.gpus for r in replicas)
        else:
            busy_s = length(active[k] for k in (_key(i, staged) for i in items) if k in active)
            generating = busy_s * gpus
        clamped = allocated is not None and generating > allocated
        allocations.append(
            AllocationGpu(
                job=name,
                gpus=gpus,
                allocated_s=allocated,
                busy_s=round(busy_s, 3),
                busy_from=source,
                generating_gpu_s=round(min(generating, allocated) if allocated is not None else generating, 3),
                clamped=clamped,
                replicas=replicas,
            )
        )
    allocations.sort(key=lambda a: [int(p) if p.isdigit() else 0 for p in a.job.split("_")])
    generating_h = sum(a.generating_gpu_s for a in allocations) / 3600
    allocated_h = sum(j.elapsed_s * j.gpus for j in jobs) / 3600 if facts.accounting is not None else None
    notes: list[str] = []
    if facts.accounting is None and plan.serving is not None:
        notes.append(
            "Slurm's accounting (sacct) could not be read: GPU-hours allocated, and the share of them spent "
            "generating, are unknown (not estimated); GPU-hours generating are each replica's GPUs x its busy spans"
        )
    if cut := [a.job for a in allocations if a.clamped]:
        notes.append(
            f"GPU time generating of allocation(s) {', '.join(cut)} came out above what sacct allocated them "
            "(clocks of the node and of the accounting differ): cut to the allocated time"
        )
    if plan.serving is not None and (guessed := [a.job for a in allocations if a.busy_from == "attempts"]):
        notes.append(
            f"no proxy busy log for allocation(s) {', '.join(guessed)}: their GPU time generating is the union of "
            "their attempts' generating spans (serving ready to the last batch)"
        )
    usage = GpuUsage(
        allocated_gpu_hours=round(allocated_h, 6) if allocated_h is not None else None,
        generating_gpu_hours=round(generating_h, 6),
        utilisation=round(generating_h / allocated_h, 4) if allocated_h else None,
        source="sacct" if facts.accounting is not None else "none",
        jobs=jobs,
        allocations=allocations,
    )
    return usage, notes


# --- predicted and measured ---


def measured_wall_s(spans: list[AttemptSpan]) -> float | None:
    """Seconds from the first GPU allocation's start (its first attempt's) to the last winner's publication (the
    run's result complete); None before any winner is published."""
    starts = [t for s in spans if s.stage != "cpu" if (t := moment(s.started_at)) is not None]
    published = [t for s in spans if s.winner if (t := moment(s.published_at)) is not None]
    if not starts or not published:
        return None
    return round((max(published) - min(starts)).total_seconds(), 3)


def _compared(what: Any, predicted: float, measured: float | None) -> Compared:
    ratio = round(measured / predicted, 3) if measured is not None and predicted > 0 else None
    return Compared(what=what, predicted=predicted, measured=measured, ratio=ratio)


def predicted_measured(
    prediction: Prediction | None, spans: list[AttemptSpan], gpu: GpuUsage
) -> PredictedMeasured | None:
    """The chosen layout's predicted wall time, GPU-hours and GPU-busy beside the measured ones; None without a
    prediction."""
    if prediction is None:
        return None
    chosen = prediction.chosen
    return PredictedMeasured(
        allocations=chosen.allocations,
        rows=[
            _compared("wall time (s)", chosen.wall_s, measured_wall_s(spans)),
            _compared("GPU-hours", chosen.gpu_hours, gpu.allocated_gpu_hours),
            _compared("GPU-busy", chosen.gpu_busy, gpu.utilisation),
        ],
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


def _label_stages(facts: RunFacts, columns: dict[str, ColumnReport]) -> None:
    """A two-stage run's columns labelled by the stage that generated them; the GPU stage's with their kind as the
    GPU stage's own analysis gives it (the CPU stage reads them as its seed dataset, and says so)."""
    stages = facts.plan.stages
    if len(stages) < 2:
        return
    kinds: dict[str, str] = {}
    for statistics in facts.gpu_analyses:
        for stat in statistics:
            if isinstance(stat, dict) and isinstance(stat.get("column_name"), str) and stat.get("column_type"):
                kinds.setdefault(stat["column_name"], str(stat["column_type"]))
    for stage in stages:
        for name in stage.columns:
            if name not in columns:
                continue
            columns[name].stage = "GPU stage" if stage.kind == "gpu" else "CPU stage"
            if stage.kind == "gpu" and name in kinds:
                columns[name].column_type = kinds[name]


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
    _label_stages(facts, columns)
    for name, merged in histograms.items():
        columns[name].top_values = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    for name, means in weights.items():
        for key, (total, n) in means.items():
            setattr(columns[name], key, round(total / n, 3))
    return list(columns.values())
