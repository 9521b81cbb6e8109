"""``ddslurm report``: the numbers of a run (:func:`run_report`, pure reading of the run directory plus one
``sacct``) and a self-contained HTML page of them (:func:`render_html`, charts by plotly with its JavaScript
inlined, so the page opens offline on a login node).

Where each number comes from:

- the timeline: submission records (queued), attempt records (started, ended), the controller's events in the
  array task's batch output (``serving.ready``), the client's ``batch.complete`` events (``client.log``) and the
  winner's ``published_at``;
- records over time: the ``batch.complete`` events (each says the attempt's rows so far), else progress files;
- model usage: Data Designer's ``Model usage summary`` that each generation step prints into ``client.out``
  (per model name; the model-config lines above it name the alias and provider), summed over every attempt;
- GPU-hours: ``sacct`` (elapsed x GPUs of the allocation) against the time from serving ready to the end of
  generation of each attempt;
- failures: attempt records grouped by reason;
- columns: the dataset's Parquet statistics and Data Designer's per-shard analysis (``metadata.json``).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from ddslurm.collector import MANIFEST, read_manifest
from ddslurm.config import (
    BATCH_COMPLETE,
    FILL_DONE,
    SERVING_READY,
    AttemptRecord,
    ConfigError,
    Plan,
    Progress,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    read_json,
    read_plan,
)
from ddslurm.launcher._slurm import Accounting, Slurm
from ddslurm.launcher._status import attempt_records, submissions
from ddslurm.launcher.errors import SlurmError

PhaseName = Literal["queued", "startup", "generating", "publishing"]
PHASES: tuple[PhaseName, ...] = ("queued", "startup", "generating", "publishing")


class Phase(msgspec.Struct, kw_only=True):
    name: PhaseName
    start: str
    end: str
    seconds: float


class AttemptSpan(msgspec.Struct, kw_only=True):
    """One attempt of a shard on the timeline."""

    shard: int
    attempt: str
    job: str
    """The array task (``<array>_<task>``) when known, else the job id."""
    node: str
    state: str
    reason: str | None = None
    rows: int | None = None
    winner: bool = False
    submitted_at: str | None = None
    started_at: str
    serving_ready_at: str | None = None
    last_batch_at: str | None = None
    ended_at: str | None = None
    published_at: str | None = None
    phases: list[Phase] = msgspec.field(default_factory=list)
    stage: str | None = None
    """``gpu`` or ``cpu`` in a two-stage run (``stages: auto``); None in a single-stage run."""


class BatchPoint(msgspec.Struct, kw_only=True):
    at: str
    shard: int
    attempt: str
    rows: int
    """Rows this batch added."""
    total: int
    """Rows of the whole run generated up to and including this batch (every attempt's)."""


class RateBin(msgspec.Struct, kw_only=True):
    start: str
    end: str
    rows: int
    rate: float
    """Records per second in the bin."""


class ModelUsage(msgspec.Struct, kw_only=True):
    alias: str
    model: str
    provider: str | None = None
    local: bool = False
    """Served by a vLLM deployment of the run (else a hosted provider)."""
    summaries: int = 0
    """How many of Data Designer's usage summaries (one per generation step run) mention the model."""
    health_checks: int = 0
    """Requests of Data Designer's health check before generating (one per model per run; not in ``requests``)."""
    requests: int = 0
    successful: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    error_rate: float = 0.0
    latency_s: float | None = None
    """Mean seconds a request took; None: Data Designer's summary does not report it."""
    tokens_per_second: float = 0.0
    """Summed over the summaries' own rates (each over its generation step's time)."""


class JobAccounting(msgspec.Struct, kw_only=True):
    job: str
    state: str
    elapsed_s: int
    gpus: int


class GpuUsage(msgspec.Struct, kw_only=True):
    allocated_gpu_hours: float
    """Elapsed time x GPUs of every allocation of the run's generation arrays (requeued runs included)."""
    generating_gpu_hours: float
    """From serving ready (the attempt's start for hosted-only runs) to the end of generation, x GPUs."""
    utilisation: float | None = None
    source: str = "sacct"
    """``sacct``, or ``attempt records`` when the accounting could not be read (then allocated = attempts' span)."""
    jobs: list[JobAccounting] = msgspec.field(default_factory=list)


class FailureGroup(msgspec.Struct, kw_only=True):
    reason: str
    count: int
    shards: list[int]
    attempts: list[str]
    message: str | None = None


class ColumnReport(msgspec.Struct, kw_only=True):
    name: str
    type: str | None = None
    rows: int | None = None
    nulls: int | None = None
    min: str | None = None
    max: str | None = None
    column_type: str | None = None
    """Data Designer's kind of column (``sampler``, ``llm-text``, ...), from its per-shard analysis."""
    unique_max: int | None = None
    """The largest per-shard count of distinct values (distinct counts of shards cannot be added up)."""
    top_values: list[tuple[str, int]] = msgspec.field(default_factory=list)
    """A categorical column's most common values and their counts over all shards."""
    output_tokens_mean: float | None = None
    input_tokens_mean: float | None = None


class DatasetReport(msgspec.Struct, kw_only=True):
    path: str
    rows: int
    files: int
    bytes: int
    partial_shards: list[int] = msgspec.field(default_factory=list)


class RunReport(msgspec.Struct, kw_only=True):
    run_id: str
    run_name: str
    run_dir: str
    generated_at: str
    records_requested: int
    records_done: int
    """Rows of the shards' winners."""
    shards: int
    shards_done: int
    attempts: int
    first_submitted_at: str | None = None
    last_event_at: str | None = None
    wall_s: float | None = None
    rows_generated: int = 0
    """Rows every attempt generated (batches of attempts that did not win included)."""
    records_per_second: float | None = None
    """Rows generated over the time from the first attempt's start to the last batch."""
    timeline: list[AttemptSpan] = msgspec.field(default_factory=list)
    batches: list[BatchPoint] = msgspec.field(default_factory=list)
    rate: list[RateBin] = msgspec.field(default_factory=list)
    models: list[ModelUsage] = msgspec.field(default_factory=list)
    gpu: GpuUsage | None = None
    failures: list[FailureGroup] = msgspec.field(default_factory=list)
    dataset: DatasetReport | None = None
    columns: list[ColumnReport] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


# --- reading ---


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat()


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON-object lines of a log (other lines, such as Data Designer's, skipped); nothing if it is absent."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            yield obj


_USAGE_HEAD = "Model usage summary:"
_ITEM = re.compile(r"\|-- (?P<key>model|tokens|requests|model alias|model provider): (?P<value>.*)$")
_PAIRS = re.compile(r"(\w+)=([0-9.]+)")


@dataclass(slots=True)
class _Usage:
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    tps: float = 0.0
    successful: int = 0
    failed: int = 0
    requests: int = 0


@dataclass(slots=True)
class ClientOut:
    """What ``client.out`` says about models: the usage summaries and which alias and provider name each model."""

    usage: list[_Usage] = field(default_factory=list)
    aliases: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """Model name → (alias, provider), from the model-config lines Data Designer prints before generating."""
    health_checks: dict[str, int] = field(default_factory=dict)
    """Model name → health-check requests (``👀 Checking 'M' in provider named 'P' for model alias 'A'...``)."""


_CHECK = re.compile(
    r"Checking '(?P<model>[^']+)' in provider named '(?P<provider>[^']+)' for model alias '(?P<alias>[^']+)'"
)


def _message(line: str) -> str:
    """A Data Designer log line without its ``[12:00:00] [INFO] `` prefix."""
    return re.sub(r"^\[[^\]]*\] \[[A-Z]+\] ", "", line.rstrip())


def parse_client_out(text: str) -> ClientOut:
    """Data Designer's usage summaries (``📊 Model usage summary:`` then, per model, ``|-- model: NAME``,
    ``|-- tokens: input=N, output=N[, reasoning=N], total=N, tps=N``, ``|-- requests: success=N, failed=N,
    total=N, rpm=N``) and its model-config lines (``|-- model: 'NAME'``, ``|-- model alias: 'A'``,
    ``|-- model provider: 'P'``)."""
    found = ClientOut()
    in_summary = False
    current: _Usage | None = None
    config_model: str | None = None
    config_alias: str | None = None
    for raw in text.splitlines():
        line = _message(raw)
        if check := _CHECK.search(line):
            model = check.group("model")
            found.health_checks[model] = found.health_checks.get(model, 0) + 1
            found.aliases.setdefault(model, (check.group("alias"), check.group("provider")))
            continue
        if line.endswith(_USAGE_HEAD):
            in_summary, current = True, None
            continue
        m = _ITEM.search(line)
        if m is None:
            if in_summary and not line.rstrip().endswith("|--"):
                in_summary, current = False, None
            continue
        key, value = m.group("key"), m.group("value").strip()
        if in_summary:
            pairs = {k: v for k, v in _PAIRS.findall(value)}
            if key == "model":
                current = _Usage(model=value)
                found.usage.append(current)
            elif key == "tokens" and current is not None:
                current.input_tokens = int(float(pairs.get("input", "0")))
                current.output_tokens = int(float(pairs.get("output", "0")))
                current.total_tokens = int(float(pairs.get("total", "0")))
                current.tps = float(pairs.get("tps", "0"))
            elif key == "requests" and current is not None:
                current.successful = int(float(pairs.get("success", "0")))
                current.failed = int(float(pairs.get("failed", "0")))
                current.requests = int(float(pairs.get("total", "0")))
            continue
        name = value.strip("'\"")
        if key == "model":
            config_model, config_alias = name, None
        elif key == "model alias" and config_model is not None:
            config_alias = name
            found.aliases[config_model] = (name, None)
        elif key == "model provider" and config_model is not None and config_alias is not None:
            found.aliases[config_model] = (config_alias, name)
    return found


def _read(path: Path, kind: type[Any]) -> Any:
    try:
        return read_json(path, kind)
    except (FileNotFoundError, ConfigError, OSError):
        return None


def _array_task(record: AttemptRecord) -> str | None:
    if record.slurm_log:
        m = re.fullmatch(r"slurm-(\d+_\d+)\.out", Path(record.slurm_log).name)
        if m:
            return m.group(1)
    return None


def _phase(name: PhaseName, start: datetime | None, end: datetime | None) -> Phase | None:
    if start is None or end is None or end < start:
        return None
    return Phase(name=name, start=_iso(start), end=_iso(end), seconds=(end - start).total_seconds())


@dataclass(slots=True)
class _AttemptData:
    record: AttemptRecord
    dir: Path
    batches: list[tuple[datetime, int]]
    """(when, rows added) of each batch the attempt completed (fills included)."""
    stage: int | None = None
    """0: the GPU stage of a two-stage run (its rows are generated again by the CPU stage); None: the run's last
    (or only) stage."""


def _submission_of(record: AttemptRecord, subs: list[SubmissionRecord]) -> SubmissionRecord | None:
    task = _array_task(record)
    if task is not None:
        array = task.split("_", 1)[0]
        for sub in subs:
            if sub.array_job_id == array:
                return sub
    started = _time(record.started_at)
    covering = [
        s
        for s in subs
        if record.shard in s.shards and (started is None or (_time(s.submitted_at) or started) <= started)
    ]
    return covering[-1] if covering else None


def _serving_ready(record: AttemptRecord, events: dict[str, list[dict[str, Any]]]) -> datetime | None:
    if not record.slurm_log:
        return None
    if record.slurm_log not in events:
        events[record.slurm_log] = list(json_lines(Path(record.slurm_log)))
    started = _time(record.started_at)
    ended = _time(record.ended_at)
    for event in events[record.slurm_log]:
        if event.get("event") != SERVING_READY:
            continue
        at = _time(event.get("timestamp"))
        if at is None or started is None or at < started or (ended is not None and at > ended):
            continue
        return at
    return None


def _batches(client_log: Path, resumed: int) -> list[tuple[datetime, int]]:
    """(when, rows added) of each ``batch.complete`` (which says the attempt's rows so far, resumed rows included)
    and each ``fill.done`` (rows a fill added) of a client log, in order."""
    out: list[tuple[datetime, int]] = []
    done = resumed
    for event in json_lines(client_log):
        at = _time(event.get("timestamp"))
        if at is None:
            continue
        rows, added = event.get("rows"), event.get("added")
        if event.get("event") == BATCH_COMPLETE and isinstance(rows, int):
            if rows > done:
                out.append((at, rows - done))
            done = max(done, rows)
        elif event.get("event") == FILL_DONE and isinstance(added, int) and added > 0:
            out.append((at, added))
            done += added
    return sorted(out)


def _attempts(layout: RunLayout, plan: Plan) -> list[_AttemptData]:
    """Every attempt of the run: a two-stage run's GPU-stage attempts (``stage-0/``) too."""
    found: list[_AttemptData] = []
    stages: tuple[int | None, ...] = (0, None) if len(plan.stages) > 1 else (None,)
    for spec, stage in ((spec, stage) for spec in plan.shards for stage in stages):
        for record in attempt_records(layout, spec.index, stage):
            attempt_dir = layout.stage_shard(spec.index, stage).attempt(record.attempt).dir
            batches = _batches(attempt_dir / "client.log", record.resumed_rows)
            if not batches:  # an older attempt without a client.log: its progress file, one point
                progress = _read(attempt_dir / "progress.json", Progress)
                at = _time(progress.updated_at) if progress is not None else None
                if progress is not None and at is not None and progress.rows > record.resumed_rows:
                    batches = [(at, progress.rows - record.resumed_rows)]
            found.append(_AttemptData(record, attempt_dir, batches, stage))
    return found


def _timeline(
    data: list[_AttemptData],
    subs: list[SubmissionRecord],
    winners: dict[int, WinnerRecord],
    gpu_winners: dict[int, WinnerRecord] | None = None,
    staged: bool = False,
) -> list[AttemptSpan]:
    events: dict[str, list[dict[str, Any]]] = {}
    spans: list[AttemptSpan] = []
    ended_by_job: dict[str, list[datetime]] = {}
    for item in data:
        if (end := _time(item.record.ended_at)) is not None:
            ended_by_job.setdefault(item.record.job_id, []).append(end)
    for item in data:
        record = item.record
        started = _time(record.started_at)
        ended = _time(record.ended_at)
        sub = _submission_of(record, subs)
        submitted = _time(sub.submitted_at) if sub is not None else None
        # in a pulling allocation, a later shard waited for an earlier one, not in the queue
        before = [e for e in ended_by_job.get(record.job_id, []) if started is not None and e <= started]
        queued_from = max(before) if before else submitted
        ready = _serving_ready(record, events)
        last_batch = item.batches[-1][0] if item.batches else None
        winner = (gpu_winners or {}).get(record.shard) if item.stage == 0 else winners.get(record.shard)
        won = winner is not None and winner.attempt == record.attempt
        published = _time(winner.published_at) if winner is not None and won else None
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
                job=_array_task(record) or record.job_id,
                node=record.node,
                state=record.state,
                reason=record.reason,
                rows=record.rows,
                winner=won,
                submitted_at=sub.submitted_at if sub is not None else None,
                started_at=record.started_at,
                serving_ready_at=_iso(ready) if ready is not None else None,
                last_batch_at=_iso(last_batch) if last_batch is not None else None,
                ended_at=record.ended_at,
                published_at=winner.published_at if won and winner is not None else None,
                phases=[p for p in phases if p is not None],
                stage=("gpu" if item.stage == 0 else "cpu") if staged else None,
            )
        )
    return sorted(spans, key=lambda s: (s.shard, s.started_at))


