"""Collection cost against its floor, measured in the same run.

Baseline: read every batch with pyarrow and write one Parquet file (what a hand-written merge costs).
Measured: ddslurm.collector.collect() on the same batches (schema unification, sha256 verification of the
published files while reading them, streaming writer, manifest with sha256, atomic publication).

Cases: ``small`` (a Data Designer-like table of four columns), ``tiny`` (many small batches: per-file
overhead) and ``wide`` (500 columns: the cost must be linear in the number of columns).

    uv run python bench/collect.py [--shards 8] [--batches 4] [--rows 5000] [--wide-columns 500]

Prints one JSON line: per case the rows, files, columns, both times in ms and ``ratio`` collect/baseline
(1.0 = free; the target is below 2.0).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
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


def _wide_table(columns: int) -> Callable[[int, int], pa.Table]:
    def make(rows: int, seed: int) -> pa.Table:
        ids = pa.array(range(seed * rows, (seed + 1) * rows), type=pa.int64())
        text = pa.array([f"value {i}" for i in range(seed * rows, (seed + 1) * rows)])
        floats = pa.array([i / 7 for i in range(seed * rows, (seed + 1) * rows)])
        kinds = (ids, text, floats)
        return pa.table({f"col_{c:04d}": kinds[c % 3] for c in range(columns)})

    return make


def build_run(
    root: Path, shards: int, batches: int, rows: int, make: Callable[[int, int], pa.Table] = _table
) -> tuple[RunLayout, list[Path]]:
    tables = [[make(rows, s * batches + b) for b in range(batches)] for s in range(shards)]
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


def run_case(
    shards: int, batches: int, rows: int, repeat: int, make: Callable[[int, int], pa.Table] = _table
) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory() as tmp:
        layout, files = build_run(Path(tmp), shards, batches, rows, make)
        base: list[float] = []
        ours: list[float] = []
        for _ in range(repeat):  # alternate, so drift on a shared machine hits both alike
            base.append(baseline(files, Path(tmp) / "baseline.parquet"))
            ours.append(measured(layout))
        columns = len(pq.read_schema(files[0]).names)
    return {
        "rows": shards * batches * rows,
        "files": len(files),
        "columns": columns,
        "baseline_ms": round(min(base) * 1000, 1),
        "collect_ms": round(min(ours) * 1000, 1),
        "ratio": round(min(ours) / min(base), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--wide-columns", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = {
        "small": run_case(args.shards, args.batches, args.rows, args.repeat),
        "tiny": run_case(args.shards, args.batches, 50, args.repeat),
        "wide": run_case(4, 4, 200, args.repeat, _wide_table(args.wide_columns)),
    }
    print(json.dumps({"bench": "collect", **cases}))


if __name__ == "__main__":
    main()
