"""``ddslurm report``: the numbers from a synthetic run directory, the command, and the page in a headless browser."""

from __future__ import annotations

import io
import itertools
import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from ddslurm.collector import collect
from ddslurm.collector.testing import make_published_run
from ddslurm.config import (
    AttemptRecord,
    BusySpan,
    DeploymentPlan,
    ReplicaPlan,
    RunLayout,
    ServingPlan,
    StagePlan,
    SubmissionRecord,
    WinnerRecord,
    atomic_write,
    busy_log,
    encode,
    make_private_dir,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.launcher.cli import main
from ddslurm.launcher.cluster._slurm import Slurm, tres_gpus
from ddslurm.launcher.report import parse_client_out, render_html, report_json, run_report
from ddslurm.launcher.testing import FakeSlurm, console_lines, find_chromium, page_layout, pixel_variance, run_chromium

CHROMIUM = find_chromium()
T = "2025-12-31T23:"  # every event of the synthetic run is in the last ten minutes of 2025


def _config_lines(model: str, alias: str, provider: str) -> str:
    return (
        f"[23:50:30] [INFO] 📝 llm-text model config for column 'q'\n"
        f"[23:50:30] [INFO]   |-- model: '{model}'\n"
        f"[23:50:30] [INFO]   |-- model alias: '{alias}'\n"
        f"[23:50:30] [INFO]   |-- model provider: '{provider}'\n"
        f"[23:50:30] [INFO]   |-- inference parameters:\n"
        f"[23:50:30] [INFO]   |  |-- temperature=0.70\n"
    )


def _usage(model: str, tokens: str, requests: str) -> str:
    return (
        f"[23:52:00] [INFO]   |-- model: {model}\n"
        f"[23:52:00] [INFO]   |-- tokens: {tokens}\n"
        f"[23:52:00] [INFO]   |-- requests: {requests}\n"
    )


HEAD = "[23:52:00] [INFO] 📊 Model usage summary:\n"
SEP = "[23:52:00] [INFO]   |--\n"
TAIL = "[23:52:00] [INFO] 📐 Measuring dataset column statistics:\n[23:52:00] [INFO]   |-- 🎲 column: 'a'\n"
CHECKS = (
    "[23:50:30] [INFO] 🩺 Running health checks for models...\n"
    "[23:50:30] [INFO]   |-- 👀 Checking 'local/writer-8b' in provider named 'ddslurm-local' "
    "for model alias 'writer'...\n"
    "[23:50:30] [INFO]   |-- ✅ Passed!\n"
    "[23:50:30] [INFO]   |-- 👀 Checking 'demo/judge-70b' in provider named 'demo-hosted' for model alias 'judge'...\n"
    "[23:50:30] [INFO]   |-- ✅ Passed!\n"
)
CONFIGS = (
    CHECKS
    + _config_lines("local/writer-8b", "writer", "ddslurm-local")
    + _config_lines("demo/judge-70b", "judge", "demo-hosted")
)

SACCT = (
    "100_0|COMPLETED|130|billing=4,cpu=4,gres/gpu=2,mem=8G,node=1|2025-12-31T23:50:10|2025-12-31T23:52:20\n"
    "100_1|FAILED|85|billing=4,cpu=4,gres/gpu:h100=2,mem=8G,node=1|2025-12-31T23:50:10|2025-12-31T23:51:35\n"
    "104_0|COMPLETED|50|billing=4,cpu=4,mem=8G,node=1|2025-12-31T23:53:20|2025-12-31T23:54:10\n"
)


def _event(event: str, at: str, **fields: Any) -> str:
    return json.dumps({"event": event, "level": "info", "timestamp": f"{T}{at}Z", **fields}) + "\n"


def _attempt(layout: RunLayout, shard: int, attempt: str, job: str, task: str, **fields: Any) -> Path:
    record = AttemptRecord(
        shard=shard,
        attempt=attempt,
        job_id=job,
        node="n1",
        slurm_log=str(layout.logs / f"slurm-{task}.out"),
        client_runs=1,
        **fields,
    )
    path = layout.shard(shard).attempt(attempt).dir
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / "attempt.json", encode(record))
    return path


