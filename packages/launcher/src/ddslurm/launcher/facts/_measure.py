"""What a finished run measured, as workspace facts (:class:`~ddslurm.config.ModelFact` per deployment,
:class:`~ddslurm.config.RecipeFact` for the recipe), made of the report's reading of the run
(:func:`~ddslurm.launcher.report._read.read_run`) and its numbers (:func:`~ddslurm.launcher.report._numbers.numbers`),
so every number is computed once, the way the report shows it.

- load time (per deployment; the allocation's, as the controller logs it): the median over GPU allocations of
  ``serving.ready`` minus the first ``server.started`` before it (the controller's events in
  ``logs/slurm-*.out``): the slowest replica and the proxies of the allocation, as a run waits for them;
- requests per second (per deployment): the alias's requests (Data Designer's usage summaries) over the sum, over
  its replicas in every allocation, of the seconds each had a request in flight (its busy log): the throughput of a
  replica *while busy*, not over the allocation's life. Without a busy log an allocation counts its attempts'
  generating span for each replica;
- requests per record (per alias): requests over the rows the run generated (its last stage's);
- allocation overhead: the median over GPU allocations of sacct's elapsed minus the load minus the allocation's
  generating span (the union of its attempts' generating phases), at least 0;
- CPU-stage records per second (two-stage runs): the CPU stage's rows over its generating seconds over the most
  CPU-stage attempts that generated at once (its workers);
- client CPU per request: the CPU-seconds of the GPU-stage client steps that wrote ``client-usage.json`` over
  their requests to deployed aliases; None when none wrote one.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec

from ddslurm.config import (
    PER_ALIAS,
    SERVING_READY,
    ClientUsage,
    ConfigError,
    ModelFact,
    ModelShape,
    Plan,
    RecipeFact,
    RunLayout,
    batch_output_task,
    engine_flags,
    read_json,
)
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.report._model import AttemptSpan, RunReport, moment
from ddslurm.launcher.report._numbers import numbers
from ddslurm.launcher.report._read import AttemptFacts, RunFacts, json_lines, read_run
from ddslurm.launcher.report._timeline import Span, length
from ddslurm.launcher.report._usage import usage_alias

SERVER_STARTED = "server.started"
"""The controller's event when it starts a server step (``logs/slurm-*.out``); ``timestamp``."""


@dataclass(frozen=True, slots=True)
class Measured:
    """What :func:`measured` found: the facts, and whether the run succeeded (only then are they recorded)."""

    succeeded: bool
    models: list[ModelFact] = field(default_factory=list)
    recipe: RecipeFact | None = None
    unclean: str | None = None
    """Why the run's allocation time is no clean measure (attempts that failed, were cancelled or ran out of time):
    then no model fact, no allocation overhead and no CPU-stage rate is recorded from it, only what each attempt's
    own summary measured (requests per record, client CPU per request)."""


def measure_run(layout: RunLayout, slurm: Slurm | None) -> tuple[list[ModelFact], RecipeFact | None]:
    """The facts a finished run measured (``slurm``: asked once, for the accounting of its allocations)."""
    found = measured(layout, slurm)
    return found.models, found.recipe


def measured(layout: RunLayout, slurm: Slurm | None, *, now: datetime | None = None) -> Measured:
    facts = read_run(layout, slurm)
    return measure(facts, numbers(facts, now=now), now=now)