def _throughput(data: list[_AttemptData], bins: int = 24) -> tuple[list[BatchPoint], list[RateBin], int]:
    steps: list[tuple[datetime, int, str, int]] = []
    for item in data:
        steps.extend((at, item.record.shard, item.record.attempt, rows) for at, rows in item.batches)
    steps.sort()
    points: list[BatchPoint] = []
    total = 0
    for at, shard, attempt, rows in steps:
        total += rows
        points.append(BatchPoint(at=_iso(at), shard=shard, attempt=attempt, rows=rows, total=total))
    if not steps:
        return points, [], 0
    starts = [t for item in data if (t := _time(item.record.started_at)) is not None]
    first = min([*starts, steps[0][0]])
    last = steps[-1][0]
    span = max((last - first).total_seconds(), 1e-3)
    width = span / bins
    counts = [0] * bins
    for at, _, _, rows in steps:
        counts[min(bins - 1, int((at - first).total_seconds() / width))] += rows
    rate = [
        RateBin(
            start=_iso(first + (last - first) * (i / bins)),
            end=_iso(first + (last - first) * ((i + 1) / bins)),
            rows=n,
            rate=round(n / width, 3),
        )
        for i, n in enumerate(counts)
    ]
    return points, rate, total


def _models(data: list[_AttemptData], plan: Plan) -> tuple[list[ModelUsage], list[str]]:
    local = {d.alias: d for d in plan.serving.deployments} if plan.serving is not None else {}
    served = {d.served_model_name: d.alias for d in local.values()}
    usage: dict[str, ModelUsage] = {}
    notes: list[str] = []
    without = 0
    for item in data:
        try:
            text = (item.dir / "client.out").read_text(errors="replace")
        except OSError:
            continue
        parsed = parse_client_out(text)
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


