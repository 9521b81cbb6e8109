"""``ddslurm report`` of a hosted-only run: CPU-hours in place of GPU cards, failed and cancelled attempts marked on
the timeline, the run's configuration and a few sample rows (issue 40)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ddslurm.collector import MANIFEST, collect
from ddslurm.collector.testing import make_published_run
from ddslurm.config import (
    AttemptRecord,
    ClientUsage,
    PartitionPrice,
    Prices,
    Resources,
    RunLayout,
    SubmissionRecord,
    atomic_write,
    encode,
)
from ddslurm.config.testing import make_plan
from ddslurm.launcher.cli import main
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.report import render_html, report_json, run_report
from ddslurm.launcher.report._html import _figures
from ddslurm.launcher.report._model import PHASES
from ddslurm.launcher.testing import FakeSlurm, find_chromium, page_layout

CHROMIUM = find_chromium()
T = "2026-01-02T10:"
LONG = "a long answer " * 30  # 420 characters: cut to 200 in the sample
RUN_FILE = "name: hosted\nrecipe: recipe.yaml\nnum_records: 7\nshards: 2\n"
SACCT = (
    "200_0|CANCELLED|30|billing=2,cpu=2,mem=2G,node=1|2026-01-02T10:10:00|2026-01-02T10:10:30\n"
    "200_1|FAILED|40|billing=2,cpu=2,mem=2G,node=1|2026-01-02T10:10:00|2026-01-02T10:10:40\n"
    "201_0|COMPLETED|40|billing=4,cpu=4,mem=2G,node=1|2026-01-02T10:11:00|2026-01-02T10:11:40\n"
    "201_1|COMPLETED|35|billing=4,cpu=4,mem=2G,node=1|2026-01-02T10:11:00|2026-01-02T10:11:35\n"
)


def _event(event: str, at: str, **fields: Any) -> str:
    return json.dumps({"event": event, "level": "info", "timestamp": f"{T}{at}Z", **fields}) + "\n"


def _attempt(
    layout: RunLayout, shard: int, attempt: str, task: str, batches: list[tuple[str, int]], cpu_s: float | None,
    **fields: Any,
) -> None:  # fmt: skip
    record = AttemptRecord(
        shard=shard, attempt=attempt, job_id=task.replace("_", ""), node="c1", client_runs=1,
        slurm_log=str(layout.logs / f"slurm-{task}.out"), **fields,
    )  # fmt: skip
    path = layout.shard(shard).attempt(attempt).dir
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / "attempt.json", encode(record))
    (path / "client.log").write_text("".join(_event("batch.complete", at, rows=rows) for at, rows in batches))
    if cpu_s is not None:
        atomic_write(path / "client-usage.json", encode(ClientUsage(cpu_s=cpu_s, setup_cpu_s=2.0, wall_s=30.0)))


def make_hosted_run(root: Path) -> RunLayout:
    """A finished hosted-only run of 7 records on 2 shards (one CPU partition, no GPU), collected: shard 0's first
    attempt was cancelled after a batch, shard 1's failed; a retry (array 201) ran both again and succeeded."""
    layout = make_published_run(
        root,
        [
            [pa.table({"topic": ["t0", "t1", "t2", "t3"], "answer": [LONG, "b", None, "d"]})],
            [pa.table({"topic": ["t4", "t5", "t6"], "answer": ["e", "f", "g"]})],
        ],
    )
    collect(layout)
    prices = Prices(version=1, partitions={"cpu": PartitionPrice(cpu_hour=0.5)})
    plan = make_plan(
        layout.run_id, (4, 3), generation=Resources(partition="cpu", time_minutes=30, cpus_per_task=2),
        prices=prices, data_designer_version="0.5.7", ddslurm_version="0.1.0",
    )  # fmt: skip
    atomic_write(layout.plan, encode(plan))
    layout.inputs.mkdir(exist_ok=True)
    layout.run_file.write_text(RUN_FILE)
    layout.submissions.mkdir()
    layout.logs.mkdir()
    for array, at, kind in (("200", "10:00", "initial"), ("201", "10:55", "retry")):
        sub = SubmissionRecord(array_job_id=array, shards=(0, 1), submitted_at=f"{T}{at}+00:00", script="-", kind=kind)
        atomic_write(layout.submissions / f"{array}.json", encode(sub))
    _attempt(
        layout, 0, "attempt-0", "200_0", [("10:25", 2)], 20.0, state="cancelled", reason="shard_cancelled",
        rows=2, started_at=f"{T}10:10+00:00", ended_at=f"{T}10:30+00:00",
    )  # fmt: skip
    _attempt(
        layout, 0, "attempt-1", "201_0", [("11:30", 4)], 30.0, state="succeeded", rows=4, resumed_from="attempt-0",
        resumed_rows=2, started_at=f"{T}11:00+00:00", ended_at=f"{T}11:40+00:00",
    )  # fmt: skip
    _attempt(
        layout, 1, "attempt-0", "200_1", [], 10.0, state="failed", reason="endpoint_errors",
        message="judge: 5 requests failed", started_at=f"{T}10:10+00:00", ended_at=f"{T}10:40+00:00",
    )  # fmt: skip
    _attempt(
        layout, 1, "attempt-1", "201_1", [("11:20", 2), ("11:30", 3)], None, state="succeeded", rows=3,
        started_at=f"{T}11:00+00:00", ended_at=f"{T}11:35+00:00",
    )  # fmt: skip
    return layout


def _page_data(page: str) -> Any:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def _cards(page: str) -> dict[str, str]:
    return dict(re.findall(r'<div class="card" data-card="([^"]+)">[^<]*<b>([^<]*)</b>', page))


