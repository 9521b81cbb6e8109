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
from ddslurm.collector.testing import make_published_run
from ddslurm.config import RunLayout


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
    tables = [[_table(rows, s * batches + b) for b in range(batches)] for s in range(shards)]
    layout = make_published_run(root, tables)
    return layout, sorted(layout.shards.rglob("batch_*.parquet"))


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
