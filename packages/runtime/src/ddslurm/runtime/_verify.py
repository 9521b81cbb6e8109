"""Verification of a candidate dataset before it may be published."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._compute import call_function  # pyarrow.compute generates its functions at import time

from ddslurm.config import FileEntry, sha256_file
from ddslurm.runtime._engine import _section
from ddslurm.runtime.errors import EmptyOutputsError, VerificationError

_TEXT_SUFFIXES = {".json", ".jsonl", ".log", ".txt", ".yaml", ".yml", ".out", ".err", ".csv", ".md"}
_SCAN_LIMIT = 64 << 20
LLM_COLUMN_TYPES = frozenset({"llm-text", "llm-code", "llm-structured", "llm-judge"})
"""Data Designer column types whose values an LLM wrote (``column_type`` in the recipe)."""


FILL_DIR = "fill-files"
"""Batches that regenerated a shard's dropped records, beside Data Designer's own ``parquet-files``."""


def parquet_files(dataset_dir: Path) -> list[Path]:
    """Data Designer's batches, then the fill batches (the order the records are collected in)."""
    return sorted((dataset_dir / "parquet-files").glob("*.parquet")) + sorted(
        (dataset_dir / FILL_DIR).glob("*.parquet")
    )


def readable_rows(files: Iterable[Path]) -> tuple[int, int]:
    """(rows, files) of the readable Parquet ``files``: a file being written or damaged is not progress
    (verification reports it)."""
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


def verify_dataset(dataset_dir: Path, expected_rows: int) -> tuple[int, tuple[FileEntry, ...]]:
    """Every batch file readable, rows as Data Designer reported; returns (rows, file list with sha256)."""
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


def llm_columns(recipe: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the recipe's LLM columns (text, code, structured, judge), in recipe order."""
    columns = _section(recipe).get("columns")
    if not isinstance(columns, list):
        return ()
    return tuple(
        c["name"]
        for c in columns
        if isinstance(c, dict) and c.get("column_type") in LLM_COLUMN_TYPES and isinstance(c.get("name"), str)
    )


def _count_equal(values: Any, value: object) -> int:
    mask = call_function("equal", [values, pa.scalar(value)])
    return int(call_function("sum", [mask]).as_py() or 0)


def _empty_values(values: pa.Array) -> int:
    """Null values, plus blank strings (what Data Designer stores for an answer without content) and empty
    lists or maps."""
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
    """Empty or null values of each of ``columns`` over the dataset's batch files (and Data Designer's
    ``dropped-columns-parquet-files`` for columns the recipe drops). Columns found in no file are left out."""
    counts: dict[str, int] = {}
    files = [*parquet_files(dataset_dir), *sorted((dataset_dir / "dropped-columns-parquet-files").glob("*.parquet"))]
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


def _text_files(root: Path) -> Iterable[Path]:
    for dirpath, _, names in os.walk(root, followlinks=False):
        for name in names:
            path = Path(dirpath) / name
            if path.suffix in _TEXT_SUFFIXES and not path.is_symlink():
                yield path


def scan_for_secrets(root: Path, values: Iterable[str]) -> list[Path]:
    """Text files under ``root`` that contain any of the secret ``values``."""
    needles = [v.encode() for v in values if v]
    if not needles:
        return []
    hits: list[Path] = []
    for path in _text_files(root):
        with path.open("rb") as fh:
            data = fh.read(_SCAN_LIMIT)
        if any(n in data for n in needles):
            hits.append(path)
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
