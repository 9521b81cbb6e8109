"""The report's numbers as a typed model: what ``ddslurm report --json`` prints and the page embeds as JSON
(:func:`report_json`). Every time in it is an ISO 8601 string in UTC (:func:`iso` writes one, :func:`moment` reads
one back, as it reads the run directory's records and events)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

PhaseName = Literal["waiting", "queued", "startup", "spare", "generating", "publishing"]
PHASES: tuple[PhaseName, ...] = ("waiting", "queued", "startup", "spare", "generating", "publishing")
"""``waiting``: a CPU-stage attempt's array waited for the GPU stage it depends on (submission to the end of the
last GPU-stage attempt before it started); ``queued``: then in Slurm's queue until it started; ``spare``: a pulling
allocation's spare client waited for a worker's slot (the attempt's start to its client's first generation,
``generating_at``, or its end), generating nothing."""


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
    """Rows of the batch's stage generated up to and including this batch (every attempt's)."""
    stage: str | None = None
    """``gpu`` or ``cpu`` in a two-stage run; None in a single-stage run."""


class RateBin(msgspec.Struct, kw_only=True):
    """One bin of records over time (every bin of every stage has the same width, a round number of seconds, from
    the first attempt's start to the run's last batch)."""

    start: str
    end: str
    rows: float
    """Rows its stage generated in the bin: each batch's rows spread evenly over the time the attempt spent on it
    (from its previous batch, or the start of its generating span, to the batch), 3 decimals."""
    generating_s: float
    """Seconds of the bin in which its stage was generating (the union of its attempts' generating spans, clipped
    to the bin)."""
    rate: float | None
    """``rows / generating_s``: the headline's definition of records per second, over the bin; None when its stage
    was not generating in the bin. Weighted by ``generating_s``, a stage's bins average to its
    ``StageRate.records_per_second``."""
    stage: str | None = None


class StageRate(msgspec.Struct, kw_only=True):
    """What one stage generated (the run itself in a single-stage run) and over how long."""

    stage: str | None
    rows: int
    """Rows its attempts' batches added (attempts that did not win included)."""
    active_s: float
    """Seconds of the union of its attempts' generating spans (serving ready, or the start, to the last batch)."""
    records_per_second: float | None
    """``rows / active_s``; None when nothing was generating."""


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
    active_s: float | None = None
    """Seconds of the union of the generating spans of the attempts whose usage summaries name the model."""
    tokens_per_second: float | None = None
    """``total_tokens / active_s`` (None when no span is known): a total over the time the model was in use,
    not a sum of each attempt's rate."""


class JobAccounting(msgspec.Struct, kw_only=True):
    job: str
    state: str
    elapsed_s: int
    gpus: int


class ReplicaGpu(msgspec.Struct, kw_only=True):
    """One model server (replica) of an allocation and the time it had work (its busy log)."""

    alias: str
    replica: int
    """Its index among its deployment's replicas."""
    gpus: int
    """The GPUs it holds (:attr:`~ddslurm.config.DeploymentPlan.replica_gpus`)."""
    busy_s: float
    """Seconds of the union of the spans in which it had a request in flight (0: none, or no busy log)."""


class AllocationGpu(msgspec.Struct, kw_only=True):
    """One allocation that held GPUs (an array task, ``<array>_<task>``) and the time its servers had work."""

    job: str
    gpus: int
    """Its GPUs (sacct's AllocTRES; the plan's where the cluster does not account them)."""
    allocated_s: float | None
    """Elapsed seconds x GPUs of its runs (sacct, requeued runs included); None: no accounting."""
    busy_s: float
    """Seconds of the union of the spans in which any of its servers had work."""
    busy_from: Literal["proxy", "attempts"]
    """``proxy``: its replicas' busy logs (requests in flight); ``attempts``: none was found, the union of its
    attempts' generating spans instead."""
    generating_gpu_s: float
    """``proxy``: the sum over its replicas of their ``busy_s x gpus``; ``attempts``: ``busy_s x gpus``; never
    above ``allocated_s``."""
    clamped: bool = False
    """The GPU time generating was above what sacct allocated, and was cut to it."""
    replicas: list[ReplicaGpu] = msgspec.field(default_factory=list)
    """``proxy``: every replica of the plan in this allocation, with its own busy time; ``attempts``: empty."""


