"""Verification of a candidate dataset before it may be published.

pyarrow is imported by the functions that read Parquet, when first called (and its compute kernels from
``pyarrow._compute``: ``pyarrow.compute`` generates its functions at import time): a step that only scans logs
for secrets, or a controller that begins and watches attempts, never loads it."""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddslurm.config import FileEntry, llm_columns, sha256_file
from ddslurm.runtime.errors import EmptyOutputsError, VerificationError

if TYPE_CHECKING:
    import pyarrow as pa


FILL_DIR = "fill-files"
"""Batches that regenerated a shard's dropped records, beside Data Designer's own ``parquet-files``."""

DD_DROPPED_DIR = "dropped-columns-parquet-files"
"""Where Data Designer writes what its drop processors removed, one file per batch, named like the batch
(``ArtifactStorage.dropped_columns_folder_name``; with ``RunConfig.preserve_dropped_columns``)."""

FILL_DROPPED_DIR = "fill-dropped-files"
"""The preserved dropped columns of the fill batches, named like the fill batches in ``fill-files``."""


def parquet_files(dataset_dir: Path) -> list[Path]:
    """Data Designer's batches, then the fill batches (the order the records are collected in)."""
    return sorted((dataset_dir / "parquet-files").glob("*.parquet")) + sorted(
        (dataset_dir / FILL_DIR).glob("*.parquet")
    )


def readable_rows(files: Iterable[Path]) -> tuple[int, int]:
    """(rows, files) of the readable Parquet ``files``: a file being written or damaged is not progress
    (verification reports it)."""
    import pyarrow.parquet as pq

    rows = readable = 0
    for f in files:
        try:
            rows += pq.read_metadata(f).num_rows
            readable += 1
        except Exception:
            continue
    return rows, readable


def rows_in(directory: Path) -> int:
    """Rows of the readable Parquet files directly in ``directory`` (0 when it does not exist)."""
    return readable_rows(sorted(directory.glob("*.parquet")))[0]


def rows_on_disk(directory: Path) -> tuple[int, int]:
    """(rows, files) of the readable batches in ``directory`` (a ``parquet-files`` folder), or of a whole
    dataset directory (its batches and fill batches)."""
    if (directory / "parquet-files").is_dir():
        return readable_rows(parquet_files(directory))
    return readable_rows(sorted(directory.glob("batch_*.parquet")))


def verify_dataset(dataset_dir: Path, expected_rows: int) -> tuple[int, tuple[FileEntry, ...]]:
    """Every batch file readable, rows as Data Designer reported; returns (rows, file list with sha256)."""
    import pyarrow.parquet as pq

    if dataset_dir.is_symlink() or not dataset_dir.is_dir():
        raise VerificationError(f"{dataset_dir}: dataset directory missing or a symbolic link")
    files = parquet_files(dataset_dir)
    if not files:
        raise VerificationError(f"{dataset_dir}: no Parquet batch files")
    rows = 0
    for f in files:
        try:
            rows += pq.ParquetFile(f).metadata.num_rows
        except Exception as exc:
            raise VerificationError(f"{f}: not a readable Parquet file: {exc}") from exc
    metadata = dataset_dir / "metadata.json"
    if metadata.is_file():
        reported = json.loads(metadata.read_text()).get("actual_num_records")
        batches = rows_in(dataset_dir / "parquet-files")
        if reported is not None and int(reported) != batches:
            raise VerificationError(
                f"{dataset_dir}: metadata.json reports {reported} rows but the batch files hold {batches}"
            )
    if rows != expected_rows:
        raise VerificationError(f"{dataset_dir}: {expected_rows} rows were generated but the files hold {rows}")
    entries = tuple(
        FileEntry(path=str(f.relative_to(dataset_dir)), size=f.stat().st_size, sha256=sha256_file(f)) for f in files
    )
    return rows, entries


def _count_equal(values: Any, value: object) -> int:
    import pyarrow as pa
    from pyarrow._compute import call_function

    mask = call_function("equal", [values, pa.scalar(value)])
    return int(call_function("sum", [mask]).as_py() or 0)


