"""Reading a run for its report: the run directory's records, the logs (the controller's events in each array
task's batch output, the client's events and Data Designer's output of each attempt), the dataset's Parquet
metadata and Data Designer's per-shard analysis, and one ``sacct`` call, into the raw facts of :class:`RunFacts`.
Nothing here is summed or judged: :mod:`._numbers` makes the report's numbers of these facts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.collector import MANIFEST, Manifest, read_manifest
from ddslurm.config import (
    BATCH_COMPLETE,
    FILL_DONE,
    SERVING_READY,
    ArrayTask,
    AttemptRecord,
    BusySpan,
    ClientUsage,
    ConfigError,
    Plan,
    Progress,
    ProviderSnapshot,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    batch_output_task,
    busy_log,
    read_json,
    read_plan,
)
from ddslurm.launcher.cluster._slurm import Accounting, Slurm
from ddslurm.launcher.errors import SlurmError
from ddslurm.launcher.report._client_out import ClientOut, parse_client_out
from ddslurm.launcher.report._model import SAMPLE_ROWS, moment
from ddslurm.launcher.runs._hosted_spend import HostedSpend, hosted_spend
from ddslurm.launcher.runs._records import attempt_records, submissions


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    record: AttemptRecord
    batches: list[tuple[datetime, int]]
    """(when, rows added) of each batch the attempt completed (fills included)."""
    stage: int | None = None
    """0: the GPU stage of a two-stage run (its rows are generated again by the CPU stage); None: the run's last
    (or only) stage."""
    array_task: ArrayTask | None = None
    """The array task that began the attempt, from its batch output's name (:func:`~ddslurm.config.batch_output_task`:
    None for an attempt that ran outside a Slurm array)."""
    serving_ready: tuple[datetime, ...] = ()
    """When the controller's ``serving.ready`` events in the attempt's batch output say the servers were ready
    (the events of every attempt that output holds: a pulling allocation runs many)."""
    client_out: ClientOut | None = None
    """What the attempt's ``client.out`` says about models; None: it has none (or it could not be read)."""
    serving_dir: str | None = None
    """Where its model servers' and proxies' logs are: its pulling allocation's directory, else its own."""
    client_usage: ClientUsage | None = None
    """What its client step used (``client-usage.json``); None: it wrote none."""


@dataclass(frozen=True, slots=True)
class ChunkFacts:
    """One column of one row group of a Parquet file, as its metadata says."""

    rows: int
    statistics: bool
    """The chunk has statistics (else neither its nulls nor its extremes are known)."""
    null_count: int | None = None
    min_max: tuple[Any, Any] | None = None


@dataclass(frozen=True, slots=True)
class ParquetColumnFacts:
    """One column of one Parquet file of the dataset."""

    path: str
    physical_type: str
    logical_type: str
    chunks: list[ChunkFacts]


@dataclass(frozen=True, slots=True)
class RunFacts:
    layout: RunLayout
    plan: Plan
    submissions: list[SubmissionRecord]
    winners: dict[int, WinnerRecord]
    """Shard → its winner (of the last stage), for the shards that have one."""
    gpu_winners: dict[int, WinnerRecord]
    """A two-stage run's GPU-stage winners (``stage-0/``); empty for a single-stage run."""
    attempts: list[AttemptFacts]
    """Every attempt of the run, shard by shard (a two-stage run's GPU-stage attempts first)."""
    manifest: Manifest | None
    """The collected dataset's manifest; None: not collected yet."""
    parquet: list[ParquetColumnFacts]
    """Every column of every file of the collected dataset, file by file."""
    analyses: list[Any]
    """The ``column_statistics`` of each winner's Data Designer analysis (``metadata.json``), shard by shard."""
    gpu_analyses: list[Any]
    """The same of a two-stage run's GPU-stage winners (empty for a single-stage run)."""
    busy: dict[str, dict[tuple[str, int], list[tuple[datetime, datetime]]]]
    """Serving directory → (alias, replica index) → the spans of that replica's busy log
    (``busy-<alias>-<i>.jsonl``: it had a request in flight); a directory without any busy log is absent, and so
    is a replica without one."""
    accounting: list[Accounting] | None
    """Every run of every task of the run's arrays (``sacct``); None: the scheduler was not asked, or it did not
    answer."""
    hosted: HostedSpend | None = None
    """What the run's clients asked of its hosted keys (every attempt's ``hosted-requests.jsonl``); None: the run
    uses no hosted provider, or its snapshot cannot be read."""
    run_file: str | None = None
    """The run file as submitted (``inputs/run.yaml``); None: absent or unreadable."""
    sample: list[dict[str, Any]] | None = None
    """The first rows of the collected dataset's first file (at most ``SAMPLE_ROWS``), as pyarrow gives them;
    None before ``collect``."""


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


