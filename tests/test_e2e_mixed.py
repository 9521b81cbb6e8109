"""Mixed and hosted-only runs on the real local Slurm cluster: vLLM stand-ins started as srun steps on fake
GPUs, a balancing proxy in front of two replicas, a hosted judge with a required key, and the real engine."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, read_json
from tests.e2e import MIXED_RECIPE, generator, local_dataset, run_cli, vllm_stand_in
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

STAND_IN = {"FAKE_VLLM_LATENCY": "0.02", "FAKE_VLLM_STARTUP_DELAY": "1"}
GENERATOR = generator(replicas=2, tensor_parallel=2, env=STAND_IN)


def _attempts(run_dir: Path) -> list[Path]:
    """Every attempt of the run: a two-stage run's GPU-stage attempts (``stage-0/``) too."""
    return sorted(
        [*run_dir.glob("shards/shard-*/attempts/attempt-*"), *run_dir.glob("shards/shard-*/stage-*/attempts/attempt-*")]
    )


def test_mixed_run_local_generator_two_replicas_and_hosted_judge(
    make_run_files: Any, hosted_endpoint: Any, tmp_path: Path, scan_for_secret: Any
) -> None:
    key = hosted_endpoint.api_key
    before = len(hosted_endpoint.request_log.read_text().splitlines()) if hosted_endpoint.request_log.exists() else 0
    files = make_run_files(
        "mixed",
        num_records=12,
        shards=1,
        buffer_size=6,
        recipe=MIXED_RECIPE,
        # one allocation runs the generator and the judge (tests/test_e2e_stages.py: the two-stage run)
        extra_run=GENERATOR + "stages: single\n",
        vllm_executable=vllm_stand_in(tmp_path, record_env=True),
    )
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir = Path(submitted["run_dir"])
    script = (run_dir / "generate.sbatch").read_text()
    assert "#SBATCH --gres=gpu:4" in script and "#SBATCH --partition=gpu" in script
    assert "#SBATCH --signal=B:USR1@90" in script

    final = _cli("wait", str(run_dir), "--json", env=files.env)
    attempt = _attempts(run_dir)[0]
    assert final["state"] == "succeeded", (attempt / "client.out").read_text()[-3000:]
    assert final["records_done"] == 12
    table = pq.read_table(_cli("collect", str(run_dir), "--json", "--local", env=files.env)["dataset"])
    assert table.num_rows == 12 and {"question", "sql", "sql_quality", "sql_chars"} <= set(table.column_names)
    # The columns in the order a local DataDesigner.create of the recipe lists them (docs/collection.md#column-order).
    assert table.column_names == local_dataset(MIXED_RECIPE, 12, tmp_path / "oracle").column_names

    # Both replicas served the generator: each stand-in process kept its own request log.
    served = [
        sum('"/v1/chat/completions"' in line for line in f.read_text().splitlines())
        for f in tmp_path.glob("requests-*.jsonl")
    ]
    assert len(served) == 2 and all(n > 0 for n in served), served
    # Each replica got its own two GPUs from Slurm, and none of the server steps saw the key.
    dumps = [d.read_text() for d in tmp_path.glob("server-env-*.txt")]
    gpus = sorted(line for d in dumps for line in d.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES="))
    assert gpus == ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3"]
    assert all(key not in d and "DEMO_HOSTED_API_KEY" not in d for d in dumps)
    # Both replicas required the attempt's one token (in their environment), and every generator request had it.
    tokens = {line.partition("=")[2] for d in dumps for line in d.splitlines() if line.startswith("VLLM_API_KEY=")}
    assert len(tokens) == 1 and len(token := tokens.pop()) >= 32
    generator = [json.loads(line) for f in tmp_path.glob("requests-*.jsonl") for line in f.read_text().splitlines()]
    assert generator and all(r["authorized"] for r in generator if r["path"].startswith("/v1/"))
    # The proxy balanced and stopped cleanly; the judge went to the hosted stand-in with the key.
    # `wait` returns on the attempt's record; the allocation's teardown (TERM to the proxy) follows it.
    deadline = time.monotonic() + 180
    while True:
        proxy_log = [json.loads(line) for line in (attempt / "proxy-generator.log").read_text().splitlines()]
        if proxy_log[-1]["event"] == "proxy.stopped" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert proxy_log[-1]["event"] == "proxy.stopped"
    hosted = [json.loads(line) for line in hosted_endpoint.request_log.read_text().splitlines()[before:]]
    judge = [r for r in hosted if r["model"] == "demo/judge-70b" and r["path"].endswith("/chat/completions")]
    assert len(judge) >= 12 and all(r["authorized"] for r in judge)
    assert scan_for_secret(run_dir, key) == []
    assert scan_for_secret(run_dir, token) == []
    record = read_json(attempt / "attempt.json", AttemptRecord)
    assert record.state == "succeeded" and record.node in {"n1", "n2"}


@pytest.mark.parametrize(
    ("server_env", "timeout", "reason", "needle"),
    [
        pytest.param(
            "{FAKE_VLLM_NEVER_HEALTHY: '1'}", 5, "server_not_ready", "not ready after 5 s", id="never-healthy"
        ),
        pytest.param(
            "{FAKE_VLLM_CRASH_AFTER: '2', FAKE_VLLM_LATENCY: '0.05'}",
            120,
            "server_died",
            "exited during generation",
            id="crash-mid-run",
        ),
    ],
)
def test_failing_server_under_srun_fails_fast_with_reason_and_log_tail(
    make_run_files: Any, server_env: str, timeout: int, reason: str, needle: str
) -> None:
    deployment = generator(model="m", startup_timeout=timeout, env=server_env, restarts=0)  # dead means dead
    files = make_run_files(reason, num_records=12, shards=1, recipe=MIXED_RECIPE, extra_run=deployment)
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir = Path(submitted["run_dir"])
    done = run_cli("wait", str(run_dir), "--json", "--timeout", "120", env=files.env, timeout=200)
    assert done.returncode == 1, done.stderr
    final = json.loads(done.stdout)
    assert final["state"] == "failed" and final["shards"][0]["reason"] == reason
    record = read_json(_attempts(run_dir)[0] / "attempt.json", AttemptRecord)
    assert record.reason == reason and needle in (record.message or "")
    assert "server-generator-0.log" in (record.message or "")  # the log tail says where it came from
    # Fast: the fleet ended the attempt for the server's own reason, within `wait`'s bound, long before Slurm's
    # time limit would have (no wall time asserted: docs/testing.md).
    assert record.ended_at is not None


# --- ddslurm report of a mixed run: the page is written and its numbers match the run (rows, attempts, the
# requests each model endpoint received, Slurm's accounting, the dataset) ---

SMALL_GENERATOR = generator(replicas=1, tensor_parallel=1, env=STAND_IN)


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
        # stages: the report reads the final stage's attempts only; allocations: one GPU job per shard (2 jobs)
        extra_run=SMALL_GENERATOR + "stages: single\nallocations: 2\n",
        vllm_executable=vllm_stand_in(tmp_path, record_env=True),
    )
    run_dir = Path(
        _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
    )
    final = _cli("wait", str(run_dir), "--json", env=files.env)
    assert final["state"] == "succeeded", final
    _cli("collect", str(run_dir), "--json", "--local", env=files.env)
    # `wait` returns on the attempts' records; the allocations' teardown follows: report once Slurm has ended them.
    arrays = [p.stem for p in (run_dir / "submissions").glob("*.json")]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        states = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(arrays), "--format=State"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if states and all(state == "COMPLETED" for state in states):
            break
        time.sleep(0.5)

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
    # The requests Data Designer counted are the requests the endpoints received: no health check for the deployed
    # generator (the controller checked its replicas; the client skips Data Designer's check); for the hosted judge
    # the client's gate made the check (issue 36), and its record of the key holds every request the key received.
    local_served = [json.loads(line) for f in tmp_path.glob("requests-*.jsonl") for line in f.read_text().splitlines()]
    assert generator["health_checks"] == 0
    assert generator["requests"] == _chat(local_served) > 2
    hosted = [json.loads(line) for line in log.read_text().splitlines()[before:]]
    assert all(m["health_checks"] == 0 for m in judges)
    assert sum(m["requests"] for m in report["hosted"]["models"]) == _chat(hosted) > 0
    assert 0 < sum(m["requests"] for m in judges) < _chat(hosted)  # Data Designer's, less the gate's check
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
