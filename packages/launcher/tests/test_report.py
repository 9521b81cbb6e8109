"""``ddslurm report``: the numbers from a synthetic run directory, the command, and the page in a headless browser."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ddslurm.collector import collect
from ddslurm.collector.testing import make_published_run
from ddslurm.config import (
    AttemptRecord,
    DeploymentPlan,
    ReplicaPlan,
    RunLayout,
    ServingPlan,
    SubmissionRecord,
    WinnerRecord,
    atomic_write,
    encode,
    make_private_dir,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.launcher._slurm import Slurm, tres_gpus
from ddslurm.launcher.cli import main
from ddslurm.launcher.report import parse_client_out, render_html, run_report
from ddslurm.launcher.testing import FakeSlurm, console_lines, find_chromium, run_chromium

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
    assert report.rows_generated == 5 and sum(b.rows for b in report.rate) == 5
    assert report.records_per_second == round(5 / 230, 3)

    models = {m.alias: m for m in report.models}
    writer, judge = models["writer"], models["judge"]
    assert (writer.local, writer.provider, writer.model) == (True, "ddslurm-local", "local/writer-8b")
    assert (writer.requests, writer.successful, writer.failed, writer.error_rate) == (10, 5, 5, 0.5)
    assert (writer.input_tokens, writer.output_tokens, writer.total_tokens, writer.summaries) == (115, 225, 340, 3)
    assert (judge.local, judge.provider, judge.requests, judge.failed) == (False, "demo-hosted", 5, 0)
    assert (judge.input_tokens, judge.output_tokens, judge.total_tokens) == (70, 14, 84)
    assert writer.latency_s is None
    assert (writer.health_checks, judge.health_checks) == (3, 3)

    gpu = report.gpu
    assert gpu is not None and gpu.source == "sacct"
    assert [(j.job, j.elapsed_s, j.gpus) for j in gpu.jobs] == [("100_0", 130, 2), ("100_1", 85, 2), ("104_0", 50, 2)]
    assert gpu.allocated_gpu_hours == round((130 + 85 + 50) * 2 / 3600, 6)
    assert gpu.generating_gpu_hours == round((90 + 50 + 10) * 2 / 3600, 6)

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


def test_accounting_falls_back_to_attempt_records_when_sacct_fails(tmp_path: Path) -> None:
    layout = make_report_run(tmp_path)

    def broken(argv: Any, *, env: Any = None) -> Any:
        from ddslurm.launcher._slurm import Completed

        return Completed(1, "", "sacct: error: Problem talking to the database")

    report = run_report(layout, Slurm(broken))
    gpu = report.gpu
    assert gpu is not None and gpu.source == "attempt records" and gpu.jobs == []
    assert any("sacct" in note for note in report.notes)
    assert gpu.allocated_gpu_hours == round((115 + 80 + 45) * 2 / 3600, 6)


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


CHROMIUM = find_chromium()
_chromium, _console = run_chromium, console_lines


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_page_renders_in_a_headless_browser_offline(tmp_path: Path) -> None:
    layout = make_report_run(tmp_path)
    assert main(["report", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=io.StringIO()) == 0
    url = (layout.root / "report.html").as_uri()
    dom = _chromium("--virtual-time-budget=10000", "--dump-dom", url, cwd=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == [], "the page logged to the console (a JavaScript error)"
    for chart in ("timeline", "throughput", "models", "gpu", "failures"):  # plotly drew each into an SVG
        m = re.search(rf'id="chart-{chart}"[^>]*>.*?<svg class="main-svg"', dom.stdout, re.S)
        assert m is not None, f"chart {chart} was not drawn"
    assert dom.stdout.count('class="bars"') + dom.stdout.count('class="point"') > 0

    shot = tmp_path / "shot.png"
    done = _chromium(
        "--virtual-time-budget=10000", "--window-size=1200,1600", f"--screenshot={shot}", url, cwd=tmp_path
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    assert _pixel_variance(shot) > 100.0, "the screenshot is blank"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_console_check_sees_a_javascript_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefined_function();</script></body></html>")
    done = _chromium("--virtual-time-budget=2000", "--dump-dom", bad.as_uri(), cwd=tmp_path)
    assert any("undefined_function" in line for line in _console(done.stderr)), done.stderr[-2000:]


def _pixel_variance(png: Path) -> float:
    """The variance of the grey levels of a PNG (decoded with zlib: no imaging library needed)."""
    import struct
    import zlib

    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, depth, colour = 8, b"", 0, 0, 0, 0
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        kind, body = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    data = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    values: list[int] = []
    for row in range(height):
        start = row * (stride + 1)
        kind, line = data[start], bytearray(data[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa_, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa_ <= pb and pa_ <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 0xFF
        if row % 8 == 0:
            values.extend(sum(line[i : i + 3]) // 3 for i in range(0, stride, channels * 8))
        prev = line
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)
