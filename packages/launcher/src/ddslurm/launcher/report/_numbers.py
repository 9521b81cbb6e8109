"""The report's numbers (:class:`~._model.RunReport`) made of a run's facts (:class:`~._read.RunFacts`): the
timeline of every attempt and records over time (:mod:`._timeline`), usage per model, GPU-hours and hosted keys
(:mod:`._usage`), the dataset and its columns (:mod:`._columns`), and here the run's totals, the predicted beside
the measured and failures by reason. Pure: :func:`run_report` reads the facts (:func:`~._read.read_run`), the rest
only computes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ddslurm.config import Prediction, RunLayout
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.report._columns import column_reports, dataset_report, sample_rows
from ddslurm.launcher.report._model import (
    AttemptSpan,
    Compared,
    FailureGroup,
    GpuUsage,
    PredictedMeasured,
    RunReport,
    iso,
    iso_or_none,
    moment,
    seconds_between,
)
from ddslurm.launcher.report._read import AttemptFacts, RunFacts, read_run
from ddslurm.launcher.report._setup import configuration
from ddslurm.launcher.report._timeline import generating_spans, length, throughput, timeline
from ddslurm.launcher.report._usage import cpu_usage, gpu_usage, hosted_report, model_usage, priced


def run_report(
    layout: RunLayout, slurm: Slurm | None = None, *, now: datetime | None = None, bins: int = 24
) -> RunReport:
    """The report's numbers. ``slurm``: the scheduler to ask for accounting (one ``sacct`` call for all of the
    run's arrays); None reads nothing from the scheduler, and the GPU time allocated is then unknown."""
    return numbers(read_run(layout, slurm), now=now, bins=bins)


def numbers(facts: RunFacts, *, now: datetime | None = None, bins: int = 24) -> RunReport:
    plan, data = facts.plan, facts.attempts
    spans = timeline(facts)
    active = generating_spans(spans)
    batches, rate, stages = throughput(facts, active, bins)
    # A two-stage run's rows are written twice (GPU stage, then CPU stage): its records/s counts the final ones,
    # over the time anything was generating (either stage).
    generated = stages[-1].rows if stages else 0
    models, notes = model_usage(facts, active)
    times = [t for s in spans for p in s.phases for t in (moment(p.start), moment(p.end)) if t is not None]
    times += [t for s in spans if (t := moment(s.ended_at)) is not None]
    submitted = sorted(s.submitted_at for s in facts.submissions)
    first = moment(submitted[0]) if submitted else (min(times) if times else None)
    last = max(times) if times else None
    busy = length(active.values())
    per_second = round(generated / busy, 3) if generated and busy > 0 else None
    gpu: GpuUsage | None = None
    if plan.serving is not None:  # a hosted-only run holds no GPU: its CPU time instead (``cpu``)
        gpu, gpu_notes = gpu_usage(facts, active)
        notes += gpu_notes
        gpu = priced(gpu, plan)
    cpu, cpu_notes = cpu_usage(facts)
    notes += cpu_notes
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
        cpu=cpu,
        predicted=predicted_measured(plan.prediction, spans, gpu) if gpu is not None else None,
        hosted=None if facts.hosted is None else hosted_report(facts.hosted),
        failures=_failures(data),
        dataset=dataset_report(facts),
        columns=column_reports(facts),
        sample=sample_rows(facts),
        configuration=configuration(facts),
        notes=notes,
    )


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
