"""A two-stage run's CPU stage reads its shard's GPU-stage winner as its seed dataset: one Parquet file."""

from __future__ import annotations

import secrets
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.config import WinnerRecord, read_regular, sha256_bytes
from ddslurm.runtime.errors import InputsError


def read_stage_winner(winner: WinnerRecord) -> pa.Table:
    """The rows of an earlier stage's winner, in its files' order, every file checked against the size and sha256
    the winner recorded (from the very bytes that are parsed); columns unified by name, so that a column that is
    all null in one batch does not make its type differ between batches."""
    root = Path(winner.dataset_dir)
    tables: list[pa.Table] = []
    for entry in winner.files:
        path = root / entry.path
        try:
            data = read_regular(path)
        except OSError as exc:
            raise InputsError(f"shard {winner.shard}: the GPU stage's file {path} cannot be read: {exc}") from exc
        if len(data) != entry.size or sha256_bytes(data) != entry.sha256:
            raise InputsError(
                f"shard {winner.shard}: the GPU stage's file {path} changed since it was published "
                f"(size or sha256 differs from {winner.attempt}'s winner record)"
            )
        tables.append(pq.read_table(pa.BufferReader(data)))
    if not tables:
        raise InputsError(f"shard {winner.shard}: the GPU stage's winner lists no files")
    table = pa.concat_tables(tables, promote_options="default")
    if table.num_rows != winner.rows:
        raise InputsError(f"shard {winner.shard}: the GPU stage's files hold {table.num_rows} rows, not {winner.rows}")
    return table


def write_stage_seed(table: pa.Table, directory: Path) -> Path:
    """``table`` as ``stage-seed.parquet`` in ``directory`` (written under another name, then renamed)."""
    target = directory / "stage-seed.parquet"
    temp = directory / f".stage-seed-{secrets.token_hex(4)}.parquet"
    pq.write_table(table, temp)
    temp.chmod(0o600)
    temp.replace(target)
    return target
