"""``ddslurm report`` of a mixed run on the real local Slurm cluster (local generator on a fake GPU, hosted judge):
the page is written, and its numbers match the run (rows, attempts, the requests each model endpoint received,
Slurm's accounting, the dataset)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

REPO = Path(__file__).resolve().parents[1]
MIXED_RECIPE = REPO / "examples" / "mixed" / "recipe.yaml"
DDSLURM = str(Path(sys.executable).parent / "ddslurm")
FAKE_VLLM = Path(sys.executable).parent / "fake-vllm"
GENERATOR = (
    "deployments:\n  - model_alias: generator\n    model: Qwen/Qwen3-8B\n    served_model_name: qwen3-8b\n"
    "    replicas: 1\n    tensor_parallel: 1\n    server:\n      cpus: 1\n      startup_timeout: 120\n"
    "      env: {FAKE_VLLM_STARTUP_DELAY: '1'}\n"
)


def _cli(*args: str, env: dict[str, str], timeout: float = 400) -> Any:
    done = subprocess.run([DDSLURM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def _wrapper(tmp_path: Path) -> Path:
    script = tmp_path / "vllm"
    script.write_text(f'#!/bin/sh\nFAKE_VLLM_REQUEST_LOG="{tmp_path}/requests-$$.jsonl" exec "{FAKE_VLLM}" "$@"\n')
    script.chmod(0o755)
    return script


def _chat(lines: list[dict[str, Any]]) -> int:
    return sum(1 for r in lines if r["path"].endswith("/chat/completions"))


def test_report_of_a_mixed_run(make_run_files: Any, hosted_endpoint: Any, tmp_path: Path) -> None:
    log = hosted_endpoint.request_log
    before = len(log.read_text().splitlines()) if log.exists() else 0
    files = make_run_files(
        "report",
        num_records=6,
        shards=2,
        buffer_size=3,
        recipe=MIXED_RECIPE,
        extra_run=GENERATOR,
        vllm_executable=_wrapper(tmp_path),
    )
    run_dir = Path(
        _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
    )
    final = _cli("wait", str(run_dir), "--json", env=files.env)
    assert final["state"] == "succeeded", final
    _cli("collect", str(run_dir), "--json", "--local", env=files.env)

    report = _cli("report", str(run_dir), "--json", env=files.env)
    page = (run_dir / "report.html").read_text()
    assert report["report"] == str(run_dir / "report.html")
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))  # type: ignore[union-attr]
    assert data["run_id"] == report["run_id"] == run_dir.name
    assert 'id="chart-timeline"' in page and 'id="chart-throughput"' in page and 'id="chart-models"' in page
    assert not re.search(r"<script[^>]+src=", page)

    assert (report["records_requested"], report["records_done"], report["shards_done"]) == (6, 6, 2)
    assert report["rows_generated"] == 6 and report["batches"][-1]["total"] == 6
    assert report["records_per_second"] > 0
    spans = report["timeline"]
    assert len(spans) == report["attempts"] == 2 and all(s["winner"] for s in spans)
    for span in spans:  # every phase happened, in order, on the GPU node
        assert [p["name"] for p in span["phases"]] == ["queued", "startup", "generating", "publishing"], span
        assert span["serving_ready_at"] is not None and span["node"] in {"n1", "n2"}
        assert all(p["seconds"] >= 0 for p in span["phases"])

    models = {m["alias"]: m for m in report["models"]}
    generator = models["generator"]
    judges = [m for m in report["models"] if not m["local"]]
    assert generator["local"] and generator["provider"] and generator["failed"] == 0
    assert judges and all(m["failed"] == 0 and m["provider"] == "demo-hosted" for m in judges)
    # The requests Data Designer counted, with its health checks (one per model and attempt), are the requests the
    # endpoints received.
    local_served = [json.loads(line) for f in tmp_path.glob("requests-*.jsonl") for line in f.read_text().splitlines()]
    assert generator["health_checks"] == 2
    assert generator["requests"] + generator["health_checks"] == _chat(local_served) > 2
    hosted = [json.loads(line) for line in log.read_text().splitlines()[before:]]
    assert sum(m["requests"] + m["health_checks"] for m in judges) == _chat(hosted) > 0
    assert generator["total_tokens"] == generator["input_tokens"] + generator["output_tokens"] > 0

    gpu = report["gpu"]
    assert gpu["source"] == "sacct" and len(gpu["jobs"]) == 2
    assert all(j["gpus"] == 1 and j["state"] == "COMPLETED" for j in gpu["jobs"])
    assert gpu["allocated_gpu_hours"] == pytest.approx(
        sum(j["elapsed_s"] * j["gpus"] for j in gpu["jobs"]) / 3600, abs=1e-6
    )
    assert 0 < gpu["generating_gpu_hours"] <= gpu["allocated_gpu_hours"] + 2 / 3600  # sacct rounds to seconds

    assert report["failures"] == []
    assert report["dataset"]["rows"] == 6 and report["dataset"]["partial_shards"] == []
    columns = {c["name"]: c for c in report["columns"]}
    assert {"question", "sql"} <= set(columns) and all(c["rows"] == 6 for c in report["columns"] if c["rows"])
