"""Merge the published winners of a run into one Parquet dataset, streaming with bounded memory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.collector.errors import CollectError, DestinationExistsError, MissingWinnersError, SchemaConflictError
from ddslurm.config import (
    FileEntry,
    Frozen,
    Plan,
    RunLayout,
    WinnerRecord,
    atomic_write,
    digest,
    encode_pretty,
    make_private_dir,
    read_json,
    read_plan,
    sha256_file,
)

MANIFEST = "_manifest.json"  # leading underscore: pyarrow and pandas skip it when reading the directory
TARGET_FILE_BYTES = 512 << 20
ROW_GROUP_ROWS = 128 * 1024
ROW_GROUP_BYTES = 128 << 20


class ShardEntry(Frozen, frozen=True, kw_only=True):
    shard: int
    attempt: str
    rows: int


class Manifest(Frozen, frozen=True, kw_only=True):
    run_id: str
    plan_sha256: str
    rows: int
    shards: tuple[ShardEntry, ...]
    schema: str
    files: tuple[FileEntry, ...]
    collected_at: str


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
            winners.append(read_json(path, WinnerRecord))
        except FileNotFoundError:
            missing.append(spec.index)
    if missing:
        raise MissingWinnersError(missing)
    return winners


def _batch_files(winners: list[WinnerRecord]) -> list[Path]:
    files: list[Path] = []
    for w in winners:
        for entry in w.files:
            path = Path(w.dataset_dir) / entry.path
            if not path.is_file() or path.stat().st_size != entry.size:
                raise CollectError(f"shard {w.shard}: {path} is missing or changed since it was published")
            files.append(path)
    return files


def unified_schema(schemas: list[tuple[Path, pa.Schema]]) -> pa.Schema:
    """One schema for all files: columns in first-seen order, types unified without changing values."""
    order: dict[str, None] = {}
    for _, schema in schemas:
        for name in schema.names:
            order.setdefault(name, None)
    fields: list[pa.Field] = []
    for name in order:
        seen = [(path, s.field(name)) for path, s in schemas if name in s.names]
        try:
            merged = pa.unify_schemas([pa.schema([f]) for _, f in seen], promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            first_path, first = seen[0]
            other_path, other = next(((p, f) for p, f in seen if f.type != first.type), seen[-1])
            raise SchemaConflictError(
                f"column {name!r} has types that cannot be unified: {first.type} in {first_path} and "
                f"{other.type} in {other_path} ({exc})"
            ) from exc
        fields.append(merged.field(name).with_nullable(True))
    return pa.schema(fields)


def _conform(table: pa.Table, schema: pa.Schema, path: Path) -> pa.Table:
    """Select by name into the unified order (never by position), add missing columns as nulls, cast safely:
    a cast that would change a value (an int too large for a float, say) is a conflict, not a rounding."""
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, type=field.type))
            continue
        column = table.column(field.name)
        try:
            columns.append(column.cast(field.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SchemaConflictError(
                f"column {field.name!r} in {path} ({column.type}) cannot become {field.type} without changing "
                f"values: {exc}"
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)


class _PartWriter:
    """Buffers batches into row groups of a sensible size and rolls over to a new file at the target size;
    memory holds at most one row group."""

    def __init__(self, directory: Path, schema: pa.Schema, target_file_bytes: int, row_group_rows: int) -> None:
        self._dir = directory
        self._group_rows = row_group_rows
        self._schema = schema
        self._target = target_file_bytes
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._writer: pq.ParquetWriter | None = None
        self.files: list[Path] = []

    def add(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._pending_bytes += table.nbytes
        if self._pending_rows >= self._group_rows or self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None or self.files[-1].stat().st_size >= self._target:
            if self._writer is not None:
                self._writer.close()
            self.files.append(self._dir / f"part-{len(self.files):05d}.parquet")
            self._writer = pq.ParquetWriter(self.files[-1], self._schema)
        group = pa.concat_tables(self._pending)
        self._writer.write_table(group, row_group_size=max(1, group.num_rows))
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0

    def close(self) -> list[Path]:
        self._flush()
        if self._writer is not None:
            self._writer.close()
        return self.files


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


def collect(
    layout: RunLayout,
    *,
    destination: Path | None = None,
    overwrite: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    target_file_bytes: int = TARGET_FILE_BYTES,
    row_group_rows: int = ROW_GROUP_ROWS,
    progress: Callable[[int, int], None] | None = None,
) -> CollectResult:
    """Merge every shard's winner into ``destination`` (default: the run's ``dataset/``) atomically."""
    plan = read_plan(layout.plan)
    destination = destination or layout.dataset
    if (destination.exists() or destination.is_symlink()) and not overwrite:
        raise DestinationExistsError(f"{destination}: already exists; pass --overwrite to replace it")
    winners = _winners(layout, plan)
    files = _batch_files(winners)
    schema = unified_schema([(f, pq.read_schema(f)) for f in files])
    make_private_dir(layout.collections, exist_ok=True)
    with _exclusive(layout.collections / "collect.lock"):
        _remove_stale_staging(destination)
        return _collect_locked(
            layout,
            plan,
            destination,
            winners,
            files,
            schema,
            overwrite,
            clock,
            target_file_bytes,
            row_group_rows,
            progress,
        )


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One collection of a run at a time (so leftovers of a killed one can be removed safely)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CollectError(f"another collection of this run is in progress ({lock_path})") from None
        yield
    finally:
        os.close(fd)


def _remove_stale_staging(destination: Path) -> None:
    """A collection killed half-way leaves only a hidden staging directory: remove it before starting."""
    for stale in destination.parent.glob(f".{destination.name}.staging-*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)


def _collect_locked(
    layout: RunLayout,
    plan: Plan,
    destination: Path,
    winners: list[WinnerRecord],
    files: list[Path],
    schema: pa.Schema,
    overwrite: bool,
    clock: Callable[[], datetime],
    target_file_bytes: int,
    row_group_rows: int,
    progress: Callable[[int, int], None] | None,
) -> CollectResult:
    staging = destination.parent / f".{destination.name}.staging-{secrets.token_hex(6)}"
    make_private_dir(staging)
    try:
        parts = _PartWriter(staging, schema, target_file_bytes, row_group_rows)
        rows = 0
        for done, path in enumerate(files, start=1):
            table = _conform(pq.read_table(path), schema, path)
            parts.add(table)
            rows += table.num_rows
            if progress is not None:
                progress(done, len(files))
        written = parts.close()
        expected = sum(w.rows for w in winners)
        if rows != expected:
            raise CollectError(f"collected {rows} rows but the winners report {expected}; nothing was published")
        manifest = Manifest(
            run_id=plan.run_id,
            plan_sha256=digest(plan),
            rows=rows,
            shards=tuple(ShardEntry(shard=w.shard, attempt=w.attempt, rows=w.rows) for w in winners),
            schema=schema.to_string(show_schema_metadata=False),
            files=tuple(FileEntry(path=p.name, size=p.stat().st_size, sha256=sha256_file(p)) for p in written),
            collected_at=clock().isoformat(),
        )
        atomic_write(staging / MANIFEST, encode_pretty(manifest))
        _publish(staging, destination, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return CollectResult(
        dataset=destination,
        rows=rows,
        files=tuple(destination / p.name for p in written),
        manifest=destination / MANIFEST,
    )


def progress_reporter(stream: TextIO) -> Callable[[int, int], None]:
    """A ``progress`` callback for :func:`collect` that prints every 5 % of the batch files, and the last."""

    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 20) == 0:
            print(f"collected {done}/{total} batch files", file=stream, flush=True)

    return report


def read_manifest(dataset: Path) -> Manifest:
    return msgspec.json.decode((dataset / MANIFEST).read_bytes(), type=Manifest)