def _record(path: Path, kind: type[Any]) -> Any:
    try:
        return read_json(path, kind)
    except (FileNotFoundError, ConfigError, OSError):
        return None


def _winners(layout: RunLayout, plan: Plan, stage: int | None) -> dict[int, WinnerRecord]:
    return {
        spec.index: w
        for spec in plan.shards
        if (w := _record(layout.stage_shard(spec.index, stage).winner, WinnerRecord)) is not None
    }


def _batches(client_log: Path, resumed: int) -> list[tuple[datetime, int]]:
    """(when, rows added) of each ``batch.complete`` (which says the attempt's rows so far, resumed rows included)
    and each ``fill.done`` (rows a fill added) of a client log, in order."""
    out: list[tuple[datetime, int]] = []
    done = resumed
    for event in json_lines(client_log):
        at = moment(event.get("timestamp"))
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


def _serving_ready(slurm_log: Path) -> tuple[datetime, ...]:
    events = (e for e in json_lines(slurm_log) if e.get("event") == SERVING_READY)
    return tuple(at for e in events if (at := moment(e.get("timestamp"))) is not None)


def _client_out(attempt_dir: Path) -> ClientOut | None:
    try:
        text = (attempt_dir / "client.out").read_text(errors="replace")
    except OSError:
        return None
    return parse_client_out(text)


def _attempts(layout: RunLayout, plan: Plan) -> list[AttemptFacts]:
    """Every attempt of the run: a two-stage run's GPU-stage attempts (``stage-0/``) too."""
    found: list[AttemptFacts] = []
    ready: dict[str, tuple[datetime, ...]] = {}  # batch output → its serving.ready times (read once)
    stages: tuple[int | None, ...] = (0, None) if len(plan.stages) > 1 else (None,)
    for spec, stage in ((spec, stage) for spec in plan.shards for stage in stages):
        for record in attempt_records(layout, spec.index, stage):
            attempt_dir = layout.stage_shard(spec.index, stage).attempt(record.attempt).dir
            batches = _batches(attempt_dir / "client.log", record.resumed_rows)
            if not batches:  # an older attempt without a client.log: its progress file, one point
                progress = _record(attempt_dir / "progress.json", Progress)
                at = moment(progress.updated_at) if progress is not None else None
                if progress is not None and at is not None and progress.rows > record.resumed_rows:
                    batches = [(at, progress.rows - record.resumed_rows)]
            if record.slurm_log and record.slurm_log not in ready:
                ready[record.slurm_log] = _serving_ready(Path(record.slurm_log))
            found.append(
                AttemptFacts(
                    record=record,
                    batches=batches,
                    stage=stage,
                    array_task=batch_output_task(record.slurm_log),
                    serving_ready=ready[record.slurm_log] if record.slurm_log else (),
                    client_out=_client_out(attempt_dir),
                    serving_dir=record.allocation or str(attempt_dir),
                    client_usage=_record(attempt_dir / "client-usage.json", ClientUsage),
                )
            )
    return found


def _busy(plan: Plan, dirs: Iterable[str]) -> dict[str, dict[tuple[str, int], list[tuple[datetime, datetime]]]]:
    """The spans of every busy log of the plan's replicas in each serving directory (lines that do not decode, such
    as one cut by a kill, skipped)."""
    replicas = [(d.alias, r.index) for d in plan.serving.deployments for r in d.replicas] if plan.serving else []
    found: dict[str, dict[tuple[str, int], list[tuple[datetime, datetime]]]] = {}
    for folder in sorted(set(dirs)):
        for alias, index in replicas:
            try:
                text = busy_log(Path(folder), alias, index).read_text(errors="replace")
            except OSError:
                continue
            spans: list[tuple[datetime, datetime]] = []
            for line in text.splitlines():
                try:
                    span = msgspec.json.decode(line, type=BusySpan)
                except msgspec.DecodeError:
                    continue
                start, end = datetime.fromtimestamp(span.start, UTC), datetime.fromtimestamp(span.end, UTC)
                if end >= start:
                    spans.append((start, end))
            if spans:
                found.setdefault(folder, {})[(alias, index)] = sorted(spans)
    return found