def _gpu(slurm: Slurm | None, plan: Plan, subs: list[SubmissionRecord], spans: list[AttemptSpan]) -> GpuUsage:
    plan_gpus = plan.serving.gpus if plan.serving is not None else 0
    generating = sum(_generating_seconds(spans).values()) * plan_gpus / 3600
    rows: list[Accounting] = []
    source = "sacct"
    if slurm is not None and subs:
        try:
            rows = slurm.accounting(sorted({s.array_job_id for s in subs}, key=int))
        except SlurmError:
            source = "attempt records"
    else:
        source = "attempt records"
    jobs: list[JobAccounting] = []
    cpu_arrays = {s.array_job_id for s in subs if s.stage == 1}  # a two-stage run's CPU stage: no GPU
    if source == "sacct":
        for row in rows:
            # a cluster that does not account gres/gpu: the plan's request (none for the CPU stage's jobs)
            gpus = row.gpus or (0 if row.job_id in cpu_arrays else plan_gpus)
            name = f"{row.job_id}_{row.task}" if row.task is not None else row.job_id
            jobs.append(JobAccounting(job=name, state=row.state, elapsed_s=row.elapsed_s, gpus=gpus))
        allocated = sum(j.elapsed_s * j.gpus for j in jobs) / 3600
    else:
        seconds = 0.0
        for span in _on_gpus(spans):
            start, end = _time(span.started_at), _time(span.ended_at)
            if start is not None and end is not None:
                seconds += (end - start).total_seconds()
        allocated = seconds * plan_gpus / 3600
    return GpuUsage(
        allocated_gpu_hours=round(allocated, 6),
        generating_gpu_hours=round(generating, 6),
        utilisation=round(generating / allocated, 4) if allocated > 0 else None,
        source=source,
        jobs=jobs,
    )


