"""Merge the published winners of a run into one Parquet dataset, streaming with bounded memory."""

from __future__ import annotations

import base64
import contextlib
import functools
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.collector._manifest import MANIFEST, MANIFEST_VERSION, Manifest, SchemaField, ShardEntry
from ddslurm.collector._schema import conform, in_order, unified_schema
from ddslurm.collector._verify import Batch, batches_of, check_present, read_verified
from ddslurm.collector._writer import ROW_GROUP_BYTES, ROW_GROUP_ROWS, TARGET_FILE_BYTES, PartWriter
from ddslurm.collector.errors import (
    CollectError,
    DestinationExistsError,
    MissingWinnersError,
    SchemaConflictError,
    WinnerUnreadableError,
)
from ddslurm.config import (
    ConfigError,
    ConfigFileError,
    LockHeldError,
    Plan,
    RunLayout,
    WinnerRecord,
    atomic_write,
    digest,
    encode_pretty,
    exclusive_lock,
    make_private_dir,
    read_json,
    read_plan,
)


def schema_fields(schema: pa.Schema) -> tuple[SchemaField, ...]:
    """The manifest's ``schema``: every column, with the children of nested types."""
    return tuple(_field(f) for f in schema)


def _field(field: pa.Field) -> SchemaField:
    t = field.type
    return SchemaField(
        name=field.name,
        type=str(t),
        nullable=field.nullable,
        fields=tuple(_field(t.field(i)) for i in range(t.num_fields)),
    )


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def manifest_schema(manifest: Manifest) -> pa.Schema | None:
    """The dataset's exact Arrow schema; None for a version 1 manifest (read the Parquet footers instead)."""
    if manifest.arrow_schema is None:
        return None
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest.arrow_schema)))


@dataclass(frozen=True, slots=True)
class CollectResult:
    dataset: Path
    rows: int
    files: tuple[Path, ...]
    manifest: Path


def _winners(layout: RunLayout, plan: Plan) -> list[WinnerRecord]:
    winners: list[WinnerRecord] = []
    missing: list[int] = []
    for spec in plan.shards:
        path = layout.shard(spec.index).winner
        try:
            winner = read_json(path, WinnerRecord)
        except FileNotFoundError:
            missing.append(spec.index)
            continue
        except ConfigError as exc:
            why = exc.message if isinstance(exc, ConfigFileError) else str(exc)
            raise WinnerUnreadableError(spec.index, path, why) from exc
        if winner.shard != spec.index:
            raise WinnerUnreadableError(spec.index, path, f"it describes shard {winner.shard}")
        winners.append(winner)
    if missing:
        raise MissingWinnersError(missing)
    return winners


def _check(layout: RunLayout, destination: Path, overwrite: bool) -> tuple[Plan, list[WinnerRecord], list[Batch]]:
    plan = read_plan(layout.plan)
    if (destination.exists() or destination.is_symlink()) and not overwrite:
        raise DestinationExistsError(f"{destination}: already exists; pass --overwrite to replace it")
    winners = _winners(layout, plan)
    batches = [batch for winner in winners for batch in batches_of(winner)]
    for batch in batches:
        check_present(batch)
    return plan, winners, batches


def preflight(layout: RunLayout, *, destination: Path | None = None, overwrite: bool = False) -> None:
    """What :func:`collect` checks before it reads any data, without reading any (so cheap enough to run
    before submitting a collection job): the plan is readable, the destination does not exist (unless
    ``overwrite``), every shard has a readable winner, and every batch file exists with its published size."""
    _check(layout, destination or layout.dataset, overwrite)


def _not_parquet(batch: Batch, exc: BaseException) -> CollectError:
    return CollectError(f"shard {batch.shard}: {batch.entry.path} is not a readable Parquet file ({batch.path}): {exc}")


def _schema(batches: list[Batch], order: Sequence[str] | None = None) -> pa.Schema:
    """The unified schema, from the files' footers, its columns in ``order`` when the plan defines one (every file
    must then hold exactly those columns). A footer that cannot be read, or a type conflict, is first checked
    against the published sha256, so a file changed since publication is reported as such."""
    schemas: list[tuple[Path, pa.Schema]] = []
    for batch in batches:
        try:
            schemas.append((batch.path, pq.read_schema(batch.path)))
        except (pa.ArrowException, OSError) as exc:
            read_verified(batch, keep=False)
            raise _not_parquet(batch, exc) from exc
    try:
        return in_order(unified_schema(schemas), order, schemas)
    except SchemaConflictError as exc:
        by_path = {batch.path: batch for batch in batches}
        for path in exc.files:
            read_verified(by_path[path], keep=False)
        raise