class GpuUsage(msgspec.Struct, kw_only=True):
    allocated_gpu_hours: float | None
    """Elapsed time x GPUs of every allocation of the run's GPU arrays (requeued runs included), from ``sacct``;
    None: the accounting could not be read (nothing is estimated in its place)."""
    generating_gpu_hours: float
    """Per allocation, the sum over its replicas of the union of the spans in which the replica had work x the
    replica's GPUs (at most the allocation's allocated GPU time), summed over the allocations."""
    utilisation: float | None = None
    """``generating / allocated``; None when allocated is unknown or 0."""
    source: str = "sacct"
    """``sacct``, or ``none`` when the accounting could not be read."""
    jobs: list[JobAccounting] = msgspec.field(default_factory=list)
    allocations: list[AllocationGpu] = msgspec.field(default_factory=list)
    allocated_cost: float | None = None
    """``allocated_gpu_hours`` x the price file's ``gpu_hour`` of the generation partition, in ``currency``; None
    without a price file, a price for the partition, or the accounting."""
    currency: str | None = None


class CpuUsage(msgspec.Struct, kw_only=True):
    """CPU time of the run: what its allocations held (sacct) and what its client steps used (each attempt's
    ``client-usage.json``)."""

    allocated_cpu_hours: float | None
    """Elapsed time x CPUs (sacct's AllocTRES ``cpu``) of every allocation of every array of the run (requeued runs
    included); None: the accounting could not be read."""
    client_cpu_hours: float
    """User + system CPU time of the client steps (Data Designer's processes) that wrote their usage, summed."""
    client_steps: int
    """Attempts whose client step wrote its usage (one killed before it ended wrote none)."""
    attempts: int
    """Attempts of the run that ran a client step (``client_runs``)."""
    allocated_cost: float | None = None
    """``allocated_cpu_hours`` x the price file's ``cpu_hour`` of the run's partition; None without one."""
    currency: str | None = None


class Compared(msgspec.Struct, kw_only=True):
    """One number the planner predicted beside what the run measured."""

    what: Literal["wall time (s)", "GPU-hours", "GPU-busy"]
    predicted: float
    measured: float | None
    """None: not known (no winner published yet, no accounting)."""
    ratio: float | None
    """``measured / predicted`` (3 decimals); None when either is unknown or the prediction is 0."""


class PredictedMeasured(msgspec.Struct, kw_only=True):
    """The plan's prediction (``Plan.prediction``) beside the run's measurement: wall time from the first GPU
    allocation's start to the last winner's publication (the timeline), GPU-hours allocated (sacct) and GPU-busy
    (GPU-hours generating over allocated)."""

    allocations: int
    """The chosen layout's allocations (what was predicted for)."""
    rows: list[Compared]


class FactMeasured(msgspec.Struct, kw_only=True):
    """One input of the planner's cost model (``Plan.prediction.facts``) beside this run's own measure of it: how
    far the fact the run was planned with was from what the run did."""

    name: str
    """``load_s``, ``requests_per_s``, ``requests_per_record``, ``client_cpu_s_per_request``,
    ``allocation_overhead_s``, ``cpu_stage_records_per_s``."""
    subject: str
    """A model alias (with its model shape's key after a colon), or ``recipe``."""
    used: float
    """The value the planner predicted with."""
    origin: str
    """``default``, ``run``, ``tune`` or ``run file``."""
    runs: int
    """How many runs the used value rests on (their median); 0: a default."""
    measured: float | None
    """What this run measured; None: not measured (``note`` says why)."""
    ratio: float | None
    """``measured / used`` (3 decimals); None when either is unknown or the used value is 0."""
    note: str = ""


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
    """Data Designer's kind of column (``sampler``, ``llm-text``, ...), from its per-shard analysis (of the
    stage that generated it, in a two-stage run)."""
    stage: str | None = None
    """``GPU stage`` or ``CPU stage``: the stage of a two-stage run that generated the column; None otherwise
    (and for the seed dataset's columns)."""
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


class HostedModelReport(msgspec.Struct, kw_only=True):
    """One hosted model of one key: what every attempt sent (spent) and what the winners' attempts sent (kept)."""

    provider: str
    key_env: str | None
    model: str
    aliases: list[str]
    requests: int
    succeeded: int
    limited: int
    failed: int
    unanswered: int
    input_tokens: int
    output_tokens: int
    cost: float | None
    kept_requests: int
    unreached: int = 0
    """Could not be delivered (refused, or closed before an answer): not among ``requests``."""
    kept_input_tokens: int
    kept_output_tokens: int
    kept_cost: float | None


class HostedKeyReport(msgspec.Struct, kw_only=True):
    """One hosted key: what its clients learned of it together, and what the run file states."""

    provider: str
    key_env: str | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    in_flight: float | None
    stated_in_flight: int | None = None
    stated_requests_per_minute: int | None = None
    stated_tokens_per_minute: int | None = None


class HostedMinute(msgspec.Struct, kw_only=True):
    """Requests sent to one key in one minute of the run (every attempt), and how many were answered 429."""

    provider: str
    start: str
    requests: int
    limited: int