def _failures(data: list[_AttemptData]) -> list[FailureGroup]:
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


def _stat_text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parquet_columns(dataset: Path, files: Iterable[str]) -> dict[str, ColumnReport]:
    import pyarrow.parquet as pq

    columns: dict[str, ColumnReport] = {}
    extremes: dict[str, tuple[Any, Any]] = {}
    for name in files:
        meta = pq.read_metadata(dataset / name)  # type: ignore[no-untyped-call]
        schema = meta.schema
        for i in range(meta.num_columns):
            column = schema.column(i)
            path = column.path
            logical = str(column.logical_type)
            entry = columns.setdefault(
                path,
                ColumnReport(
                    name=path,
                    type=column.physical_type if logical in ("None", "") else f"{logical} ({column.physical_type})",
                    rows=0,
                    nulls=0,
                ),
            )
            for g in range(meta.num_row_groups):
                chunk = meta.row_group(g).column(i)
                entry.rows = (entry.rows or 0) + meta.row_group(g).num_rows
                stats = chunk.statistics
                if stats is None:
                    entry.nulls = None
                    continue
                if entry.nulls is not None:
                    entry.nulls = entry.nulls + stats.null_count if stats.has_null_count else None
                if stats.has_min_max:
                    lo, hi = extremes.get(path, (stats.min, stats.max))
                    try:
                        extremes[path] = (min(lo, stats.min), max(hi, stats.max))
                    except TypeError:
                        extremes[path] = (lo, hi)
    for path, (lo, hi) in extremes.items():
        columns[path].min, columns[path].max = _stat_text(lo), _stat_text(hi)
    return columns


