"""The node-side runtime with the real Data Designer engine against the hosted stand-in, outside Slurm.

The runtime runs in a subprocess whose HOME does not exist and whose audit hook records every file the
process opens, creates or lists under HOME: the runtime must succeed and touch nothing there.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, RunLayout, WinnerRecord, read_json
from ddslurm.launcher import prepare, write_run_dir
from ddslurm.launcher.testing import InProcessHost
from ddslurm.runtime._attempt_record import EXIT_PARTIAL
from ddslurm.runtime._verify import FILL_DIR, rows_in

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""

AUDIT_HOOK = """
import os, sys
_home = os.environ["HOME"]
_report = os.environ["HOME_AUDIT_REPORT"]
def _hook(event, args):
    if event in ("open", "os.mkdir", "os.listdir", "os.scandir", "os.rename", "os.remove") and args:
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            path = os.fsdecode(path)
            if path == _home or path.startswith(_home.rstrip("/") + "/"):
                with open(_report, "a") as fh:
                    fh.write(f"{event} {path}\\n")
sys.addaudithook(_hook)
"""

pytestmark = pytest.mark.dd


def _runtime(run_dir: Path, shard: int, job_id: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "ddslurm-runtime"
    return subprocess.run(
        [str(exe), "generate", "--run-dir", str(run_dir), "--shard", str(shard), "--job-id", job_id],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )


def test_runtime_generates_and_publishes_without_a_home_directory(
    run_files: Any, hosted_endpoint: Any, tmp_path: Path, scan_for_secret: Any
) -> None:
    prepared = prepare(run_files.run_file, run_files.profile, run_files.env, datetime.now(UTC), host=HOST)
    write_run_dir(prepared)
    run_dir = prepared.layout.root

    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(AUDIT_HOOK)
    report = tmp_path / "home-access.txt"
    missing_home = tmp_path / "no-such-home"
    env = {k: v for k, v in os.environ.items() if k not in {"DATA_DESIGNER_HOME", "HOME"} and not k.startswith("SLURM")}
    env.update(
        HOME=str(missing_home),
        HOME_AUDIT_REPORT=str(report),
        PYTHONPATH=str(hook_dir),
        DEMO_HOSTED_API_KEY=hosted_endpoint.api_key,
        SSL_CERT_FILE=run_files.env["SSL_CERT_FILE"],
    )
    log = hosted_endpoint.request_log
    before = len(log.read_text().splitlines()) if log.exists() else 0  # the endpoint serves this worker's tests
    done = _runtime(run_dir, 0, "local-1", env)
    assert done.returncode == 0, done.stderr[-3000:]

    assert not missing_home.exists()
    assert not report.exists() or report.read_text() == ""
    shard = prepared.layout.shard(0)
    winner = read_json(shard.winner, WinnerRecord)
    assert winner.rows == prepared.plan.shards[0].num_records
    table = pq.read_table(Path(winner.dataset_dir) / "parquet-files")
    assert table.num_rows == winner.rows
    assert {"topic", "difficulty", "question", "quality", "question_length"} <= set(table.column_names)
    scores = [row["quality"]["Relevance"]["score"] for row in table.to_pylist()]
    assert all(str(s) in {"1", "2", "3"} for s in scores)
    assert read_json(shard.attempt("attempt-local-1").record, AttemptRecord).state == "succeeded"

    assert scan_for_secret(run_dir, hosted_endpoint.api_key) == []
    assert hosted_endpoint.api_key not in done.stdout + done.stderr
    requests = [json.loads(line) for line in log.read_text().splitlines()[before:]]  # this run's (a refused key's
    chats = [r for r in requests if r["path"].endswith("/chat/completions")]  # test asks the same endpoint)
    assert chats and all(r["authorized"] for r in chats)


def test_runtime_without_the_key_fails_with_a_reason_and_publishes_nothing(run_files: Any) -> None:
    prepared = prepare(run_files.run_file, run_files.profile, run_files.env, datetime.now(UTC), host=HOST)
    write_run_dir(prepared)
    env = {k: v for k, v in os.environ.items() if k != "DEMO_HOSTED_API_KEY" and not k.startswith("SLURM")}
    done = _runtime(prepared.layout.root, 1, "local-2", env)
    assert done.returncode == 1
    shard = prepared.layout.shard(1)
    assert not shard.winner.exists()
    record = read_json(shard.attempt("attempt-local-2").record, AttemptRecord)
    assert record.state == "failed" and record.reason == "secret_missing"
    assert "DEMO_HOSTED_API_KEY" in (record.message or "")


def test_a_key_the_endpoint_refuses_is_key_refused_and_not_rerun(
    make_run_files: Any, local_attempt: Any, scan_for_secret: Any
) -> None:
    # Submit saw the right key; the job gets another value (a key rotated, or the wrong one exported).
    wrong = "sk-wrong-" + os.urandom(10).hex()
    files = make_run_files("refused", num_records=4, shards=1, extra_run="client_retries: 2\n")
    run_dir, proc = local_attempt(files, "31", node_env={"DEMO_HOSTED_API_KEY": wrong})
    _, err = proc.communicate(timeout=240)

    shard = RunLayout(run_dir).shard(0)
    record = read_json(shard.attempt("attempt-31").record, AttemptRecord)
    assert (record.state, record.reason, record.retryable, proc.returncode) == ("failed", "key_refused", False, 1), (
        record,
        err[-2000:],
    )
    assert record.client_runs == 1  # client_retries: 2 would have rerun a generation_failed twice
    message = record.message or ""
    assert message.startswith(
        "the endpoint of provider 'demo-hosted' refused the API key in DEMO_HOSTED_API_KEY (HTTP 401)"
    )
    assert "ddslurm retry" in message
    events = [json.loads(line)["event"] for line in shard.attempt("attempt-31").client_log.read_text().splitlines()]
    assert "client.rerun" not in events and "attempt.failed" in events
    assert not shard.winner.exists()
    assert scan_for_secret(run_dir, wrong) == [] and wrong not in err


STRUCTURED_RECIPE = """\
data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - name: answer
    column_type: llm-structured
    model_alias: writer
    prompt: 'Answer about {{ topic }} as JSON.'
    output_format: {type: object, properties: {x: {type: string}}, required: [x]}
  model_configs:
  - {alias: writer, model: demo/writer-8b, provider: demo-hosted, skip_health_check: true}