def _empty_values(values: pa.Array) -> int:
    """Null values, plus blank strings (what Data Designer stores for an answer without content) and empty
    lists or maps."""
    import pyarrow as pa
    from pyarrow._compute import call_function

    empty = int(values.null_count)
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    kind = values.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        empty += _count_equal(call_function("utf8_trim_whitespace", [values]), "")
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        empty += _count_equal(call_function("binary_length", [values]), 0)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        empty += _count_equal(call_function("list_value_length", [values]), 0)
    return empty


def count_empty_outputs(dataset_dir: Path, columns: Sequence[str]) -> dict[str, int]:
    """Empty or null values of each of ``columns`` over the dataset's batch files and fill batches (and the
    columns preserved beside them, :data:`DD_DROPPED_DIR` and :data:`FILL_DROPPED_DIR`, for columns the recipe
    drops). Columns found in no file are left out."""
    preserved = [f for d in (DD_DROPPED_DIR, FILL_DROPPED_DIR) for f in sorted((dataset_dir / d).glob("*.parquet"))]
    return empty_outputs_in([*parquet_files(dataset_dir), *preserved], columns)


def empty_outputs_in(files: Iterable[Path], columns: Sequence[str]) -> dict[str, int]:
    """Empty or null values of each of ``columns`` over the Parquet ``files``, in the order of ``columns``
    (columns found in no file are left out)."""
    import pyarrow.parquet as pq

    counts: dict[str, int] = {}
    for f in files:
        parquet = pq.ParquetFile(f)
        present = [c for c in columns if c in parquet.schema_arrow.names]
        for c in present:
            counts.setdefault(c, 0)
        if not present:
            continue
        for batch in parquet.iter_batches(columns=present):
            for c in present:
                counts[c] += _empty_values(batch.column(c))
    return {c: counts[c] for c in columns if c in counts}


def reject_empty_outputs(dataset_dir: Path, recipe: Mapping[str, Any], limit: int | None, rows: int) -> dict[str, int]:
    """Fail the candidate when an LLM column holds more than ``limit`` empty or null values (None: no check).

    An endpoint that answers HTTP 200 without ``choices`` (or with empty content) is stored by Data Designer as
    an empty string, not as an error. A rejected dataset is renamed to ``rejected-<name>-<token>`` next to
    where it was (kept for inspection, nothing deleted) so that neither the rerun inside the allocation nor a
    later ``retry`` resumes from its batches: the next generation starts the shard again. Returns the counts.
    """
    if limit is None:
        return {}
    counts = count_empty_outputs(dataset_dir, llm_columns(recipe))
    over = {c: n for c, n in counts.items() if n > limit}
    if not over:
        return counts
    aside = dataset_dir.with_name(f"rejected-{dataset_dir.name}-{secrets.token_hex(3)}")
    dataset_dir.rename(aside)
    detail = ", ".join(f"{c}: {n} of {rows}" for c, n in counts.items() if n)
    raise EmptyOutputsError(
        f"empty or null LLM outputs per column ({detail}) exceed max_empty_outputs: {limit} "
        f"(an endpoint answered without content, e.g. HTTP 200 without choices); the dataset was set aside as "
        f"{aside} and is not resumed, so a rerun or `ddslurm retry` generates the shard again",
        counts=over,
    )


_CHUNK = 8 << 20
"""Bytes the secret scan reads at a time (plus the overlap that finds a value split across two reads)."""
_PARQUET_MAGIC = b"PAR1"
_CAST_FOR_MATCH = ("string_view", "binary_view")
"""View types the substring match casts first (to ``string`` and ``binary``)."""


def _files(root: Path) -> Iterator[Path]:
    """Every entry under ``root`` (or ``root`` itself when it is not a directory), sorted, without following
    links below ``root``; what is not a regular file is skipped when it is opened."""
    if not root.is_dir():
        if os.path.lexists(root):
            yield root
        return
    for dirpath, dirnames, names in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(names):
            yield Path(dirpath) / name


