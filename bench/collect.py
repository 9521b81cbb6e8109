"""Collection cost against its floor, measured in the same run.

Baseline: read every batch with pyarrow and write one Parquet file (what a hand-written merge costs).
Measured: ddslurm.collector.collect() on the same batches (schema unification, verification of the
published files, streaming writer, manifest with sha256, atomic publication).

    uv run python bench/collect.py [--shards 8] [--batches 4] [--rows 5000]

Prints the ratio collect / baseline (1.0 = free; the target is below 2.0).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.collector import collect
from ddslurm.config import (
    FileEntry,
    Plan,
    Resources,
    RunLayout,
    ShardSpec,
    WinnerRecord,
    atomic_write,
    digest,
    encode,
    publish_once,
    sha256_file,
)


def _table(rows: int, seed: int) -> pa.Table:
    ids = list(range(seed * rows, (seed + 1) * rows))
    return pa.table(
        {
            "topic": [f"topic-{i % 17}" for i in ids],
            "question": [f"question number {i} " * 8 for i in ids],
            "quality": [{"Relevance": {"reasoning": f"because {i}", "score": str(i % 3 + 1)}} for i in ids],
            "length": ids,
        }
    )


def build_run(root: Path, shards: int, batches: int, rows: int) -> tuple[RunLayout, list[Path]]:
    layout = RunLayout(root / "run")
    layout.root.mkdir(parents=True)
    res = Resources(time_minutes=10)
    plan = Plan(
        run_id="bench",
        run_name="bench",
        num_records=shards * batches * rows,
        shards=tuple(
            ShardSpec(index=i, first_record=i * batches * rows, num_records=batches * rows) for i in range(shards)
        ),
        resume="never",
        buffer_size=rows,
        recipe_file="-",
        recipe_sha256="-",
        snapshot_file="-",
        snapshot_sha256="-",
        secret_env=(),
        python_env="-",
        generation=res,
        collection=res,
    )
    atomic_write(layout.plan, encode(plan))
    files: list[Path] = []
    for s in range(shards):
        dataset = layout.shard(s).attempt("attempt-1").output / f"shard-{s:05d}"
        (dataset / "parquet-files").mkdir(parents=True)
        entries = []
        for b in range(batches):
            path = dataset / "parquet-files" / f"batch_{b:05d}.parquet"
            pq.write_table(_table(rows, s * batches + b), path)
            files.append(path)
            entries.append(
                FileEntry(path=str(path.relative_to(dataset)), size=path.stat().st_size, sha256=sha256_file(path))
            )
        winner = WinnerRecord(
            shard=s,
            attempt="attempt-1",
            rows=batches * rows,
            dataset_dir=str(dataset),
            files=tuple(entries),
            plan_sha256=digest(plan),
            published_at="-",
        )
        publish_once(layout.shard(s).winner, encode(winner))
    return layout, files


def baseline(files: list[Path], out: Path) -> float:
    start = time.perf_counter()
    pq.write_table(pa.concat_tables([pq.read_table(f) for f in files]), out)
    return time.perf_counter() - start


def measured(layout: RunLayout) -> float:
    start = time.perf_counter()
    collect(layout, overwrite=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        layout, files = build_run(Path(tmp), args.shards, args.batches, args.rows)
        base = min(baseline(files, Path(tmp) / "baseline.parquet") for _ in range(args.repeat))
        ours = min(measured(layout) for _ in range(args.repeat))
    rows = args.shards * args.batches * args.rows
    print(f"collect: {rows} rows in {len(files)} batch files")
    print(f"  baseline (read all + write one file): {base * 1000:8.1f} ms")
    print(f"  ddslurm collect:                      {ours * 1000:8.1f} ms")
    print(f"  ratio collect/baseline:               {ours / base:8.2f}")


if __name__ == "__main__":
    main()