class HostedReport(msgspec.Struct, kw_only=True):
    """The run's hosted keys: requests, 429s, tokens and dollars, spent and kept (``_hosted_spend``)."""

    currency: str | None
    """The price file's currency; None: the run has no price file (no dollars)."""
    models: list[HostedModelReport]
    keys: list[HostedKeyReport]
    minutes: list[HostedMinute]
    cost: float | None
    kept_cost: float | None
    kept_rows: int
    cost_per_1000_kept_rows: float | None
    unpriced: list[str] = msgspec.field(default_factory=list)
    """Models with requests and no price in the run's price file."""


class Deployment(msgspec.Struct, kw_only=True):
    """One model deployment of the run's layout."""

    alias: str
    model: str
    replicas: int
    gpus_per_replica: int


class RunConfiguration(msgspec.Struct, kw_only=True):
    """How the run was set up: its run file as submitted, the layout the planner chose and the versions."""

    run_file: str | None
    """The run file as submitted (``inputs/run.yaml``); None: the run directory has none."""
    recipe: str
    """The recipe file of the run (its copy in the run directory)."""
    records: int
    shards: int
    allocations: int | None
    """Pulling allocations of the initial submission; None: one array task per shard."""
    client_workers: int
    """Client steps an allocation runs at once (each on its own shard)."""
    buffer_size: int
    """Records of one batch (what a shard saves at a time)."""
    partition: str | None
    time_minutes: int
    cpus_per_task: int
    gpus: int
    """GPUs of each allocation (0: a hosted-only run)."""
    stages: list[str] = msgspec.field(default_factory=list)
    """``gpu`` and ``cpu`` for a two-stage run; empty for one stage."""
    cpu_stage_workers: int | None = None
    """Client steps a CPU-stage allocation runs at once (two-stage runs); None otherwise."""
    deployments: list[Deployment] = msgspec.field(default_factory=list)
    ddslurm_version: str
    """ddslurm's version that planned the run (``Plan.ddslurm_version``); empty for plans made before it."""
    data_designer_version: str
    """Data Designer's version of the profile's ``python_env`` at submit; empty when not recorded."""


class SampleRows(msgspec.Struct, kw_only=True):
    """The first rows of the collected dataset (its first file), each value as text cut to
    :data:`SAMPLE_CHARS` characters."""

    columns: list[str]
    rows: list[list[str | None]]
    """At most :data:`SAMPLE_ROWS` rows, a value per column (None: null)."""
    truncated: bool = False
    """Some value was longer than :data:`SAMPLE_CHARS` characters and was cut."""


SAMPLE_ROWS = 5
SAMPLE_CHARS = 200


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
    """``rows_generated`` over the union of every attempt's generating spans (of every stage); None when nothing
    was generating."""
    stages: list[StageRate] = msgspec.field(default_factory=list)
    """Each stage's rows and rate (one entry, stage None, for a single-stage run)."""
    timeline: list[AttemptSpan] = msgspec.field(default_factory=list)
    batches: list[BatchPoint] = msgspec.field(default_factory=list)
    rate: list[RateBin] = msgspec.field(default_factory=list)
    models: list[ModelUsage] = msgspec.field(default_factory=list)
    gpu: GpuUsage | None = None
    """GPU time; None for a run without GPUs (hosted-only: see ``cpu``)."""
    cpu: CpuUsage | None = None
    """CPU time: allocations (sacct) and client steps (``client-usage.json``)."""
    predicted: PredictedMeasured | None = None
    """The plan's prediction beside the measurement; None when the plan has none (hosted-only runs)."""
    facts: list[FactMeasured] = msgspec.field(default_factory=list)
    """Each fact the prediction used beside this run's measure of it (``ddslurm.launcher.facts._measure.fact_check``;
    the command that writes the report fills it); empty without a prediction."""
    hosted: HostedReport | None = None
    """The run's hosted keys; None: the run uses none."""
    failures: list[FailureGroup] = msgspec.field(default_factory=list)
    dataset: DatasetReport | None = None
    columns: list[ColumnReport] = msgspec.field(default_factory=list)
    sample: SampleRows | None = None
    """A few rows of the collected dataset; None before ``collect``."""
    configuration: RunConfiguration | None = None
    notes: list[str] = msgspec.field(default_factory=list)


def moment(value: str | None) -> datetime | None:
    """The time an ISO 8601 string says (UTC when it names no zone); None for none or for one that is not a time."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat()


def iso_or_none(at: datetime | None) -> str | None:
    return iso(at) if at is not None else None


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    """Seconds from ``start`` to ``end`` (negative when ``end`` comes first); None when either is unknown."""
    return (end - start).total_seconds() if start is not None and end is not None else None


def report_json(report: RunReport) -> dict[str, Any]:
    """The numbers as ``--json`` prints them."""
    out: dict[str, Any] = msgspec.to_builtins(report)
    return out