def _analysis(winners: Iterable[WinnerRecord], columns: dict[str, ColumnReport]) -> None:
    """Add Data Designer's per-shard analysis (``metadata.json`` ``column_statistics``) to ``columns``."""
    histograms: dict[str, dict[str, int]] = {}
    weights: dict[str, dict[str, tuple[float, int]]] = {}
    for winner in winners:
        try:
            meta = json.loads((Path(winner.dataset_dir) / "metadata.json").read_text())
        except (OSError, ValueError):
            continue
        for stat in meta.get("column_statistics") or []:
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


def _dataset(layout: RunLayout, winners: dict[int, WinnerRecord]) -> tuple[DatasetReport | None, list[ColumnReport]]:
    columns: dict[str, ColumnReport] = {}
    report: DatasetReport | None = None
    if (layout.dataset / MANIFEST).is_file():
        manifest = read_manifest(layout.dataset)
        names = [f.path for f in manifest.files]
        report = DatasetReport(
            path=str(layout.dataset),
            rows=manifest.rows,
            files=len(names),
            bytes=sum(f.size for f in manifest.files),
            partial_shards=[s.shard for s in manifest.shards if s.partial],
        )
        columns = _parquet_columns(layout.dataset, names)
    _analysis(winners.values(), columns)
    return report, list(columns.values())