def test_a_hosted_only_run_shows_cpu_hours_and_no_gpu_card(tmp_path: Path) -> None:
    report = run_report(make_hosted_run(tmp_path), Slurm(FakeSlurm(sacct=SACCT)))
    assert report.gpu is None and report.predicted is None
    cpu = report.cpu
    assert cpu is not None
    allocated = (30 * 2 + 40 * 2 + 40 * 4 + 35 * 4) / 3600  # sacct: elapsed x CPUs of every allocation
    assert cpu.allocated_cpu_hours == round(allocated, 6)
    assert cpu.client_cpu_hours == round((20 + 30 + 10) / 3600, 6)  # the client-usage.json written
    assert (cpu.client_steps, cpu.attempts) == (3, 4)
    assert cpu.allocated_cost == pytest.approx(round(allocated, 6) * 0.5) and cpu.currency == "USD"
    assert any("1 of 4 attempt(s)" in n and "client-usage.json" in n for n in report.notes)

    page = render_html(report)
    cards = _cards(page)
    assert cards["CPU-hours allocated"] == f"{round(allocated, 6):,.3f}"
    assert cards["CPU-hours client steps"] == f"{60 / 3600:,.3f}"
    assert not any("GPU" in name for name in cards), cards
    assert "<h2>GPU time</h2>" not in page and "<h2>CPU time</h2>" in page
    data = _page_data(page)
    assert data["gpu"] is None and data["cpu"]["client_steps"] == 3


def test_failed_and_cancelled_attempts_are_marked_on_the_timeline(tmp_path: Path) -> None:
    report = run_report(make_hosted_run(tmp_path), Slurm(FakeSlurm(sacct=SACCT)))
    ended = {(s.shard, s.attempt): (s.state, s.reason, s.ended_at) for s in report.timeline}
    assert ended == {
        (0, "attempt-0"): ("cancelled", "shard_cancelled", f"{T}10:30+00:00"),
        (0, "attempt-1"): ("succeeded", None, f"{T}11:40+00:00"),
        (1, "attempt-0"): ("failed", "endpoint_errors", f"{T}10:40+00:00"),
        (1, "attempt-1"): ("succeeded", None, f"{T}11:35+00:00"),
    }
    page = render_html(report)
    names = {json.loads(m) for m in re.findall(r'"name":("(?:[^"\\]|\\.)*")', page)}
    assert {"ended failed", "ended cancelled"} <= names and "ended succeeded" not in names, names
    # each a marker of its own colour at the attempt's end, on the attempt's row, which says how it ended
    traces = {t.name: t for t in _figures(report)["timeline"].data}
    marks = {
        n: (list(traces[n].y), list(traces[n].x), traces[n].marker.color) for n in ("ended cancelled", "ended failed")
    }
    assert marks["ended cancelled"][:2] == (["shard 0 · attempt-0 · cancelled"], [f"{T}10:30+00:00"])
    assert marks["ended failed"][:2] == (["shard 1 · attempt-0 · failed"], [f"{T}10:40+00:00"])
    colours = {
        marks["ended cancelled"][2],
        marks["ended failed"][2],
        *(traces[p].marker.color for p in PHASES if p in traces),
    }
    assert len(colours) == 2 + len([p for p in PHASES if p in traces])
    assert "shard 0 · attempt-1" in traces["generating"].y  # a succeeded attempt's row: no state added


def test_the_configuration_and_a_few_sample_rows_are_in_the_json_and_the_page(tmp_path: Path) -> None:
    layout = make_hosted_run(tmp_path)
    out = io.StringIO()
    assert main(["report", str(layout.root), "--json"], slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=out) == 0
    printed = json.loads(out.getvalue())
    config = printed["configuration"]
    assert config["run_file"] == RUN_FILE
    assert (config["records"], config["shards"], config["client_workers"], config["gpus"]) == (7, 2, 1, 0)
    assert (config["partition"], config["time_minutes"], config["cpus_per_task"]) == ("cpu", 30, 2)
    assert (config["ddslurm_version"], config["data_designer_version"]) == ("0.1.0", "0.5.7")

    sample = printed["sample"]
    assert sample["columns"] == ["topic", "answer"] and sample["truncated"] is True
    cut = LONG[:199] + "…"
    assert sample["rows"] == [["t0", cut], ["t1", "b"], ["t2", None], ["t3", "d"], ["t4", "e"]]  # 5 of 7

    page = (layout.root / "report.html").read_text()
    assert "<h2>Configuration</h2>" in page and "<h3>Sample rows</h3>" in page
    assert "name: hosted\nrecipe: recipe.yaml" in page and ">0.5.7<" in page
    assert cut in page and LONG not in page and ">t4<" in page and ">t5<" not in page


def test_a_run_not_collected_has_no_sample_rows(tmp_path: Path) -> None:
    layout = make_hosted_run(tmp_path)
    (layout.dataset / MANIFEST).unlink()
    report = run_report(layout, None)
    assert report.sample is None and report_json(report)["sample"] is None
    assert "Sample rows" not in render_html(report)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/install-browser)")
def test_the_hosted_page_lays_out_with_nothing_cut_off(tmp_path: Path) -> None:
    layout = make_hosted_run(tmp_path)
    assert main(["report", str(layout.root)], slurm=Slurm(FakeSlurm(sacct=SACCT)), stdout=io.StringIO()) == 0
    measured = page_layout(layout.root / "report.html", tmp_path)
    assert measured["problems"] == []
    assert {"ended failed", "ended cancelled"} <= set(measured["legends"]["chart-timeline"]), measured["legends"]
    assert "records/s over the run" in measured["legends"]["chart-throughput"], measured["legends"]