def make_report_run(root: Path) -> RunLayout:
    """A finished mixed run (local ``writer`` on 2 GPUs, hosted ``judge``): shard 0 succeeded at once; shard 1 failed
    (endpoint errors), then a retry resumed its one row and was accepted as partial. Collected."""
    layout = make_published_run(
        root,
        [[pa.table({"a": [1, 2, 3], "s": ["x", "y", "z"]})], [pa.table({"a": [4, 5], "s": ["p", None]})]],
        partial=[1],
    )
    collect(layout)
    serving = ServingPlan(
        deployments=(
            DeploymentPlan(
                alias="writer",
                model="/models/writer",
                served_model_name="local/writer-8b",
                tensor_parallel=2,
                replicas=(ReplicaPlan(index=0, gpus=2, cpus=4),),
                startup_timeout=600,
            ),
        ),
        gpus=2,
    )
    atomic_write(layout.plan, encode(make_plan(layout.run_id, (3, 2), serving=serving)))
    layout.submissions.mkdir()
    layout.logs.mkdir()
    for array, shards, at, kind in (("100", (0, 1), "50:00", "initial"), ("104", (1,), "53:00", "retry")):
        sub = SubmissionRecord(array_job_id=array, shards=shards, submitted_at=f"{T}{at}+00:00", script="-", kind=kind)
        atomic_write(layout.submissions / f"{array}.json", encode(sub))
    (layout.logs / "slurm-100_0.out").write_text(
        _event("attempt.started", "50:10") + "a line of vLLM output\n" + _event("serving.ready", "50:30")
    )
    (layout.logs / "slurm-100_1.out").write_text(_event("serving.ready", "50:40"))
    (layout.logs / "slurm-104_0.out").write_text(_event("serving.ready", "53:50"))

    a0 = _attempt(
        layout, 0, "attempt-1", "101", "100_0", state="succeeded", rows=3,
        started_at=f"{T}50:10+00:00", ended_at=f"{T}52:05+00:00",
    )  # fmt: skip
    (a0 / "client.log").write_text(
        _event("batch.complete", "51:00", rows=2) + _event("batch.complete", "52:00", rows=3)
    )
    (a0 / "client.out").write_text(
        CONFIGS
        + HEAD
        + _usage("demo/judge-70b", "input=50, output=10, total=60, tps=7", "success=3, failed=0, total=3, rpm=2")
        + SEP
        + _usage("local/writer-8b", "input=100, output=200, total=300, tps=10", "success=3, failed=1, total=4, rpm=3")
        + TAIL
    )
    f0 = _attempt(
        layout, 1, "attempt-0", "102", "100_1", state="failed", reason="endpoint_errors", rows=1,
        message="writer: 4 requests failed", started_at=f"{T}50:10+00:00", ended_at=f"{T}51:30+00:00",
    )  # fmt: skip
    (f0 / "client.log").write_text(_event("batch.complete", "51:00", rows=1))
    (f0 / "client.out").write_text(
        CONFIGS
        + HEAD
        + _usage("local/writer-8b", "input=10, output=20, total=30, tps=1", "success=1, failed=4, total=5, rpm=1")
    )
    a1 = _attempt(
        layout, 1, "attempt-1", "105", "104_0", state="partial", rows=2, resumed_from="attempt-0", resumed_rows=1,
        started_at=f"{T}53:20+00:00", ended_at=f"{T}54:05+00:00",
    )  # fmt: skip
    (a1 / "client.log").write_text(
        _event("batch.complete", "53:55", rows=1)  # only the resumed row: nothing new
        + _event("fill.start", "53:56", missing=1)
        + _event("fill.done", "54:00", added=1, missing=0)
    )
    (a1 / "client.out").write_text(
        CONFIGS
        + HEAD
        + _usage("demo/judge-70b", "input=20, output=4, total=24, tps=3", "success=2, failed=0, total=2, rpm=1")
        + SEP
        + _usage(
            "local/writer-8b", "input=5, output=5, reasoning=3, total=10, tps=2", "success=1, failed=0, total=1, rpm=1"
        )
    )
    for shard, categories, counts in ((0, ["x", "y", "z"], [1, 1, 1]), (1, ["p"], [1])):
        winner = read_json(layout.shard(shard).winner, WinnerRecord)
        stats = {
            "column_statistics": [
                {
                    "column_name": "s",
                    "column_type": "sampler",
                    "num_records": sum(counts) + shard,
                    "num_null": shard,
                    "num_unique": len(categories),
                    "distribution": {"histogram": {"categories": categories, "counts": counts}},
                },
                {
                    "column_name": "q",
                    "column_type": "llm-text",
                    "num_records": 2 + shard,
                    "output_tokens_mean": 10.0 + shard,
                },
            ]
        }
        (Path(winner.dataset_dir) / "metadata.json").write_text(json.dumps(stats))
    return layout