def run_report(
    layout: RunLayout, slurm: Slurm | None = None, *, now: datetime | None = None, bins: int = 24
) -> RunReport:
    """The report's numbers. ``slurm``: the scheduler to ask for accounting (one ``sacct`` call for all of the
    run's arrays); None reads nothing from the scheduler and takes GPU time from the attempt records."""
    plan = read_plan(layout.plan)
    subs = submissions(layout)
    winners = {
        spec.index: w for spec in plan.shards if (w := _read(layout.shard(spec.index).winner, WinnerRecord)) is not None
    }
    data = _attempts(layout, plan)
    staged = len(plan.stages) > 1
    gpu_winners = {
        spec.index: w
        for spec in plan.shards
        if staged and (w := _read(layout.shard(spec.index).stage(0).winner, WinnerRecord)) is not None
    }
    spans = _timeline(data, subs, winners, gpu_winners, staged)
    # A two-stage run's rows are written twice (GPU stage, then CPU stage): its records/s counts the final ones.
    batches, rate, generated = _throughput([d for d in data if d.stage is None], bins)
    models, notes = _models(data, plan)
    dataset, columns = _dataset(layout, winners)
    times = [t for s in spans for p in s.phases for t in (_time(p.start), _time(p.end)) if t is not None]
    times += [t for s in spans if (t := _time(s.ended_at)) is not None]
    submitted = sorted(s.submitted_at for s in subs)
    first = _time(submitted[0]) if submitted else (min(times) if times else None)
    last = max(times) if times else None
    starts = [t for item in data if (t := _time(item.record.started_at)) is not None]
    last_batch = _time(batches[-1].at) if batches else None
    per_second = None
    if starts and last_batch is not None and last_batch > min(starts):
        per_second = round(generated / (last_batch - min(starts)).total_seconds(), 3)
    gpu = _gpu(slurm, plan, subs, spans)
    if gpu.source != "sacct" and plan.serving is not None:
        notes.append("Slurm's accounting (sacct) could not be read: GPU-hours allocated are the attempts' own spans")
    return RunReport(
        run_id=plan.run_id,
        run_name=plan.run_name,
        run_dir=str(layout.root),
        generated_at=_iso(now or datetime.now(UTC)),
        records_requested=plan.num_records,
        records_done=sum(w.rows for w in winners.values()),
        shards=len(plan.shards),
        shards_done=len(winners),
        attempts=len(data),
        first_submitted_at=_iso(first) if first is not None else None,
        last_event_at=_iso(last) if last is not None else None,
        wall_s=(last - first).total_seconds() if first is not None and last is not None else None,
        rows_generated=generated,
        records_per_second=per_second,
        timeline=spans,
        batches=batches,
        rate=rate,
        models=models,
        gpu=gpu,
        failures=_failures(data),
        dataset=dataset,
        columns=columns,
        notes=notes,
    )


# --- the page ---