def measure(facts: RunFacts, report: RunReport, *, now: datetime | None = None) -> Measured:
    """The facts of a run's reading and its report's numbers (pure)."""
    plan = facts.plan
    at = (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds")
    succeeded = bool(plan.shards) and all(s.index in facts.winners for s in plan.shards)
    loads = allocation_loads(facts)
    recipe = _recipe(facts, report, loads, at)
    faults = Counter(a.record.reason or a.record.state for a in facts.attempts if a.record.state in _FAULTED)
    if faults:
        spent = ", ".join(f"{reason} x{n}" for reason, n in sorted(faults.items()))
        unclean = (
            f"attempts of the run did not end cleanly ({spent}): the time of its allocations is no clean measure, "
            "so its model servers' rates, its allocation overhead and its CPU-stage rate are not recorded"
        )
        if recipe is not None:
            recipe = msgspec.structs.replace(recipe, allocation_overhead_s=None, cpu_stage_records_per_s=None)
        return Measured(succeeded=succeeded, recipe=recipe, unclean=unclean)
    return Measured(succeeded=succeeded, models=_models(plan, report, loads, at), recipe=recipe)


_FAULTED = frozenset({"failed", "cancelled"})
"""Attempt states after which a run's allocation time is no clean measure (a hang until the time limit, a kill,
an outage waited out): a ``superseded`` or ``partial`` attempt ended on its own."""


def allocation_loads(facts: RunFacts) -> dict[str, list[float]]:
    """Per GPU allocation (``<array>_<task>``, as its batch output is named), the seconds from the first
    ``server.started`` to the ``serving.ready`` after it, for each time it started its servers (a requeued
    allocation's incarnations each once). Only array tasks' batch outputs are read
    (:func:`~ddslurm.config.batch_output_task`)."""
    cpu_arrays = {s.array_job_id for s in facts.submissions if s.stage == 1}
    loads: dict[str, list[float]] = {}
    for log in sorted(facts.layout.logs.glob("slurm-*.out")):
        task = batch_output_task(log)
        if task is None or task.array_job_id in cpu_arrays:
            continue
        name = str(task)
        first: datetime | None = None
        for event in json_lines(log):
            when = moment(event.get("timestamp"))
            if when is None:
                continue
            if event.get("event") == SERVER_STARTED and first is None:
                first = when
            elif event.get("event") == SERVING_READY and first is not None:
                loads.setdefault(name, []).append(max(0.0, (when - first).total_seconds()))
                first = None
    return loads


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(statistics.median(values), 3) if values else None


def _models(plan: Plan, report: RunReport, loads: dict[str, list[float]], at: str) -> list[ModelFact]:
    if plan.serving is None or report.gpu is None:
        return []
    load = _median(s for each in loads.values() for s in each)
    requests = {m.alias: m.requests for m in report.models if m.local}
    found: list[ModelFact] = []
    for dep in plan.serving.deployments:
        busy = 0.0
        for allocation in report.gpu.allocations:
            if allocation.replicas:
                busy += sum(r.busy_s for r in allocation.replicas if r.alias == dep.alias)
            else:  # no busy log: each replica counted busy over the allocation's generating span
                busy += allocation.busy_s * len(dep.replicas)
        asked = requests.get(dep.alias, 0)
        rate = round(asked / busy, 4) if busy > 0 else 0.0
        if load is None or dep.capacity is None or rate <= 0:
            continue  # nothing asked, no busy time, or a rate too small to keep (a 0 that no later read accepts)
        shape = ModelShape.of(dep, plan.gpu_type)
        found.append(
            ModelFact(
                shape=shape,
                load_s=load,
                requests_per_s=rate,
                capacity=dep.capacity,
                flags=engine_flags(dep.extra_args),
                measured_by="run",
                run_id=plan.run_id,
                measured_at=at,
            )
        )
    return found


def _on_gpus(plan: Plan, item: AttemptFacts) -> bool:
    """The attempt ran in a GPU allocation: the GPU stage of a two-stage run, or any attempt of a run with models."""
    return plan.serving is not None and (item.stage == 0 or len(plan.stages) < 2)


def _generating(span: AttemptSpan) -> Span | None:
    for phase in span.phases:
        start, end = moment(phase.start), moment(phase.end)
        if phase.name == "generating" and start is not None and end is not None:
            return start, end
    return None


def _overhead(report: RunReport, loads: dict[str, list[float]]) -> float | None:
    """The median over GPU allocations that sacct accounted and whose load is known of elapsed - load - generating."""
    if report.gpu is None:
        return None
    elapsed: dict[str, float] = {}
    for job in report.gpu.jobs:
        elapsed[job.job] = elapsed.get(job.job, 0.0) + job.elapsed_s
    overheads: list[float] = []
    for allocation in report.gpu.allocations:
        name = allocation.job
        if name not in elapsed or not loads.get(name):
            continue
        spans = [g for s in report.timeline if s.job == name and s.stage != "cpu" if (g := _generating(s)) is not None]
        overheads.append(max(0.0, elapsed[name] - sum(loads[name]) - length(spans)))
    return _median(overheads)


def _most_at_once(spans: list[Span]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _cpu_stage_rate(report: RunReport) -> float | None:
    stage = next((s for s in report.stages if s.stage == "cpu"), None)
    if stage is None or stage.rows <= 0 or stage.active_s <= 0:
        return None
    spans = [g for s in report.timeline if s.stage == "cpu" if (g := _generating(s)) is not None]
    workers = _most_at_once(spans)
    rate = round(stage.rows / stage.active_s / workers, 4) if workers else 0.0
    return rate if rate > 0 else None


def _client_cpu(facts: RunFacts) -> float | None:
    """CPU-seconds of the GPU-stage client steps that wrote their usage over their requests to deployed aliases."""
    plan = facts.plan
    local = {d.alias for d in plan.serving.deployments} if plan.serving is not None else set()
    served = {d.served_model_name: d.alias for d in plan.serving.deployments} if plan.serving is not None else {}
    cpu, requests, written = 0.0, 0, False
    for item in facts.attempts:
        if not _on_gpus(plan, item):
            continue
        record = item.record
        path = facts.layout.stage_shard(record.shard, item.stage).attempt(record.attempt).client_usage
        try:
            usage = read_json(path, ClientUsage)
        except (FileNotFoundError, ConfigError):
            continue
        written = True
        cpu += usage.cpu_s - usage.setup_cpu_s  # the imports before generation are no request's cost
        parsed = item.client_out
        if parsed is not None:
            requests += sum(u.requests for u in parsed.usage if usage_alias(parsed, u.model, served)[0] in local)
    return round(cpu / requests, 6) if written and requests > 0 else None


def _per_record(facts: RunFacts) -> dict[str, dict[str, float]]:
    """Per alias, the requests (``requests_per_record``) and the input and output tokens of their answers
    (``input_tokens_per_record``, ``output_tokens_per_record``) of the attempts whose Data Designer summary says
    how many they sent, over the rows those same attempts generated themselves (their rows less those resumed from
    an earlier attempt): a killed attempt's rows, which a later one resumed, never count without its requests
    (issue 35: 0.70-0.85 where 1.0 is true); in a two-stage run, over the rows of the stages the alias was used in.
    Each empty when no attempt with a summary generated a row."""
    plan = facts.plan
    served = {d.served_model_name: d.alias for d in plan.serving.deployments} if plan.serving is not None else {}
    counted: dict[str, list[int]] = {}  # alias -> requests, input tokens, output tokens
    rows: dict[int | None, int] = {}  # by stage: a two-stage run writes its rows once in each
    stages: dict[str, set[int | None]] = {}
    for item in facts.attempts:
        parsed = item.client_out
        own = (item.record.rows or 0) - item.record.resumed_rows
        if parsed is None or not parsed.usage or own <= 0:
            continue
        rows[item.stage] = rows.get(item.stage, 0) + own
        for u in parsed.usage:
            alias = usage_alias(parsed, u.model, served)[0]
            total = counted.setdefault(alias, [0, 0, 0])
            total[0], total[1], total[2] = total[0] + u.requests, total[1] + u.input_tokens, total[2] + u.output_tokens
            stages.setdefault(alias, set()).add(item.stage)
    out: dict[str, dict[str, float]] = {name: {} for name in PER_ALIAS}
    for alias, totals in counted.items():
        alias_rows = sum(rows[st] for st in stages[alias])
        for name, n in zip(PER_ALIAS, totals, strict=True):
            out[name][alias] = round(n / alias_rows, 4)
    return out


def _recipe(facts: RunFacts, report: RunReport, loads: dict[str, list[float]], at: str) -> RecipeFact | None:
    plan = facts.plan
    if report.rows_generated <= 0 or not report.models:
        return None
    per_record = _per_record(facts)
    return RecipeFact(
        recipe_sha256=plan.recipe_facts_key(),
        requests_per_record=per_record["requests_per_record"]
        or {m.alias: round(m.requests / report.rows_generated, 4) for m in report.models},
        input_tokens_per_record=per_record["input_tokens_per_record"],
        output_tokens_per_record=per_record["output_tokens_per_record"],
        client_cpu_s_per_request=_client_cpu(facts),
        allocation_overhead_s=_overhead(report, loads),
        cpu_stage_records_per_s=_cpu_stage_rate(report),
        measured_by="run",
        run_id=plan.run_id,
        measured_at=at,
    )
