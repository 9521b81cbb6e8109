"""The dataset's section of the report: its files and rows (:func:`dataset_report`), its columns from the
Parquet statistics and Data Designer's per-shard analysis (:func:`column_reports`), and a few of its rows
(:func:`sample_rows`)."""

from __future__ import annotations

import json
from typing import Any

from ddslurm.launcher.report._model import SAMPLE_CHARS, ColumnReport, DatasetReport, SampleRows
from ddslurm.launcher.report._read import ParquetColumnFacts, RunFacts


def dataset_report(facts: RunFacts) -> DatasetReport | None:
    manifest = facts.manifest
    if manifest is None:
        return None
    return DatasetReport(
        path=str(facts.layout.dataset),
        rows=manifest.rows,
        files=len(manifest.files),
        bytes=sum(f.size for f in manifest.files),
        partial_shards=[s.shard for s in manifest.shards if s.partial],
    )


def sample_rows(facts: RunFacts) -> SampleRows | None:
    """The first rows of the collected dataset, each value as text (nested values as JSON) cut to
    :data:`~._model.SAMPLE_CHARS` characters; None before ``collect``. The rows are the user's data, verified
    free of the run's secrets when each shard was published."""
    if facts.sample is None:
        return None
    columns = list(dict.fromkeys(name for row in facts.sample for name in row))
    truncated = False

    def text(value: Any) -> str | None:
        nonlocal truncated
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        shown = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
        if len(shown) <= SAMPLE_CHARS:
            return shown
        truncated = True
        return shown[: SAMPLE_CHARS - 1] + "…"

    rows = [[text(row.get(name)) for name in columns] for row in facts.sample]
    return SampleRows(columns=columns, rows=rows, truncated=truncated)


def _stat_text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parquet_columns(files: list[ParquetColumnFacts]) -> dict[str, ColumnReport]:
    """The dataset's columns from its Parquet statistics: rows, nulls (unknown once a chunk does not count them),
    and the extremes over every chunk (those of the first chunks where later ones cannot be compared)."""
    columns: dict[str, ColumnReport] = {}
    extremes: dict[str, tuple[Any, Any]] = {}
    for column in files:
        path = column.path
        entry = columns.setdefault(
            path,
            ColumnReport(
                name=path,
                type=column.physical_type
                if column.logical_type in ("None", "")
                else f"{column.logical_type} ({column.physical_type})",
                rows=0,
                nulls=0,
            ),
        )
        for chunk in column.chunks:
            entry.rows = (entry.rows or 0) + chunk.rows
            if not chunk.statistics:
                entry.nulls = None
                continue
            if entry.nulls is not None:
                entry.nulls = entry.nulls + chunk.null_count if chunk.null_count is not None else None
            if chunk.min_max is not None:
                low, high = chunk.min_max
                lo, hi = extremes.get(path, (low, high))
                try:
                    extremes[path] = (min(lo, low), max(hi, high))
                except TypeError:
                    extremes[path] = (lo, hi)
    for path, (lo, hi) in extremes.items():
        columns[path].min, columns[path].max = _stat_text(lo), _stat_text(hi)
    return columns


def _label_stages(facts: RunFacts, columns: dict[str, ColumnReport]) -> None:
    """A two-stage run's columns labelled by the stage that generated them; the GPU stage's with their kind as the
    GPU stage's own analysis gives it (the CPU stage reads them as its seed dataset, and says so)."""
    stages = facts.plan.stages
    if len(stages) < 2:
        return
    kinds: dict[str, str] = {}
    for statistics in facts.gpu_analyses:
        for stat in statistics:
            if isinstance(stat, dict) and isinstance(stat.get("column_name"), str) and stat.get("column_type"):
                kinds.setdefault(stat["column_name"], str(stat["column_type"]))
    for stage in stages:
        for name in stage.columns:
            if name not in columns:
                continue
            columns[name].stage = "GPU stage" if stage.kind == "gpu" else "CPU stage"
            if stage.kind == "gpu" and name in kinds:
                columns[name].column_type = kinds[name]


def column_reports(facts: RunFacts) -> list[ColumnReport]:
    """The Parquet columns, with Data Designer's per-shard analysis (``column_statistics``) added to them."""
    columns = _parquet_columns(facts.parquet)
    histograms: dict[str, dict[str, int]] = {}
    weights: dict[str, dict[str, tuple[float, int]]] = {}
    for statistics in facts.analyses:
        for stat in statistics:
            if not isinstance(stat, dict) or not isinstance(stat.get("column_name"), str):
                continue
            name = stat["column_name"]
            entry = columns.setdefault(name, ColumnReport(name=name, type=stat.get("pyarrow_dtype")))
            entry.column_type = stat.get("column_type") or entry.column_type
            if isinstance(stat.get("num_unique"), int):
                entry.unique_max = max(entry.unique_max or 0, stat["num_unique"])
            records = stat.get("num_records") if isinstance(stat.get("num_records"), int) else 0
            for key in ("output_tokens_mean", "input_tokens_mean"):
                if isinstance(stat.get(key), (int, float)) and records:
                    total, n = weights.setdefault(name, {}).get(key, (0.0, 0))
                    weights[name][key] = (total + float(stat[key]) * records, n + records)
            hist = (stat.get("distribution") or {}).get("histogram") if stat.get("distribution") else None
            if isinstance(hist, dict):
                merged = histograms.setdefault(name, {})
                for category, count in zip(hist.get("categories") or [], hist.get("counts") or [], strict=False):
                    merged[str(category)] = merged.get(str(category), 0) + int(count)
    _label_stages(facts, columns)
    for name, merged in histograms.items():
        columns[name].top_values = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    for name, means in weights.items():
        for key, (total, n) in means.items():
            setattr(columns[name], key, round(total / n, 3))
    return list(columns.values())