def collect(
    layout: RunLayout,
    *,
    destination: Path | None = None,
    overwrite: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    target_file_bytes: int = TARGET_FILE_BYTES,
    row_group_rows: int = ROW_GROUP_ROWS,
    row_group_bytes: int = ROW_GROUP_BYTES,
    progress: Callable[[int, int], None] | None = None,
    publishing: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> CollectResult:
    """Merge every shard's winner into ``destination`` (default: the run's ``dataset/``) atomically.

    Every batch file is verified against the size and sha256 its winner recorded, from the very bytes that are
    then parsed; a file that changed or disappeared since publication fails the collection and nothing is
    published."""
    destination = destination or layout.dataset
    plan, winners, batches = _check(layout, destination, overwrite)
    schema = _schema(batches, plan.column_order)
    make_private_dir(layout.collections, exist_ok=True)
    with _exclusive(layout.collections / "collect.lock"):
        _remove_stale_staging(destination)
        writer = functools.partial(
            PartWriter,
            target_file_bytes=target_file_bytes,
            row_group_rows=row_group_rows,
            row_group_bytes=row_group_bytes,
        )
        return _collect_locked(
            plan, destination, winners, batches, schema, overwrite, clock, writer, progress, publishing
        )


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One collection of a run at a time (so leftovers of a killed one can be removed safely): the lock tried once
    (:func:`~ddslurm.config.exclusive_lock`)."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(lock_path, wait_s=0))
        except LockHeldError:
            raise CollectError(f"another collection of this run is in progress ({lock_path})") from None
        yield


def _remove_stale_staging(destination: Path) -> None:
    """A collection killed half-way leaves only a hidden staging directory: remove it before starting."""
    for stale in destination.parent.glob(f".{destination.name}.staging-*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)


def _publish(staging: Path, destination: Path, overwrite: bool) -> None:
    if destination.is_symlink():
        raise DestinationExistsError(f"{destination}: is a symbolic link; refusing to replace it")
    if not destination.exists():
        staging.rename(destination)
        return
    if not overwrite:
        raise DestinationExistsError(f"{destination}: already exists; pass --overwrite to replace it")
    trash = destination.with_name(f".{destination.name}.old-{secrets.token_hex(4)}")
    destination.rename(trash)
    staging.rename(destination)
    shutil.rmtree(trash, ignore_errors=True)


def _read(batch: Batch) -> pa.Table:
    data = read_verified(batch)  # size and sha256 checked on the bytes that are parsed next
    try:
        return pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowException, OSError) as exc:
        raise _not_parquet(batch, exc) from exc


def _collect_locked(
    plan: Plan,
    destination: Path,
    winners: list[WinnerRecord],
    batches: list[Batch],
    schema: pa.Schema,
    overwrite: bool,
    clock: Callable[[], datetime],
    writer: Callable[[Path, pa.Schema], PartWriter],
    progress: Callable[[int, int], None] | None,
    publishing: Callable[[], contextlib.AbstractContextManager[None]] | None,
) -> CollectResult:
    staging = destination.parent / f".{destination.name}.staging-{secrets.token_hex(6)}"
    parts: PartWriter | None = None
    try:
        make_private_dir(staging)
        parts = writer(staging, schema)
        rows = dict.fromkeys((w.shard for w in winners), 0)
        for done, batch in enumerate(batches, start=1):
            table = _read(batch)
            parts.add(conform(table, schema, batch.path))
            rows[batch.shard] += table.num_rows
            if progress is not None:
                progress(done, len(batches))
        written = parts.close()
        for w in winners:
            if rows[w.shard] != w.rows:
                raise CollectError(
                    f"shard {w.shard}: its batch files hold {rows[w.shard]} rows but its winner reports {w.rows}; "
                    "nothing was published"
                )
        manifest = Manifest(
            version=MANIFEST_VERSION,
            run_id=plan.run_id,
            plan_sha256=digest(plan),
            rows=sum(rows.values()),
            shards=tuple(ShardEntry(shard=w.shard, attempt=w.attempt, rows=w.rows, partial=w.partial) for w in winners),
            schema=schema_fields(schema),
            arrow_schema=encode_schema(schema.remove_metadata()),
            files=tuple(written),
            collected_at=clock().isoformat(),
        )
        atomic_write(staging / MANIFEST, encode_pretty(manifest))
        with publishing() if publishing is not None else contextlib.nullcontext():
            _publish(staging, destination, overwrite)
    except BaseException:
        if parts is not None:
            parts.abort()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return CollectResult(
        dataset=destination,
        rows=manifest.rows,
        files=tuple(destination / f.path for f in written),
        manifest=destination / MANIFEST,
    )


def progress_reporter(stream: TextIO) -> Callable[[int, int], None]:
    """A ``progress`` callback for :func:`collect` that prints every 5 % of the batch files, and the last."""

    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 20) == 0:
            print(f"collected {done}/{total} batch files", file=stream, flush=True)

    return report