_COLOURS = {"queued": "#9aa5b1", "startup": "#e8a33d", "generating": "#3d7be8", "publishing": "#3dbf6e"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1d2733}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea}
.muted{color:#5f6b7a} .cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{border:1px solid #dde3ea;border-radius:6px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:20px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} td,th{border:1px solid #dde3ea;padding:4px 8px}
th{background:#f3f6f9;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
.chart{min-height:320px}
"""


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{_esc(v)}</td>" for i, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figures(report: RunReport) -> dict[str, Any]:
    import plotly.graph_objects as go

    figures: dict[str, Any] = {}
    if report.timeline:
        fig = go.Figure()
        labels = {id(s): f"shard {s.shard} · {s.attempt}" for s in report.timeline}
        for name in PHASES:
            spans = [(s, p) for s in report.timeline for p in s.phases if p.name == name]
            if not spans:
                continue
            fig.add_trace(
                go.Bar(
                    name=name,
                    orientation="h",
                    y=[labels[id(s)] for s, _ in spans],
                    base=[p.start for _, p in spans],
                    x=[p.seconds * 1000 for _, p in spans],
                    marker_color=_COLOURS[name],
                    customdata=[[s.state, s.reason or "", round(p.seconds, 2), s.job] for s, p in spans],
                    hovertemplate="%{y}<br>"
                    + name
                    + ": %{customdata[2]} s<br>state %{customdata[0]} %{customdata[1]}<br>job %{customdata[3]}"
                    "<extra></extra>",
                )
            )
        fig.update_layout(
            barmode="overlay",
            xaxis={"type": "date", "title": "time (UTC)"},
            yaxis={"autorange": "reversed", "type": "category"},
            height=max(260, 60 + 26 * len(report.timeline)),
            margin={"l": 10, "r": 10, "t": 30, "b": 40},
            legend={"orientation": "h"},
        )
        figures["timeline"] = fig
    if report.batches:
        fig = go.Figure()
        fig.add_trace(
            go.Bar(
                name="records/s",
                x=[b.start for b in report.rate],
                y=[b.rate for b in report.rate],
                width=[_ms(b.start, b.end) for b in report.rate],
                offset=0,
                marker_color="#3d7be8",
                opacity=0.6,
            )
        )
        fig.add_trace(
            go.Scatter(
                name="records generated",
                x=[b.at for b in report.batches],
                y=[b.total for b in report.batches],
                mode="lines+markers",
                line={"shape": "hv", "color": "#1d2733"},
                yaxis="y2",
            )
        )
        fig.update_layout(
            xaxis={"type": "date", "title": "time (UTC)"},
            yaxis={"title": "records/s"},
            yaxis2={"title": "records", "overlaying": "y", "side": "right", "rangemode": "tozero"},
            height=340,
            margin={"l": 10, "r": 10, "t": 30, "b": 40},
            legend={"orientation": "h"},
        )
        figures["throughput"] = fig
    if report.models:
        fig = go.Figure()
        names = [f"{m.alias} ({'local' if m.local else 'hosted'})" for m in report.models]
        fig.add_trace(
            go.Bar(name="successful", x=names, y=[m.successful for m in report.models], marker_color="#3dbf6e")
        )
        fig.add_trace(go.Bar(name="failed", x=names, y=[m.failed for m in report.models], marker_color="#d9534f"))
        fig.update_layout(barmode="stack", yaxis={"title": "requests"}, height=300, margin={"t": 30, "b": 40})
        figures["models"] = fig
    if report.gpu is not None and report.gpu.allocated_gpu_hours > 0:
        fig = go.Figure(
            go.Bar(
                x=["allocated", "generating"],
                y=[report.gpu.allocated_gpu_hours, report.gpu.generating_gpu_hours],
                marker_color=["#9aa5b1", "#3d7be8"],
            )
        )
        fig.update_layout(yaxis={"title": "GPU-hours"}, height=280, margin={"t": 30, "b": 40})
        figures["gpu"] = fig
    if report.failures:
        fig = go.Figure(
            go.Bar(x=[f.reason for f in report.failures], y=[f.count for f in report.failures], marker_color="#d9534f")
        )
        fig.update_layout(yaxis={"title": "attempts"}, height=280, margin={"t": 30, "b": 40})
        figures["failures"] = fig
    return figures


def _ms(start: str, end: str) -> float:
    a, b = _time(start), _time(end)
    return (b - a).total_seconds() * 1000 if a is not None and b is not None else 0.0


def _chart(figures: dict[str, Any], name: str) -> str:
    fig = figures.get(name)
    if fig is None:
        return ""
    div: str = fig.to_html(
        full_html=False, include_plotlyjs=False, div_id=f"chart-{name}", config={"displaylogo": False}
    )
    return f'<div class="chart" data-chart="{name}">{div}</div>'


def render_html(report: RunReport) -> str:
    """A self-contained page: plotly's JavaScript inlined (no network), the numbers as JSON in
    ``<script type="application/json" id="report-data">``, and tables for what is not charted."""
    from plotly.offline import get_plotlyjs

    figures = _figures(report)
    data = msgspec.json.encode(report).decode().replace("</", "<\\/")
    cards = [
        ("records", f"{report.records_done:,} / {report.records_requested:,}"),
        ("shards done", f"{report.shards_done} / {report.shards}"),
        ("attempts", str(report.attempts)),
        ("wall time", f"{_num(report.wall_s, 1)} s"),
        ("records/s", _num(report.records_per_second)),
    ]
    if report.gpu is not None:
        cards.append(("GPU-hours allocated", _num(report.gpu.allocated_gpu_hours, 3)))
        cards.append(("GPU-hours generating", _num(report.gpu.generating_gpu_hours, 3)))
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>ddslurm report {_esc(report.run_id)}</title><style>{_CSS}</style>",
        f"<script>{get_plotlyjs()}</script></head><body>",
        f"<h1>Run {_esc(report.run_id)}</h1>",
        f'<div class=muted>{_esc(report.run_dir)} · report of {_esc(report.generated_at)}</div><div class="cards">',
        *(f'<div class="card" data-card="{_esc(k)}">{_esc(k)}<b>{_esc(v)}</b></div>' for k, v in cards),
        "</div>",
        "<h2>Timeline of every attempt</h2>",
        "<p class=muted>queued (submission to start), serving start-up (start to serving ready), generating (to the "
        "last batch), publishing (to the winner's publication).</p>",
        _chart(figures, "timeline") or "<p>No attempt has started.</p>",
        "<h2>Records over time</h2>",
        _chart(figures, "throughput") or "<p>No batch has completed.</p>",
        "<h2>Models</h2>",
        _chart(figures, "models"),
        _table(
            ["alias", "model", "provider", "where", "requests", "failed", "error rate", "health checks",
             "input tokens", "output tokens", "total tokens", "tokens/s", "latency (s)"],
            [
                [m.alias, m.model, m.provider or "-", "local" if m.local else "hosted", _num(m.requests),
                 _num(m.failed), f"{m.error_rate:.2%}", _num(m.health_checks), _num(m.input_tokens),
                 _num(m.output_tokens), _num(m.total_tokens), _num(m.tokens_per_second, 1), _num(m.latency_s)]
                for m in report.models
            ],
            {4, 5, 6, 7, 8, 9, 10, 11, 12},
        )
        if report.models
        else "<p>No model usage recorded.</p>",
        "<h2>GPU time</h2>",
    ]  # fmt: skip
    if report.gpu is not None:
        gpu = report.gpu
        share = f"{gpu.utilisation:.1%}" if gpu.utilisation is not None else "-"
        parts.append(
            f"<p>Allocated {_num(gpu.allocated_gpu_hours, 3)} GPU-hours ({_esc(gpu.source)}), spent generating "
            f"{_num(gpu.generating_gpu_hours, 3)} ({share}).</p>"
        )
        parts.append(_chart(figures, "gpu"))
        if gpu.jobs:
            parts.append(
                _table(
                    ["job", "state", "elapsed (s)", "GPUs"],
                    [[j.job, j.state, j.elapsed_s, j.gpus] for j in gpu.jobs],
                    {2, 3},
                )
            )
    parts.append("<h2>Failures</h2>")
    if report.failures:
        parts.append(_chart(figures, "failures"))
        parts.append(
            _table(
                ["reason", "attempts", "shards", "message"],
                [[f.reason, f.count, ", ".join(map(str, f.shards)), f.message or ""] for f in report.failures],
                {1},
            )
        )
    else:
        parts.append("<p>No attempt failed.</p>")
    parts.append("<h2>Dataset</h2>")
    if report.dataset is not None:
        ds = report.dataset
        partial = f"; partial shards: {', '.join(map(str, ds.partial_shards))}" if ds.partial_shards else ""
        parts.append(
            f"<p>{_esc(ds.path)}: {ds.rows:,} rows in {ds.files} file(s), {ds.bytes:,} bytes{_esc(partial)}.</p>"
        )
    else:
        parts.append("<p>Not collected yet (<code>ddslurm collect</code>); columns from the shards' analysis.</p>")
    if report.columns:
        parts.append(
            _table(
                ["column", "type", "rows", "nulls", "min", "max", "kind", "distinct (max per shard)", "top values",
                 "output tokens (mean)"],
                [
                    [c.name, c.type or "-", _num(c.rows), _num(c.nulls), c.min or "-", c.max or "-",
                     c.column_type or "-", _num(c.unique_max), ", ".join(f"{k}: {v}" for k, v in c.top_values) or "-",
                     _num(c.output_tokens_mean)]
                    for c in report.columns
                ],
                {2, 3, 7, 9},
            )
        )  # fmt: skip
    if report.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_esc(n)}</li>" for n in report.notes) + "</ul>")
    parts.append(f'<script type="application/json" id="report-data">{data}</script></body></html>')
    return "\n".join(parts)


def report_json(report: RunReport) -> dict[str, Any]:
    """The numbers as ``--json`` prints them."""
    out: dict[str, Any] = msgspec.to_builtins(report)
    return out