def test_the_numbers_of_a_synthetic_run(tmp_path: Path) -> None:
    layout = make_report_run(tmp_path)
    fake = FakeSlurm(sacct=SACCT)
    report = run_report(layout, Slurm(fake))
    assert [c for c in fake.calls if c[0] == "sacct"] == [
        [
            "sacct", "-X", "-n", "--duplicates", "--parsable2", "-j", "100,104",
            "--format=JobID,State,ElapsedRaw,AllocTRES,Start,End",
        ]
    ]  # fmt: skip
    assert (report.records_requested, report.records_done, report.shards_done, report.attempts) == (5, 5, 2, 3)

    phases = {(s.shard, s.attempt): {p.name: p.seconds for p in s.phases} for s in report.timeline}
    assert phases == {
        (0, "attempt-1"): {"queued": 10, "startup": 20, "generating": 90, "publishing": 480},
        (1, "attempt-0"): {"queued": 10, "startup": 30, "generating": 50},
        (1, "attempt-1"): {"queued": 20, "startup": 30, "generating": 10, "publishing": 360},
    }
    assert [s.job for s in report.timeline] == ["100_0", "100_1", "104_0"]
    assert [s.winner for s in report.timeline] == [True, False, True]

    # batches: +2 (shard 0) and +1 (shard 1) at 51:00, +1 at 52:00, +1 (a fill; the resumed row not again) at 54:00
    assert [(b.rows, b.total) for b in report.batches] == [(2, 2), (1, 3), (1, 4), (1, 5)]
    assert report.rows_generated == 5 and sum(b.rows for b in report.rate) == pytest.approx(5, abs=0.01)
    # over the union of the generating spans (50:30-52:00 holds shard 1's first 50:40-51:30; then 53:50-54:00)
    assert report.records_per_second == round(5 / (90 + 10), 3)
    assert [(r.stage, r.rows, r.active_s) for r in report.stages] == [(None, 5, 100.0)]

    models = {m.alias: m for m in report.models}
    writer, judge = models["writer"], models["judge"]
    assert (writer.local, writer.provider, writer.model) == (True, "ddslurm-local", "local/writer-8b")
    assert (writer.requests, writer.successful, writer.failed, writer.error_rate) == (10, 5, 5, 0.5)
    assert (writer.input_tokens, writer.output_tokens, writer.total_tokens, writer.summaries) == (115, 225, 340, 3)
    assert (judge.local, judge.provider, judge.requests, judge.failed) == (False, "demo-hosted", 5, 0)
    assert (judge.input_tokens, judge.output_tokens, judge.total_tokens) == (70, 14, 84)
    assert writer.latency_s is None
    # tokens over the union of the spans of the attempts that used the model, not the sum of the summaries' rates
    assert (writer.active_s, writer.tokens_per_second) == (100.0, round(340 / 100, 1))
    assert (judge.active_s, judge.tokens_per_second) == (100.0, round(84 / 100, 1))
    assert (writer.health_checks, judge.health_checks) == (3, 3)

    gpu = report.gpu
    assert gpu is not None and gpu.source == "sacct"
    assert [(j.job, j.elapsed_s, j.gpus) for j in gpu.jobs] == [("100_0", 130, 2), ("100_1", 85, 2), ("104_0", 50, 2)]
    assert gpu.allocated_gpu_hours == round((130 + 85 + 50) * 2 / 3600, 6)
    assert gpu.generating_gpu_hours == round((90 + 50 + 10) * 2 / 3600, 6)
    # no proxy busy log: each allocation's attempts' generating spans
    assert [(a.job, a.gpus, a.allocated_s, a.busy_s, a.busy_from, a.clamped) for a in gpu.allocations] == [
        ("100_0", 2, 260.0, 90.0, "attempts", False),
        ("100_1", 2, 170.0, 50.0, "attempts", False),
        ("104_0", 2, 100.0, 10.0, "attempts", False),
    ]

    assert [(f.reason, f.count, f.shards, f.message) for f in report.failures] == [
        ("endpoint_errors", 1, [1], "writer: 4 requests failed"),
        ("partial", 1, [1], None),
    ]
    assert report.dataset is not None
    assert (report.dataset.rows, report.dataset.files, report.dataset.partial_shards) == (5, 1, [1])
    columns = {c.name: c for c in report.columns}
    assert (columns["a"].rows, columns["a"].nulls, columns["a"].min, columns["a"].max) == (5, 0, "1", "5")
    assert (columns["s"].nulls, columns["s"].min, columns["s"].max, columns["s"].column_type) == (
        1,
        "p",
        "z",
        "sampler",
    )
    assert columns["s"].top_values == [("p", 1), ("x", 1), ("y", 1), ("z", 1)]
    assert columns["q"].output_tokens_mean == round((10.0 * 2 + 11.0 * 3) / 5, 3)


def _at(at: str) -> datetime:
    return datetime.fromisoformat(f"{T}{at}+00:00")


def _overlap(start: datetime, end: datetime, lo: datetime, hi: datetime) -> float:
    return max(0.0, (min(end, hi) - max(start, lo)).total_seconds())