def _bytes_hold(fd: int, needles: Sequence[bytes]) -> tuple[bool, bool]:
    """(whether the file's bytes hold any needle, whether it starts like a Parquet file), read in ``_CHUNK``
    reads that keep the last ``len(longest) - 1`` bytes of the previous read in front of the next."""
    overlap = max(len(n) for n in needles) - 1
    tail = b""
    first = True
    parquet = False
    while chunk := os.read(fd, _CHUNK):
        if first:
            parquet, first = chunk.startswith(_PARQUET_MAGIC), False
        data = tail + chunk
        if any(n in data for n in needles):
            return True, parquet
        tail = data[-overlap:] if overlap else b""
    return False, parquet


def _array_holds(values: pa.Array, patterns: Sequence[str]) -> bool:
    """Whether any string or binary value in ``values`` (walking lists, maps, structs, unions, dictionaries,
    run-end encoded and extension arrays) contains one of ``patterns``."""
    import pyarrow as pa
    from pyarrow._compute import CastOptions, MatchSubstringOptions, call_function

    kind = values.type
    if isinstance(values, pa.ExtensionArray):
        return _array_holds(values.storage, patterns)
    if pa.types.is_dictionary(kind):
        return _array_holds(values.dictionary, patterns)
    if pa.types.is_run_end_encoded(kind):
        return _array_holds(values.values, patterns)
    if pa.types.is_map(kind):
        return _array_holds(values.keys, patterns) or _array_holds(values.items, patterns)
    if (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or pa.types.is_list_view(kind)
        or pa.types.is_large_list_view(kind)
    ):
        return _array_holds(values.values, patterns)
    if pa.types.is_struct(kind) or pa.types.is_union(kind):
        return any(_array_holds(values.field(i), patterns) for i in range(kind.num_fields))
    if pa.types.is_fixed_size_binary(kind):
        values = call_function("cast", [values], CastOptions.safe(pa.binary()))
    elif str(kind) in _CAST_FOR_MATCH:
        target = pa.string() if str(kind) == "string_view" else pa.binary()
        values = call_function("cast", [values], CastOptions.safe(target))
    elif not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return False
    return any(
        call_function("any", [call_function("match_substring", [values], MatchSubstringOptions(p))]).as_py()
        for p in patterns
    )


def _parquet_holds(fd: int, patterns: Sequence[str]) -> bool:
    """Whether a decoded value of the Parquet file open at ``fd`` contains one of ``patterns`` (compressed or
    encoded pages hide the bytes), read one row group at a time. A file that cannot be decoded (torn, damaged)
    holds none: its bytes were read like any other file's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.lseek(fd, 0, os.SEEK_SET)
    with os.fdopen(os.dup(fd), "rb") as fh:
        try:
            parquet = pq.ParquetFile(fh)
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group, use_threads=False)
                if any(_array_holds(chunk, patterns) for column in table.columns for chunk in column.chunks):
                    return True
        except (pa.ArrowException, OSError):
            return False
    return False


def scan_for_secrets(roots: Sequence[Path], values: Iterable[str]) -> list[Path]:
    """Files under any of ``roots`` that contain any of the secret ``values``, each listed once.

    Every regular file is read in full, whatever its name or size, streamed in ``_CHUNK`` reads that overlap by
    the longest value's length less one (a value split across two reads is found). A Parquet file (one that
    starts with ``PAR1``) is also decoded row group by row group and every string and binary value, nested ones
    included, is searched: compression hides the bytes of a key that reached a seed row or an LLM answer.
    Links are never followed (a link under a root, to a file or a directory, is not read) and what is not a
    regular file (a pipe, a socket) is skipped. A root that does not exist holds nothing.
    """
    patterns = sorted({v for v in values if v})
    if not patterns:
        return []
    needles = [p.encode() for p in patterns]
    hits: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for root in roots:
        for path in _files(root):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a link (ELOOP), or gone since it was listed
                continue
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
                found, parquet = _bytes_hold(fd, needles)
                if found or (parquet and _parquet_holds(fd, patterns)):
                    hits.append(path)
            finally:
                os.close(fd)
    return hits


def make_private(root: Path) -> None:
    """Owner-only permissions on a dataset tree (directories 0700, files 0600); links are not followed."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o600)
        for name in dirnames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o700)
    root.chmod(0o700)
