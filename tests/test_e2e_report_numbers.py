"""The report's headline numbers of a real run, recomputed here from first principles: a pulling, two-stage run
(the mixed example: local ``generator`` on two fake GPUs per allocation, hosted judge) with two client workers per
allocation on the local Slurm cluster, made once for the module. GPU time generating is checked against ``sacct``
(asked by this test) and the vLLM stand-ins' own request logs (each stand-in one replica, counted with its own
GPUs); records/s and tokens/s against the attempts' records and logs; then the page in headless chromium: its
numbers are ``report --json``'s, its charts both stages'."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import AttemptRecord, SubmissionRecord, WinnerRecord, read_json
from ddslurm.launcher.testing import console_lines, find_chromium, page_layout, run_chromium
from tests.e2e import MIXED_RECIPE, generator, vllm_stand_in
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

RECORDS, SHARDS, REPLICAS = 16, 4, 2
GENERATOR = generator(
    replicas=REPLICAS, tensor_parallel=1, env={"FAKE_VLLM_LATENCY": "2.0", "FAKE_VLLM_STARTUP_DELAY": "1"}
) + ("allocations: 2\nclient_workers: 2\n")  # fmt: skip

Span = tuple[float, float]


@dataclass(frozen=True)
class Run:
    run_dir: Path
    report: dict[str, Any]
    page: Path
    stand_ins: Path
    """The folder of the stand-ins' request logs (``pulling-requests-<job>-<pid>.jsonl``) and arguments
    (``pulling-args-<job>-<pid>.txt``)."""


@pytest.fixture(scope="module")
def run(slurm_cluster: Any, hosted_endpoint: Any, tmp_path_factory: pytest.TempPathFactory) -> Run:
    from conftest import write_run_files

    root = tmp_path_factory.mktemp("report-numbers")
    files = write_run_files(
        root / "run", hosted_endpoint, num_records=RECORDS, shards=SHARDS, buffer_size=2, recipe=MIXED_RECIPE,
        extra_run=GENERATOR, vllm_executable=vllm_stand_in(root, "pulling", record_args=True),
    )  # fmt: skip
    # Two client workers need two client CPUs (submission.cpus is shared among them).
    files.run_file.write_text(files.run_file.read_text().replace("  cpus: 1\n", "  cpus: 2\n", 1))
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir = Path(submitted["run_dir"])
    final = _cli("wait", str(run_dir), "--json", env=files.env, timeout=900)
    assert final["state"] == "succeeded", json.dumps(final)[-3000:]
    report = _cli("report", str(run_dir), "--json", env=files.env)
    return Run(run_dir, report, Path(report.pop("report")), root)


def _union(spans: Iterable[Span]) -> float:
    """Seconds covered by the spans, overlaps once."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _when(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _events(path: Path, name: str) -> list[float]:
    lines = path.read_text().splitlines() if path.is_file() else []
    found = [json.loads(line) for line in lines if line.startswith("{")]
    return [_when(e["timestamp"]) for e in found if e.get("event") == name]


def _generating(run_dir: Path) -> dict[str, list[tuple[str, Span]]]:
    """Each stage's attempts: (their array task, from serving ready, or their start, to their last batch; a spare
    client's from when it began generating, ``generating_at``: it waited for a worker's slot before), read from the
    attempt records, the client logs and the array tasks' batch output."""
    out: dict[str, list[tuple[str, Span]]] = {"gpu": [], "cpu": []}
    for stage, pattern in (
        ("gpu", "shards/*/stage-0/attempts/*/attempt.json"),
        ("cpu", "shards/*/attempts/*/attempt.json"),
    ):
        for path in run_dir.glob(pattern):
            record = read_json(path, AttemptRecord)
            assert record.state == "succeeded" and record.slurm_log and record.ended_at
            winner = read_json(path.parent.parent.parent / "winner.json", WinnerRecord)
            assert winner.attempt == record.attempt  # every attempt won: it generated until its last batch
            started, ended = _when(record.started_at), _when(record.ended_at)
            ready = [t for t in _events(Path(record.slurm_log), "serving.ready") if started <= t <= ended]
            last = max(_events(path.parent / "client.log", "batch.complete"))
            task = Path(record.slurm_log).stem.removeprefix("slurm-")
            began = _when(record.generating_at) if record.spare and record.generating_at else None
            out[stage].append((task, (began or (ready[0] if ready else started), last)))
    return out


def _sacct(array: str) -> list[tuple[str, str, int, int]]:
    """(array task, its own job id, elapsed seconds, GPUs) of every run of the array's tasks."""
    done = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--duplicates", "-j", array, "--format=JobID,JobIDRaw,ElapsedRaw,AllocTRES"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = []
    for line in done.stdout.splitlines():
        task, raw, elapsed, tres = line.split("|")
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        rows.append((task, raw, int(elapsed), int(gpus.group(1)) if gpus else 0))
    return rows


