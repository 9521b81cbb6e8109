"""Helpers for tests and benchmarks: a run directory whose shards already published winners.

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.config import FileEntry, RunLayout, WinnerRecord, atomic_write, digest, encode, publish_once, sha256_file
from ddslurm.config.testing import make_plan


def make_published_run(
    root: Path, shard_batches: Sequence[Sequence[pa.Table]], *, publish: Sequence[bool] | None = None
) -> RunLayout:
    """``root/run-1`` with one shard per entry of ``shard_batches``, each written as Data Designer would
    (``parquet-files/batch_NNNNN.parquet``) and, unless ``publish`` says otherwise, published as the winner."""
    layout = RunLayout(root / "run-1")
    layout.root.mkdir(parents=True)
    plan = make_plan(layout.run_id, tuple(sum(t.num_rows for t in batches) for batches in shard_batches))
    atomic_write(layout.plan, encode(plan))
    for index, batches in enumerate(shard_batches):
        shard = layout.shard(index)
        dataset = shard.attempt("attempt-1").output / f"shard-{index:05d}"
        (dataset / "parquet-files").mkdir(parents=True)
        entries = []
        for number, table in enumerate(batches):
            path = dataset / "parquet-files" / f"batch_{number:05d}.parquet"
            pq.write_table(table, path)
            entries.append(
                FileEntry(path=str(path.relative_to(dataset)), size=path.stat().st_size, sha256=sha256_file(path))
            )
        if publish is None or publish[index]:
            winner = WinnerRecord(
                shard=index,
                attempt="attempt-1",
                rows=sum(t.num_rows for t in batches),
                dataset_dir=str(dataset),
                files=tuple(entries),
                plan_sha256=digest(plan),
                published_at="2026-01-01T00:00:00+00:00",
            )
            publish_once(shard.winner, encode(winner))
    return layout
