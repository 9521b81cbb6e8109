"""Where a resumed attempt's dataset starts: the completed batches of the shard's best earlier attempt.

A new attempt of a shard (a requeue, a retry array, ``ddslurm retry``) does not regenerate what an earlier one
completed: its dataset directory is seeded with the batches, fill batches and preserved columns of the earlier
attempt dataset with the most rows, and Data Designer resumes from there. ``ddslurm retry --fresh`` excludes the
attempts before it (``fresh.json``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from ddslurm.config import FreshRecord, ShardLayout, read_json
from ddslurm.runtime._verify import DD_DROPPED_DIR, FILL_DIR, FILL_DROPPED_DIR, rows_on_disk


def resume_source(shard: ShardLayout, attempt_id: str) -> Path | None:
    """The earlier attempt dataset of ``shard`` with the most completed rows (and a metadata file), never
    ``attempt_id``'s own."""
    best: tuple[int, Path] | None = None
    excluded: set[str] = set()
    if shard.fresh.is_file():  # `ddslurm retry --fresh`: these attempts' batches are never continued
        excluded = set(read_json(shard.fresh, FreshRecord).excluded)
    for dataset in shard.attempts.glob("attempt-*/output/shard-*"):
        owner = dataset.parent.parent.name
        if owner == attempt_id or owner in excluded or dataset.is_symlink():
            continue
        if not (dataset / "metadata.json").is_file():
            continue
        rows, _ = rows_on_disk(dataset)
        if rows and (best is None or rows > best[0]):
            best = (rows, dataset)
    return best[1] if best else None


def seed_from(source: Path, target: Path) -> int:
    """A new dataset directory holding ``source``'s metadata, completed batches and fill batches, and the columns
    Data Designer preserved for them (hard links, never the originals moved or changed); returns the rows it
    holds."""
    (target / "parquet-files").mkdir(parents=True, mode=0o700)
    shutil.copy2(source / "metadata.json", target / "metadata.json")
    folders = (
        ("parquet-files", "batch_*.parquet"),
        (FILL_DIR, "fill_*.parquet"),
        (DD_DROPPED_DIR, "batch_*.parquet"),  # the preserved row numbers of a CPU stage's batches
        (FILL_DROPPED_DIR, "fill_*.parquet"),
    )
    for folder, pattern in folders:
        for batch in sorted((source / folder).glob(pattern)):
            try:
                pq.read_metadata(batch)
            except Exception:
                continue
            (target / folder).mkdir(mode=0o700, exist_ok=True)
            try:
                os.link(batch, target / folder / batch.name)
            except OSError:
                shutil.copy2(batch, target / folder / batch.name)
    rows, _ = rows_on_disk(target)
    return rows