def _parquet_columns(dataset: Path, files: Iterable[str]) -> list[ParquetColumnFacts]:
    import pyarrow.parquet as pq

    found: list[ParquetColumnFacts] = []
    for name in files:
        meta = pq.read_metadata(dataset / name)  # type: ignore[no-untyped-call]
        schema = meta.schema
        for i in range(meta.num_columns):
            column = schema.column(i)
            chunks: list[ChunkFacts] = []
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(i).statistics
                rows = meta.row_group(g).num_rows
                if stats is None:
                    chunks.append(ChunkFacts(rows=rows, statistics=False))
                    continue
                chunks.append(
                    ChunkFacts(
                        rows=rows,
                        statistics=True,
                        null_count=stats.null_count if stats.has_null_count else None,
                        min_max=(stats.min, stats.max) if stats.has_min_max else None,
                    )
                )
            found.append(
                ParquetColumnFacts(
                    path=column.path,
                    physical_type=column.physical_type,
                    logical_type=str(column.logical_type),
                    chunks=chunks,
                )
            )
    return found


def _analyses(winners: Iterable[WinnerRecord]) -> list[Any]:
    found: list[Any] = []
    for winner in winners:
        try:
            meta = json.loads((Path(winner.dataset_dir) / "metadata.json").read_text())
        except (OSError, ValueError):
            continue
        found.append(meta.get("column_statistics") or [])
    return found


def _accounting(slurm: Slurm | None, subs: list[SubmissionRecord]) -> list[Accounting] | None:
    if slurm is None or not subs:
        return None
    try:
        return slurm.accounting(sorted({s.array_job_id for s in subs}, key=int))
    except SlurmError:
        return None


def read_run(layout: RunLayout, slurm: Slurm | None) -> RunFacts:
    """The facts of the run's report. ``slurm``: the scheduler to ask for accounting (one ``sacct`` call for all
    of the run's arrays); None asks nothing."""
    plan = read_plan(layout.plan)
    subs = submissions(layout)
    winners = _winners(layout, plan, None)
    attempts = _attempts(layout, plan)
    gpu_winners = _winners(layout, plan, 0) if len(plan.stages) > 1 else {}
    manifest = read_manifest(layout.dataset) if (layout.dataset / MANIFEST).is_file() else None
    parquet = _parquet_columns(layout.dataset, [f.path for f in manifest.files]) if manifest is not None else []
    return RunFacts(
        layout=layout,
        plan=plan,
        submissions=subs,
        winners=winners,
        gpu_winners=gpu_winners,
        attempts=attempts,
        manifest=manifest,
        parquet=parquet,
        analyses=_analyses(winners.values()),
        gpu_analyses=_analyses(gpu_winners.values()),
        busy=_busy(plan, (a.serving_dir for a in attempts if a.serving_dir is not None)),
        accounting=_accounting(slurm, subs),
        hosted=_hosted(layout, plan),
        run_file=_text(layout.run_file),
        sample=_sample(layout.dataset, [f.path for f in manifest.files]) if manifest is not None else None,
    )


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _sample(dataset: Path, files: list[str]) -> list[dict[str, Any]]:
    """The first rows of the dataset (of its first file that has any), at most ``SAMPLE_ROWS``."""
    import pyarrow.parquet as pq

    for name in files:
        parquet = pq.ParquetFile(dataset / name)  # type: ignore[no-untyped-call]
        for batch in parquet.iter_batches(batch_size=SAMPLE_ROWS):  # type: ignore[no-untyped-call]
            if batch.num_rows:
                rows: list[dict[str, Any]] = batch.to_pylist()
                return rows[:SAMPLE_ROWS]
    return []


def _hosted(layout: RunLayout, plan: Plan) -> HostedSpend | None:
    try:
        snapshot = read_json(layout.snapshot, ProviderSnapshot)
    except (ConfigError, OSError):
        return None
    if all(p.local for p in snapshot.providers):
        return None
    return hosted_spend(layout, plan, snapshot)
