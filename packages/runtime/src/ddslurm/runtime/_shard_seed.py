"""The seed rows every attempt of a shard reads, fixed once per shard.

Data Designer resumes a dataset only when the config is the one that started it (its fingerprint includes the
seed source's path), and with ``sampling_strategy: shuffle`` it draws a new random order on every ``create()``.
So whatever an attempt derives for its Data Designer to read (a shuffled run's seed block in a fixed random
order, a two-stage run's CPU-stage seed made of the GPU stage's winner) is written once, at one path of the
shard, by whichever attempt gets there first (published without replacing, like a winner), and every later
attempt, resume, rerun inside the allocation and fill reads those very rows: a resumed shuffle continues the
same order, a CPU stage resumes its own earlier batches.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ddslurm.config import STAGE_ROW, WinnerRecord, publish_once, read_regular
from ddslurm.runtime.errors import InputsError

if TYPE_CHECKING:
    import pyarrow as pa


def shard_permutation(seed: int, shard: int, rows: int) -> list[int]:
    """The fixed random order of shard ``shard``'s ``rows`` seed rows in a run whose plan records ``seed``: the same
    on every node, Python version and attempt, and independent between shards."""
    digest = hashlib.sha256(f"{seed}/{shard}".encode()).digest()
    order = list(range(rows))
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    return order


def fixed_seed_file(path: Path, build: Callable[[], pa.Table]) -> Path:
    """``path``, holding the table ``build`` makes: written (as Parquet, complete before its name appears, never
    replacing) by the first caller; every later caller, whatever the races, reads what that one wrote."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        sink = pa.BufferOutputStream()
        pq.write_table(build(), sink)
        publish_once(path, sink.getvalue().to_pybytes())  # False: another attempt was first; use its file
    if path.is_symlink() or not path.is_file():
        raise InputsError(f"{path}: the shard's seed file is missing or a symbolic link")
    return path


def read_seed_file(path: Path) -> pa.Table:
    """The rows of a shard's fixed seed file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(pa.BufferReader(read_regular(path)))
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputsError(f"{path}: the shard's seed file cannot be read: {exc}") from exc


def shuffled_block(block: pa.Table, seed: int, shard: int) -> pa.Table:
    """A shuffled run's seed block of shard ``shard`` in its fixed order."""
    return block.take(shard_permutation(seed, shard, block.num_rows))


def read_stage_winner(winner: WinnerRecord) -> pa.Table:
    """The rows of an earlier stage's winner, in its files' order, every file checked against the size and sha256
    the winner recorded (from the very bytes that are parsed); columns unified by name, so that a column that is
    all null in one batch does not make its type differ between batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(winner.dataset_dir)
    tables: list[pa.Table] = []
    for entry in winner.files:
        path = root / entry.path
        try:
            data = read_regular(path)
        except OSError as exc:
            raise InputsError(f"shard {winner.shard}: the GPU stage's file {path} cannot be read: {exc}") from exc
        if not entry.holds(data):
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


def numbered(table: pa.Table) -> pa.Table:
    """``table`` with its rows numbered (0..n-1) in :data:`STAGE_ROW`: a CPU stage's seed rows."""
    import pyarrow as pa

    if STAGE_ROW in table.column_names:
        raise InputsError(f"the GPU stage's output has a column named {STAGE_ROW!r}")
    return table.append_column(STAGE_ROW, pa.array(range(table.num_rows), type=pa.int64()))


def stage_seed_table(winner: WinnerRecord) -> pa.Table:
    """The CPU stage's seed rows: the GPU stage's winner, each row numbered in :data:`STAGE_ROW`."""
    return numbered(read_stage_winner(winner))