@dataclass(frozen=True)
class StandIn:
    """One stand-in server process of a Slurm job: one replica."""

    replica: str
    """``<alias>-<index>``, from the socket it listened on (``--uds .../<alias>-<index>.sock``)."""
    gpus: int
    """Its ``--tensor-parallel-size``."""
    served: list[Span]
    """The chat requests it served: from admission to answer (its request log)."""


def _stand_ins(folder: Path, job: str) -> list[StandIn]:
    """Every stand-in of Slurm job ``job`` that was sent a request, each named by its log's file name
    (``pulling-requests-<job>-<pid>.jsonl``) and its arguments' (``pulling-args-<job>-<pid>.txt``)."""
    found = []
    for log in folder.glob(f"pulling-requests-{job}-*.jsonl"):
        pid = log.stem.rsplit("-", 1)[1]
        args = (folder / f"pulling-args-{job}-{pid}.txt").read_text().splitlines()
        replica = Path(args[args.index("--uds") + 1]).stem
        gpus = int(args[args.index("--tensor-parallel-size") + 1])
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        served = [(e["admitted"], e["time"]) for e in entries if e.get("admitted") is not None]
        found.append(StandIn(replica, gpus, served))
    return found


def test_gpu_time_generating_is_what_sacct_and_the_servers_logs_say(run: Run) -> None:
    subs = [read_json(p, SubmissionRecord) for p in (run.run_dir / "submissions").glob("*.json")]
    gpu_arrays = sorted(s.array_job_id for s in subs if s.stage == 0)
    assert gpu_arrays and any(s.stage == 1 for s in subs), "a two-stage run"
    gpu = run.report["gpu"]
    assert gpu["source"] == "sacct"
    allocated = expected = 0.0
    busy_by_task: dict[str, float] = {}
    replicas_by_task: dict[str, dict[str, float]] = {}
    for array in gpu_arrays:
        for task, raw, elapsed, gpus in _sacct(array):
            assert gpus == 2, (task, gpus)
            allocated += elapsed * gpus
            stand_ins = _stand_ins(run.stand_ins, raw)
            assert len({s.replica for s in stand_ins}) == len(stand_ins) <= REPLICAS
            assert sum(s.gpus for s in stand_ins) <= gpus
            busy_by_task[task] = _union(span for s in stand_ins for span in s.served)
            replicas_by_task[task] = {s.replica: _union(s.served) for s in stand_ins}
            # each replica's GPUs for the time it had work, not the allocation's GPUs whenever any replica had
            expected += sum(_union(s.served) * s.gpus for s in stand_ins)
    assert expected > 0
    assert gpu["allocated_gpu_hours"] == pytest.approx(allocated / 3600, abs=1e-6)
    assert gpu["generating_gpu_hours"] <= gpu["allocated_gpu_hours"]
    assert gpu["generating_gpu_hours"] == pytest.approx(expected / 3600, rel=0.02)
    assert 0 < gpu["utilisation"] <= 1
    for allocation in gpu["allocations"]:
        assert allocation["busy_from"] == "proxy" and not allocation["clamped"], allocation
        assert allocation["generating_gpu_s"] <= allocation["allocated_s"]
        assert allocation["busy_s"] == pytest.approx(busy_by_task[allocation["job"]], rel=0.05)
        replicas = {f"{r['alias']}-{r['replica']}": r for r in allocation["replicas"]}
        assert set(replicas) == {"generator-0", "generator-1"} and all(r["gpus"] == 1 for r in replicas.values())
        for name, r in replicas.items():  # (abs: the proxy also relays the clients' /v1/models, not in the spans)
            assert r["busy_s"] == pytest.approx(replicas_by_task[allocation["job"]].get(name, 0.0), rel=0.05, abs=0.5)
        assert allocation["generating_gpu_s"] == pytest.approx(sum(r["busy_s"] * r["gpus"] for r in replicas.values()))
    # The two workers of an allocation generated at the same time: adding up their spans counts GPUs twice.
    spans = _generating(run.run_dir)["gpu"]
    added = sum(b - a for _, (a, b) in spans)
    merged = sum(_union(s for t, s in spans if t == task) for task in {t for t, _ in spans})
    assert added > merged * 1.2, (added, merged)