"""


def test_a_shard_data_designer_stopped_early_is_partial_and_says_so(
    make_run_files: Any, hosted_endpoint: Any, tmp_path: Path
) -> None:
    """A provider that answers 80% of requests without content makes the structured column's parses fail, which
    Data Designer counts toward its early-shutdown gate: it stops and keeps the records it had. Data Designer 1.0
    says so (``early_shutdown``): the shard is ``partial`` with reason ``early_shutdown`` and no fill asks the
    provider again; older versions cannot tell it from dropped records, so the fill runs."""
    from data_designer.interface.results import DatasetCreationResults

    from fake_vllm.testing import start_server

    reports = "early_shutdown" in inspect.signature(DatasetCreationResults.__init__).parameters
    recipe = tmp_path / "structured.yaml"
    recipe.write_text(STRUCTURED_RECIPE)
    files = make_run_files(num_records=40, shards=1, buffer_size=5, recipe=recipe)
    providers = files.dd_home / "model_providers.yaml"
    args = ["--served-model-name", "demo/writer-8b", "--fake-no-choices-rate", "0.8", "--fake-seed", "3"]
    with start_server("demo", args=args, api_key=hosted_endpoint.api_key, log_path=tmp_path / "server.log") as server:
        providers.write_text(providers.read_text().replace(hosted_endpoint.base_url, server.base_url))
        prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=HOST)
        write_run_dir(prepared)
        env = {k: v for k, v in files.env.items() if not k.startswith("SLURM")}
        done = _runtime(prepared.layout.root, 0, "local-3", env)

    shard = prepared.layout.shard(0)
    attempt = shard.attempt("attempt-local-3")
    record = read_json(attempt.record, AttemptRecord)
    client_log = attempt.client_log.read_text()
    fills = rows_in(attempt.output / "shard-00000" / FILL_DIR)
    if reports:
        assert done.returncode == EXIT_PARTIAL, done.stderr[-3000:]
        assert (record.state, record.reason) == ("partial", "early_shutdown")
        assert record.rows is not None and 0 < record.rows < 40
        assert "stopped early" in (record.message or "")
        assert "fill.start" not in client_log and fills == 0
        assert not shard.winner.exists()
    else:
        assert record.reason != "early_shutdown"
        assert "fill.start" in client_log


@pytest.mark.parametrize(
    ("status", "heals"),
    [pytest.param("429", True, id="rate-limited"), pytest.param("500", True, id="failing"),
     pytest.param("500", False, id="longer-than-provider-wait")],
)  # fmt: skip
def test_a_provider_outage_at_start_is_waited_out_inside_the_attempt(
    tmp_path: Path, local_attempt: Any, status: str, heals: bool
) -> None:
    """The hosted provider answers every chat request with ``status`` (Data Designer's start-up health check does
    not retry it): the attempt waits and tries again, with backoff, until the provider heals (the test empties the
    outage file once the attempt has logged its first wait) and publishes every row in one client run; an outage
    longer than ``provider_wait`` fails the attempt ``provider_unavailable``, retryable, saying how long."""
    from conftest import hosted_stand_in, write_run_files

    outage = tmp_path / "outage"
    outage.write_text(status)
    with hosted_stand_in(tmp_path, "--fake-outage", str(outage)) as endpoint:
        extra = "client_retries: 0\n" + ("" if heals else "provider_wait: 2\n")
        files = write_run_files(tmp_path / "run", endpoint, num_records=4, shards=1, buffer_size=2, extra_run=extra)
        run_dir, proc = local_attempt(files, "61")
        log = RunLayout(run_dir).shard(0).attempt("attempt-61").client_log
        journal = RunLayout(run_dir).shard(0).attempt("attempt-61").hosted_requests
        if heals:
            waited = False
            while proc.poll() is None and not waited:  # the attempt's first wait, then the provider heals
                waited = (log.is_file() and '"provider.unavailable"' in log.read_text()) or (
                    journal.is_file() and '"status":429' in journal.read_text()  # the gate waits a 429 out
                )
                time.sleep(0.05)  # a poll interval, not a moment: the event is the logged wait
            outage.write_text("")
        _, err = proc.communicate(timeout=240)
    record = read_json(RunLayout(run_dir).shard(0).attempt("attempt-61").record, AttemptRecord)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    waits = [e for e in events if e["event"] == "provider.unavailable"]
    chats = [
        e["status"]
        for e in map(json.loads, endpoint.request_log.read_text().splitlines())
        if e["path"].endswith("/completions")
    ]
    assert str(chats[0]) == status, (chats[:5], err[-2000:])  # the start-up check was refused, then waited out:
    assert waits or status == "429", err[-2000:]  # by the attempt; a 429 by the key's budget in the gate (issue 36)
    if heals:
        assert (proc.returncode, record.state, record.client_runs) == (0, "succeeded", 1), (record, err[-2000:])
        assert read_json(RunLayout(run_dir).shard(0).winner, WinnerRecord).rows == 4
    else:
        assert (record.state, record.reason, record.retryable) == ("failed", "provider_unavailable", True), record
        assert "the run file's provider_wait is 2 s" in (record.message or "") and proc.returncode == 1


def test_the_run_files_run_config_reaches_data_designer_on_the_node(make_run_files: Any) -> None:
    """The run file's ``run_config`` is read back from the node's engine: the client log reports the values Data
    Designer's ``RunConfig`` holds on the node for each field, and one of them visibly takes effect there
    (``write_scheduler_events``: Data Designer writes its scheduler diagnostics beside the shard's batches)."""
    extra = (
        "run_config:\n"
        "  write_scheduler_events: true\n"
        "  shutdown_error_window: 7\n"
        "  jinja_rendering_engine: native\n"
        "  request_admission: {cooldown_seconds: 1.5}\n"
    )
    files = make_run_files("run-config", num_records=2, shards=1, buffer_size=2, extra_run=extra)
    prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=HOST)
    write_run_dir(prepared)
    env = {k: v for k, v in files.env.items() if not k.startswith("SLURM")}
    done = _runtime(prepared.layout.root, 0, "local-rc", env)
    assert done.returncode == 0, done.stderr[-3000:]

    shard = prepared.layout.shard(0)
    events = [json.loads(line) for line in shard.attempt("attempt-local-rc").client_log.read_text().splitlines()]
    applied = [e["applied"] for e in events if e["event"] == "engine.run_config"]
    assert len(applied) == 1, events
    assert {k: v for k, v in applied[0].items() if k != "request_admission"} == {
        "write_scheduler_events": True,
        "shutdown_error_window": 7,
        "jinja_rendering_engine": "native",
    }
    assert applied[0]["request_admission"]["cooldown_seconds"] == 1.5  # with Data Designer's defaults for the rest
    winner = read_json(shard.winner, WinnerRecord)
    assert winner.rows == 2
    scheduled = (Path(winner.dataset_dir) / "scheduler_events.jsonl").read_text().splitlines()
    assert scheduled and all(json.loads(line) for line in scheduled)