def test_every_chart_agrees_with_the_headline(tmp_path: Path) -> None:
    """Issue 40: the records/s bars were 5-50x the headline (a batch's rows all in the bin it ended in, over the
    bin's width). Recomputed here from what make_report_run wrote: the headline, each bar, the records line."""
    from ddslurm.launcher.report._html import _figures

    report = run_report(make_report_run(tmp_path), Slurm(FakeSlurm(sacct=SACCT)))
    # generating spans (serving ready to the last batch; the failed attempt to its end), already without overlap
    generating = [(_at("50:30"), _at("52:00")), (_at("53:50"), _at("54:00"))]  # + 50:40-51:30, inside the first
    # each batch: the rows it added, from the attempt's previous batch (or its serving ready) to the batch
    made = [("50:30", "51:00", 2), ("51:00", "52:00", 1), ("50:40", "51:00", 1), ("53:50", "54:00", 1)]
    rows, seconds = sum(n for *_, n in made), sum((e - s).total_seconds() for s, e in generating)
    assert (rows, seconds) == (5, 100.0)
    assert report.records_per_second == round(rows / seconds, 3) == 0.05
    assert re.search(r'data-card="records/s">records/s<b>0.05</b>', render_html(report))

    # bins of 10 s (230 s from the first start, 50:10, to the last batch, 54:00, in at most 24: 9.6 s, rounded up)
    edges = [(_at("50:10") + timedelta(seconds=10 * i)).isoformat() for i in range(24)]
    assert [(b.start, b.end) for b in report.rate] == list(itertools.pairwise(edges))
    for b in report.rate:
        lo, hi = datetime.fromisoformat(b.start), datetime.fromisoformat(b.end)
        expected = sum(n * _overlap(_at(s), _at(e), lo, hi) / (_at(e) - _at(s)).total_seconds() for s, e, n in made)
        busy = sum(_overlap(s, e, lo, hi) for s, e in generating)
        assert (b.rows, b.generating_s) == (pytest.approx(expected, abs=1e-3), pytest.approx(busy)), b
        assert b.rate == (pytest.approx(expected / busy, abs=1e-3) if busy else None), b
    # the bars, weighted by the seconds they were generating, average to the headline; none is far above it
    known = [b for b in report.rate if b.rate is not None]
    assert sum(b.rate * b.generating_s for b in known) / sum(b.generating_s for b in known) == pytest.approx(
        report.records_per_second, abs=1e-3
    )
    assert max(b.rate for b in known) <= 3 * report.records_per_second

    # what the chart draws is those numbers: the bars, the headline as a line, the running total up to the records
    figure = _figures(report)["throughput"]
    traces = {t.name: t for t in figure.data}
    assert list(traces["records/s"].y) == [b.rate for b in report.rate]
    assert set(traces["records/s over the run"].y) == {report.records_per_second}
    assert list(traces["records generated"].y) == [2, 3, 4, 5] and report.records_done == 5
    assert figure.layout.yaxis2.dtick == 1 and figure.layout.yaxis2.tickformat == ",d"  # whole records
    assert figure.layout.xaxis.title.text == "time (UTC)<br>from 2025-12-31 23:50:10"


def test_a_spares_wait_is_drawn_as_its_own_phase_not_as_generating(tmp_path: Path) -> None:
    """Issue 40: shard 0's attempt was a pulling allocation's spare (begun 50:10 while the workers were busy), whose
    client began generating at 51:00: the timeline draws 50:10-51:00 as the spare's wait, not as serving start-up and
    generating, and the generating span (the run's records/s, its GPU time) starts at 51:00."""
    layout = make_report_run(tmp_path)
    path = layout.shard(0).attempt("attempt-1").record
    record = read_json(path, AttemptRecord)
    atomic_write(path, encode(msgspec.structs.replace(record, spare=True, generating_at=f"{T}51:00+00:00")))
    report = run_report(layout, Slurm(FakeSlurm(sacct=SACCT)))
    [span] = [s for s in report.timeline if (s.shard, s.attempt) == (0, "attempt-1")]
    assert [(p.name, p.start, p.seconds) for p in span.phases] == [
        ("spare", f"{T}50:10+00:00", 50.0),  # to generating_at
        ("generating", f"{T}51:00+00:00", 60.0),  # to its last batch, 52:00
        ("publishing", f"{T}52:00+00:00", 480.0),
    ]
    # the union of the generating spans: 50:40-52:00 (shard 1's first attempt from 50:40), then 53:50-54:00
    assert [(r.rows, r.active_s) for r in report.stages] == [(5, 80 + 10)]
    names = {json.loads(m) for m in re.findall(r'"name":("(?:[^"\\]|\\.)*")', render_html(report))}
    assert "spare: waiting for a worker" in names, names


def test_accounting_falls_back_to_attempt_records_when_sacct_fails(tmp_path: Path) -> None:
    layout = make_report_run(tmp_path)

    def broken(argv: Any, *, env: Any = None) -> Any:
        from ddslurm.launcher.cluster._slurm import Completed

        return Completed(1, "", "sacct: error: Problem talking to the database")

    report = run_report(layout, Slurm(broken))
    gpu = report.gpu
    assert gpu is not None and gpu.source == "none" and gpu.jobs == []
    assert any("sacct" in note and "unknown" in note for note in report.notes)
    # what cannot be known is not estimated: no allocated GPU time, no share of it
    assert (gpu.allocated_gpu_hours, gpu.utilisation) == (None, None)
    assert [a.allocated_s for a in gpu.allocations] == [None, None, None]
    assert gpu.generating_gpu_hours == round((90 + 50 + 10) * 2 / 3600, 6)
    page = render_html(report)
    assert "unknown (no sacct)" in page and "GPU-hours allocated unknown (sacct could not be read)" in page
    assert report_json(report)["gpu"]["allocated_gpu_hours"] is None


STAGED_SACCT = (
    "300_0|COMPLETED|80|billing=4,cpu=4,gres/gpu=2,mem=8G,node=1|2025-12-31T23:50:10|2025-12-31T23:51:30\n"
    "302_0|COMPLETED|30|billing=2,cpu=2,mem=2G,node=1|2025-12-31T23:51:35|2025-12-31T23:52:05\n"
)


def _staged_attempt(layout: RunLayout, shard: int, stage: int | None, job: str, task: str, **fields: Any) -> Path:
    """An attempt of a pulling allocation (job ``job``, array task ``task``) of a two-stage run."""
    record = AttemptRecord(
        shard=shard, attempt=f"attempt-{job}", job_id=job, node="n1", slurm_log=str(layout.logs / f"slurm-{task}.out"),
        allocation=str(layout.allocation(job)), client_runs=1, state="succeeded", rows=4, **fields,
    )  # fmt: skip
    path = layout.stage_shard(shard, stage).attempt(record.attempt).dir
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / "attempt.json", encode(record))
    return path


