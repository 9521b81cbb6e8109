"""Verification of a candidate dataset before it may be published."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from ddslurm.config import FileEntry, sha256_file
from ddslurm.runtime.errors import VerificationError

_TEXT_SUFFIXES = {".json", ".jsonl", ".log", ".txt", ".yaml", ".yml", ".out", ".err", ".csv", ".md"}
_SCAN_LIMIT = 64 << 20


def parquet_files(dataset_dir: Path) -> list[Path]:
    return sorted((dataset_dir / "parquet-files").glob("*.parquet"))


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
        if reported is not None and int(reported) != rows:
            raise VerificationError(f"{dataset_dir}: metadata.json reports {reported} rows but the files hold {rows}")
    if rows != expected_rows:
        raise VerificationError(f"{dataset_dir}: Data Designer reported {expected_rows} rows but the files hold {rows}")
    entries = tuple(
        FileEntry(path=str(f.relative_to(dataset_dir)), size=f.stat().st_size, sha256=sha256_file(f)) for f in files
    )
    return rows, entries


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