def test_rates_are_totals_over_the_active_spans(run: Run) -> None:
    report = run.report
    spans = _generating(run.run_dir)
    both = [s for stage in spans.values() for _, s in stage]
    assert report["rows_generated"] == RECORDS
    assert report["records_per_second"] == pytest.approx(RECORDS / _union(both), rel=0.001)
    stages = {s["stage"]: s for s in report["stages"]}
    for stage, attempts in spans.items():
        assert stages[stage]["rows"] == RECORDS
        assert stages[stage]["active_s"] == pytest.approx(_union(s for _, s in attempts), abs=0.01)
    models = {m["alias"]: m for m in report["models"]}
    for alias, stage in (("generator", "gpu"), ("judge", "cpu")):  # the generator's in the GPU stage, judge's after
        model = models[alias]
        active = _union(s for _, s in spans[stage])
        assert model["total_tokens"] > 0 and model["active_s"] == pytest.approx(active, abs=0.01)
        assert model["tokens_per_second"] == pytest.approx(model["total_tokens"] / active, abs=0.06)
    # records over time, both stages: a bin's rows are its stage's rows made in it (each batch's spread over the time
    # its attempt spent on it, 3 decimals), its rate those over the seconds its stage was generating in it; weighted
    # by those seconds, a stage's bars average to the stage's own rate (issue 40: they were 5-50x the headline)
    for stage in ("gpu", "cpu"):
        bins = [b for b in report["rate"] if b["stage"] == stage]
        assert sum(b["rows"] for b in bins) == pytest.approx(RECORDS, abs=0.001 * len(bins))
        known = [b for b in bins if b["rate"] is not None]
        assert all(b["generating_s"] > 0 for b in known)
        weighted = sum(b["rate"] * b["generating_s"] for b in known) / sum(b["generating_s"] for b in known)
        assert weighted == pytest.approx(stages[stage]["records_per_second"], rel=0.01)
    # the CPU stage waited for the GPU stage, and the page says so, not "queued"
    waits = [p for s in report["timeline"] if s["stage"] == "cpu" for p in s["phases"] if p["name"] == "waiting"]
    assert waits


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (tools/install-browser)")
def test_the_page_shows_the_same_numbers_and_both_stages(run: Run, tmp_path: Path) -> None:
    page = run.page.read_text()
    embedded = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert embedded is not None
    data = json.loads(embedded.group(1))
    assert {k: v for k, v in data.items() if k != "generated_at"} == {
        k: v for k, v in run.report.items() if k != "generated_at"
    }
    dom = run_chromium("--virtual-time-budget=15000", "--dump-dom", run.page.as_uri(), cwd=tmp_path)
    assert dom.returncode == 0 and console_lines(dom.stderr) == [], dom.stderr[-2000:]
    cards = dict(re.findall(r'data-card="([^"]+)">[^<]*<b>([^<]*)</b>', dom.stdout))
    gpu = run.report["gpu"]
    assert cards["records/s"] == f"{run.report['records_per_second']:,.2f}"
    assert cards["GPU-hours allocated"] == f"{gpu['allocated_gpu_hours']:,.3f}"
    assert cards["GPU-hours generating"] == f"{gpu['generating_gpu_hours']:,.3f}"
    assert cards["records"] == f"{RECORDS:,} / {RECORDS:,}"
    for model in run.report["models"]:
        shown = re.escape(f"{model['tokens_per_second']:,.1f}")
        assert re.search(rf'<td class="?n"?>{shown}</td>', dom.stdout), model["alias"]
    layout = page_layout(run.page, tmp_path)
    assert layout["problems"] == []
    legends = layout["legends"]
    assert {"records/s · GPU stage", "records/s · CPU stage"} <= set(legends["chart-throughput"]), legends
    assert "waiting for the GPU stage" in legends["chart-timeline"], legends
    columns = {c["name"]: c for c in run.report["columns"]}
    assert {n for n, c in columns.items() if c["stage"] == "GPU stage"} == {"difficulty", "sql"}
    assert {n for n, c in columns.items() if c["stage"] == "CPU stage"} >= {"sql_quality"}
    assert (columns["sql"]["column_type"], columns["difficulty"]["column_type"]) == ("llm-code", "sampler")


def test_the_succeeded_run_recorded_its_facts_in_the_workspace(run: Run) -> None:
    """``wait`` saw the run succeed and recorded what it measured: recomputed here from the batch outputs and the
    report's own numbers."""
    from ddslurm.config import facts_path, read_facts

    facts = read_facts(facts_path(run.run_dir.parent.parent))
    [model] = facts.models
    assert (model.measured_by, model.run_id) == ("run", run.run_dir.name)
    loads = []
    for log in sorted((run.run_dir / "logs").glob("slurm-*.out")):
        started, ready = _events(log, "server.started"), _events(log, "serving.ready")
        if started:  # a GPU allocation (the CPU stage's start no server)
            loads.append(min(t for t in ready if t >= started[0]) - started[0])
    assert len(loads) == 2
    assert abs(model.load_s - (loads[0] + loads[1]) / 2) < 0.01  # the median of two: their mean
    local = [m for m in run.report["models"] if m["local"]]
    [generator_usage] = local
    busy = sum(r["busy_s"] for a in run.report["gpu"]["allocations"] for r in a["replicas"])
    assert model.requests_per_s == round(generator_usage["requests"] / busy, 4)
    [recipe] = facts.recipes
    rows = run.report["rows_generated"]
    assert recipe.requests_per_record == {m["alias"]: round(m["requests"] / rows, 4) for m in run.report["models"]}
    assert recipe.cpu_stage_records_per_s is not None and recipe.cpu_stage_records_per_s > 0