def _win(layout: RunLayout, shard: int, stage: int | None, job: str, at: str, stats: list[Any]) -> None:
    data = layout.root / "data" / f"{shard}-{stage}"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text(json.dumps({"column_statistics": stats}))
    winner = WinnerRecord(
        shard=shard, attempt=f"attempt-{job}", rows=4, dataset_dir=str(data), files=(), plan_sha256="-",
        published_at=f"{T}{at}+00:00",
    )  # fmt: skip
    atomic_write(layout.stage_shard(shard, stage).winner, encode(winner))


def make_staged_run(
    root: Path, busy: dict[int, list[tuple[str, str]]] | None, *, replicas: int = 1, proxy: bool = False
) -> RunLayout:
    """A finished two-stage run of 2 shards (4 records each): its GPU stage in ONE pulling allocation (array 300,
    job 301, 2 GPUs: ``replicas`` replicas of tensor parallel 2 / ``replicas``) whose two client workers generate
    both shards at once (generating 50:20-51:00 and 50:20-51:15), its CPU stage in one CPU allocation (array 302,
    job 303) after it. ``busy``: replica index → the spans of its busy log (``(from, to)`` as ``MM:SS``), None:
    none was written. ``proxy``: the deployment is behind its proxy (every plan since proxies; the busy logs are
    then the whole truth)."""
    layout = RunLayout(root / "run-2")
    make_private_dir(layout.root)
    serving = ServingPlan(
        deployments=(
            DeploymentPlan(
                alias="writer", model="/models/writer", served_model_name="local/writer-8b",
                tensor_parallel=2 // replicas, startup_timeout=600, proxy=proxy,
                replicas=tuple(ReplicaPlan(index=i, gpus=2 // replicas, cpus=4) for i in range(replicas)),
            ),
        ),
        gpus=2,
    )  # fmt: skip
    stages = (StagePlan(kind="gpu", columns=("q",)), StagePlan(kind="cpu", columns=("j",)))
    plan = make_plan(layout.run_id, (4, 4), serving=serving, stages=stages, allocations=1, client_workers=2)
    atomic_write(layout.plan, encode(plan))
    for path in (layout.submissions, layout.logs, layout.allocations):
        path.mkdir()
    for array, stage in (("300", 0), ("302", 1)):
        sub = SubmissionRecord(
            array_job_id=array, shards=(0, 1), tasks=1, submitted_at=f"{T}50:00+00:00", script="-", stage=stage,
            after_any=("300",) if stage else (),
        )  # fmt: skip
        atomic_write(layout.submissions / f"{array}.json", encode(sub))
    (layout.logs / "slurm-300_0.out").write_text(_event("serving.ready", "50:20"))
    (layout.logs / "slurm-302_0.out").write_text(_event("serving.ready", "51:38"))  # no servers: no GPU time
    layout.allocation("301").mkdir()
    for replica, spans in (busy or {}).items():
        lines = [encode(BusySpan(start=_epoch(a), end=_epoch(b))).decode() for a, b in spans]
        busy_log(layout.allocation("301"), "writer", replica).write_text("".join(lines))
    writer = _usage("local/writer-8b", "input=100, output=200, total={}, tps=50", "success=4, failed=0, total=4, rpm=3")
    judge = _usage("demo/judge-70b", "input=10, output=5, total={}, tps=40", "success=4, failed=0, total=4, rpm=2")
    gpu = [("50:10", "51:10", ("50:40", 2), ("51:00", 4), 300), ("50:12", "51:20", ("50:50", 3), ("51:15", 4), 200)]
    for shard, (start, end, b1, b2, tokens) in enumerate(gpu):
        path = _staged_attempt(
            layout, shard, 0, "301", "300_0", started_at=f"{T}{start}+00:00", ended_at=f"{T}{end}+00:00"
        )
        (path / "client.log").write_text(
            _event("batch.complete", b1[0], rows=b1[1]) + _event("batch.complete", b2[0], rows=b2[1])
        )
        (path / "client.out").write_text(CONFIGS + HEAD + writer.format(tokens))
        _win(layout, shard, 0, "301", "51:25", [{"column_name": "q", "column_type": "llm-text", "num_records": 4}])
    cpu = [("51:40", "52:00", "51:50", 60), ("51:41", "52:05", "52:00", 40)]
    for shard, (start, end, batch, tokens) in enumerate(cpu):
        path = _staged_attempt(
            layout, shard, None, "303", "302_0", started_at=f"{T}{start}+00:00", ended_at=f"{T}{end}+00:00"
        )
        (path / "client.log").write_text(_event("batch.complete", batch, rows=4))
        (path / "client.out").write_text(CONFIGS + HEAD + judge.format(tokens))
        _win(
            layout, shard, None, "303", "52:10",
            [{"column_name": "q", "column_type": "seed-dataset", "num_records": 4},
             {"column_name": "j", "column_type": "llm-judge", "num_records": 4}],
        )  # fmt: skip
    return layout


def _epoch(at: str) -> float:
    return datetime.fromisoformat(f"{T}{at}+00:00").timestamp()


def _epoch_of(at: str) -> float:
    return datetime.fromisoformat(at).timestamp()


def test_two_workers_sharing_an_allocations_gpus_count_its_time_once(tmp_path: Path) -> None:
    report = run_report(make_staged_run(tmp_path, None), Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    gpu = report.gpu
    assert gpu is not None and gpu.source == "sacct"
    # the two workers generated 40 s and 55 s at once: the allocation's GPUs were busy 55 s, not 95 s
    old_sum = (40 + 55) * 2
    assert old_sum > 80 * 2  # what adding up the workers' time gave: above what the allocation was allocated
    [allocation] = gpu.allocations
    assert (allocation.job, allocation.gpus, allocation.allocated_s) == ("300_0", 2, 160.0)
    assert (allocation.busy_s, allocation.busy_from, allocation.generating_gpu_s) == (55.0, "attempts", 110.0)
    assert gpu.allocated_gpu_hours == round(160 / 3600, 6)  # the CPU stage's allocation held no GPU
    assert gpu.generating_gpu_hours == round(110 / 3600, 6) <= gpu.allocated_gpu_hours
    assert gpu.utilisation == round(110 / 160, 4) <= 1
    assert any("no proxy busy log for allocation(s) 300_0" in n for n in report.notes)

    # rates: each stage's rows over the union of its attempts' generating spans; the run's over both stages'
    assert [(r.stage, r.rows, r.active_s) for r in report.stages] == [("gpu", 8, 55.0), ("cpu", 8, 20.0)]
    assert [r.records_per_second for r in report.stages] == [round(8 / 55, 3), round(8 / 20, 3)]
    assert report.rows_generated == 8 and report.records_per_second == round(8 / (55 + 20), 3)
    models = {m.alias: m for m in report.models}
    assert (models["writer"].active_s, models["writer"].tokens_per_second) == (55.0, round(500 / 55, 1))
    assert (models["judge"].active_s, models["judge"].tokens_per_second) == (20.0, round(100 / 20, 1))

    # records over time: both stages, bins of one round width over the whole run (50:10 to 52:00: 110 s in 24
    # bins of at least 4.6 s, so 5 s from 50:10), each stage's rows and the seconds it was generating in each
    assert {b.stage for b in report.rate} == {"gpu", "cpu"} == {b.stage for b in report.batches}
    for stage, rate in zip(("gpu", "cpu"), report.stages, strict=True):
        bins = [b for b in report.rate if b.stage == stage]
        assert len(bins) == 22 and {_epoch_of(b.end) - _epoch_of(b.start) for b in bins} == {5.0}
        assert bins[0].start == f"{T}50:10+00:00" and sum(b.rows for b in bins) == pytest.approx(8, abs=0.01)
        assert sum(b.generating_s for b in bins) == pytest.approx(rate.active_s)
        assert max(b.total for b in report.batches if b.stage == stage) == 8

    # the CPU stage waited for the GPU stage (to 51:20, the last GPU-stage attempt's end), then was queued
    phases = {(s.shard, s.stage): {p.name: p.seconds for p in s.phases} for s in report.timeline}
    assert phases[(0, "cpu")] == {"waiting": 80, "queued": 20, "generating": 10, "publishing": 20}
    assert phases[(1, "cpu")]["waiting"] == 81 - 1 and "queued" in phases[(1, "cpu")]
    assert "waiting" not in phases[(0, "gpu")]

    columns = {c.name: c for c in report.columns}
    assert (columns["q"].stage, columns["q"].column_type) == ("GPU stage", "llm-text")  # not "seed-dataset"
    assert (columns["j"].stage, columns["j"].column_type) == ("CPU stage", "llm-judge")
    page = render_html(report)
    names = {json.loads(m) for m in re.findall(r'"name":("(?:[^"\\]|\\.)*")', page)}  # the charts' traces
    assert {"waiting for the GPU stage", "records/s · GPU stage", "records/s · CPU stage"} <= names, names
    assert "seed-dataset" not in page


def test_an_allocation_whose_replicas_served_nothing_generated_nothing(tmp_path: Path) -> None:
    """Issue 35, item 1: behind a proxy, no busy log means no request was ever in flight (a hosted judge hung until
    the time limit): the allocation's GPU time generating is 0, not its attempts' spans, and no fact is made of it."""
    from ddslurm.launcher.facts._measure import measure_run

    layout = make_staged_run(tmp_path, None, proxy=True)
    report = run_report(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    gpu = report.gpu
    assert gpu is not None
    [allocation] = gpu.allocations
    assert (allocation.busy_s, allocation.busy_from, allocation.generating_gpu_s) == (0.0, "proxy", 0.0)
    assert [r.busy_s for r in allocation.replicas] == [0.0]
    assert gpu.generating_gpu_hours == 0 and gpu.utilisation == 0
    assert not any("no proxy busy log" in n for n in report.notes)
    assert measure_run(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))[0] == []  # a rate over no busy time: no fact


def test_the_proxy_busy_log_is_the_allocations_busy_time_and_never_exceeds_what_sacct_allocated(
    tmp_path: Path,
) -> None:
    busy = [("50:21", "50:58"), ("50:59", "51:14"), ("51:10", "51:12")]  # the last within the second: counted once
    report = run_report(make_staged_run(tmp_path / "a", {0: busy}), Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    assert report.gpu is not None
    [allocation] = report.gpu.allocations
    assert (allocation.busy_s, allocation.busy_from, allocation.clamped) == (37 + 15, "proxy", False)
    assert allocation.generating_gpu_s == (37 + 15) * 2
    assert report.gpu.generating_gpu_hours == round((37 + 15) * 2 / 3600, 6)
    assert not any("busy log" in n or "cut to" in n for n in report.notes)

    # a busy log longer than the allocation (another clock): cut to what sacct allocated, and said so
    report = run_report(
        make_staged_run(tmp_path / "b", {0: [("49:00", "52:00")]}), Slurm(FakeSlurm(sacct=STAGED_SACCT))
    )
    assert report.gpu is not None
    [allocation] = report.gpu.allocations
    assert (allocation.busy_s, allocation.clamped, allocation.generating_gpu_s) == (180.0, True, 160.0)
    assert report.gpu.utilisation == 1.0
    assert any("300_0" in n and "cut to the allocated time" in n for n in report.notes)
    assert "(cut to allocated)" in render_html(report)


def test_each_replica_counts_its_own_gpus_for_the_time_it_had_work(tmp_path: Path) -> None:
    # two replicas of tensor parallel 1 on the allocation's 2 GPUs; only replica 0 had work: 1 GPU busy, not 2
    busy = {0: [("50:21", "50:58"), ("50:59", "51:14")]}
    report = run_report(make_staged_run(tmp_path / "a", busy, replicas=2), Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    assert report.gpu is not None
    [allocation] = report.gpu.allocations
    assert (allocation.gpus, allocation.busy_s, allocation.busy_from) == (2, 37 + 15, "proxy")
    assert [(r.alias, r.replica, r.gpus, r.busy_s) for r in allocation.replicas] == [
        ("writer", 0, 1, 37 + 15),
        ("writer", 1, 1, 0),
    ]
    assert allocation.generating_gpu_s == (37 + 15) * 1
    assert report.gpu.generating_gpu_hours == round((37 + 15) / 3600, 6)
    assert report.gpu.utilisation == round((37 + 15) / 160, 4)
    assert "writer 1: 0.0 x 1" in render_html(report)

    # both had work, partly at once: each replica's own union x its GPU, added (overlap counted on both GPUs)
    busy = {0: [("50:21", "50:58")], 1: [("50:40", "51:10"), ("51:00", "51:05")]}
    report = run_report(make_staged_run(tmp_path / "b", busy, replicas=2), Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    assert report.gpu is not None
    [allocation] = report.gpu.allocations
    assert [r.busy_s for r in allocation.replicas] == [37, 30]
    assert allocation.busy_s == 49  # any server had work: 50:21-51:10
    assert allocation.generating_gpu_s == 37 + 30 and not allocation.clamped


def test_gpus_from_alloc_tres() -> None:
    assert tres_gpus("billing=2,cpu=2,gres/gpu=4,mem=2G,node=1") == 4
    assert tres_gpus("cpu=2,gres/gpu:a100=2,gres/gpu:h100=1") == 3
    assert tres_gpus("cpu=2,gres/gpu=4,gres/gpu:a100=4") == 4
    assert tres_gpus("billing=2,cpu=2,mem=2G,node=1") == 0


def test_client_out_parsing_ignores_other_lines() -> None:
    parsed = parse_client_out(
        CONFIGS + "[23:52:00] [INFO] 📊 Model usage summary:\n[23:52:00] [INFO]   |-- no model usage recorded\n" + TAIL
    )
    assert parsed.usage == []
    assert parsed.aliases == {
        "local/writer-8b": ("writer", "ddslurm-local"),
        "demo/judge-70b": ("judge", "demo-hosted"),
    }


def _page_data(page: str) -> Any:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_the_command_writes_the_page_and_prints_the_numbers(tmp_path: Path) -> None:
    layout = make_report_run(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    code = main(["report", str(layout.root), "--json"], slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    printed = json.loads(out.getvalue())
    page_path = layout.root / "report.html"
    assert printed["report"] == str(page_path)
    page = page_path.read_text()
    assert not re.search(r"<script[^>]+src=", page), "the page must not load scripts from anywhere"
    data = _page_data(page)
    printed.pop("report")
    assert {k: v for k, v in data.items() if k != "generated_at"} == {
        k: v for k, v in printed.items() if k != "generated_at"
    }
    assert data["records_done"] == 5 and data["gpu"]["allocated_gpu_hours"] == round(530 / 3600, 6)
    for shown in ("5 / 5", "2 / 2", "0.147", "endpoint_errors", "writer", "judge", "hosted", "local", "340"):
        assert shown in page, shown

    text = io.StringIO()
    elsewhere = tmp_path / "elsewhere.html"
    code = main(
        ["report", str(layout.root), "--output", str(elsewhere)], slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=text
    )
    assert code == 0 and elsewhere.is_file()
    assert text.getvalue().startswith(f"report of run {layout.run_id}: {elsewhere}\n")
    assert "GPU-hours: 0.147 allocated, 0.083 generating" in text.getvalue()
    assert "writer (local): 10 requests, 5 failed, 340 tokens" in text.getvalue()


def test_a_missing_run_is_a_json_error(tmp_path: Path) -> None:
    out = io.StringIO()
    code = main(
        ["report", str(tmp_path / "nope"), "--json"], slurm=Slurm(FakeSlurm()), stdout=out, stderr=io.StringIO()
    )
    assert code == 2
    assert json.loads(out.getvalue())["error"]["code"] == "run_not_found"


def test_a_run_without_attempts_still_renders(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run-0")
    make_private_dir(layout.root)
    atomic_write(layout.plan, encode(make_plan(layout.run_id, (2, 2))))
    report = run_report(layout, None)
    assert (report.attempts, report.timeline, report.models, report.dataset) == (0, [], [], None)
    assert "No attempt has started." in render_html(report)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/install-browser)")
def test_the_page_renders_in_a_headless_browser_offline(tmp_path: Path) -> None:
    layout = make_report_run(tmp_path)
    assert main(["report", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=io.StringIO()) == 0
    url = (layout.root / "report.html").as_uri()
    dom = run_chromium("--virtual-time-budget=10000", "--dump-dom", url, cwd=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_lines(dom.stderr) == [], "the page logged to the console (a JavaScript error)"
    for chart in ("timeline", "throughput", "models", "gpu", "failures"):  # plotly drew each into an SVG
        m = re.search(rf'id="chart-{chart}"[^>]*>.*?<svg class="main-svg"', dom.stdout, re.S)
        assert m is not None, f"chart {chart} was not drawn"
    assert dom.stdout.count('class="bars"') + dom.stdout.count('class="point"') > 0

    shot = tmp_path / "shot.png"
    done = run_chromium(
        "--virtual-time-budget=10000", "--window-size=1200,1600", f"--screenshot={shot}", url, cwd=tmp_path
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    assert pixel_variance(shot) > 100.0, "the screenshot is blank"
    assert page_layout(layout.root / "report.html", tmp_path)["problems"] == []


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/install-browser)")
def test_a_two_stage_page_charts_both_stages_with_nothing_cut_off(tmp_path: Path) -> None:
    layout = make_staged_run(tmp_path, {0: [("50:21", "50:58"), ("50:59", "51:14")]})
    assert main(["report", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=STAGED_SACCT)), stdout=io.StringIO()) == 0
    measured = page_layout(layout.root / "report.html", tmp_path)
    assert measured["problems"] == []
    legends = measured["legends"]
    assert {"records/s · GPU stage", "records/s · CPU stage"} <= set(legends["chart-throughput"]), legends
    assert "waiting for the GPU stage" in legends["chart-timeline"], legends


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/install-browser)")
def test_the_page_fits_a_phone(tmp_path: Path) -> None:
    """At 390 CSS pixels (a phone) every chart and card fits the window, no label is cut off or under a legend, and
    the page is no wider than the window (a wide table scrolls in its own box)."""
    layout = make_report_run(tmp_path)
    assert main(["report", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=io.StringIO()) == 0
    measured = page_layout(layout.root / "report.html", tmp_path, width=390)
    assert measured["problems"] == []
    assert {"timeline", "throughput", "models", "gpu", "failures"} <= {
        k.removeprefix("chart-") for k in measured["legends"]
    }


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/install-browser)")
def test_the_layout_check_sees_a_label_cut_off(tmp_path: Path) -> None:
    page = tmp_path / "cut.html"
    page.write_text(
        '<html><body><div class="js-plotly-plot" id="chart-x" style="width:100px;height:50px;overflow:hidden">'
        '<svg width="400" height="50"><text x="150" y="20">far right</text></svg></div>'
        '<div class="card" style="width:40px;overflow:hidden">a very long card value</div>'
        '<div class="js-plotly-plot" id="chart-y" style="width:400px;height:100px"><svg width="400" height="100">'
        '<text x="10" y="50">Dec 31, 2025</text><g class="legend"><rect x="0" y="30" width="200" height="30"></rect>'
        '<text x="120" y="50">queued</text></g></svg></div><table id="long"><tr><td style="white-space:nowrap">'
        f"{'a long cell ' * 200}</td></tr></table></body></html>"
    )
    problems = page_layout(page, tmp_path)["problems"]
    assert any("far right" in p for p in problems) and any("card" in p for p in problems), problems
    assert any(p.startswith("the page is") and "table#long" in p for p in problems), problems
    assert 'chart-y: "Dec 31, 2025" is covered by the legend' in problems, problems
    assert not any("queued" in p for p in problems), problems


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/install-browser)")
def test_the_console_check_sees_a_javascript_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefined_function();</script></body></html>")
    done = run_chromium("--virtual-time-budget=2000", "--dump-dom", bad.as_uri(), cwd=tmp_path)
    assert any("undefined_function" in line for line in console_lines(done.stderr)), done.stderr[-2000:]
