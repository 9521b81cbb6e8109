"""The client step writes what it used (CPU-seconds, wall time) to its attempt's client-usage.json when it ends."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.config import AttemptRecord, ClientUsage, RunLayout, read_json
from ddslurm.runtime import EXIT_FAILED, EXIT_OK, EngineError, EngineRequest, EngineResult, load_inputs
from ddslurm.runtime._usage import process_cpu_s
from ddslurm.runtime.testing import attempt_runner, write_run

SECRET = "sk-usage-test-secret-value"


class BusyEngine:
    """Spends about ``cpu_s`` CPU-seconds and ``sleep_s`` idle seconds, then writes Data Designer's layout."""

    def __init__(self, cpu_s: float, sleep_s: float, fail: bool = False) -> None:
        self.cpu_s, self.sleep_s, self.fail = cpu_s, sleep_s, fail

    def __call__(self, request: EngineRequest) -> EngineResult:
        until = process_cpu_s() + self.cpu_s
        while process_cpu_s() < until:
            sum(range(1000))
        time.sleep(self.sleep_s)
        if self.fail:
            raise EngineError("boom", retryable=False)
        dataset = request.artifact_path / request.dataset_name
        (dataset / "parquet-files").mkdir(parents=True)
        pq.write_table(pa.table({"x": list(range(request.num_records))}), dataset / "parquet-files" / "b_0.parquet")
        (dataset / "metadata.json").write_text(json.dumps({"actual_num_records": request.num_records}))
        return EngineResult(dataset_dir=dataset, rows=request.num_records, requested=request.num_records)


def _layout(tmp_path: Path) -> RunLayout:
    return write_run(tmp_path / "run-1", (4,))


def _runner(layout: RunLayout, engine: Any) -> Any:
    return attempt_runner(layout, engine, env={"T_KEY": SECRET}, scratch_home=layout.root / "dd")


def test_a_succeeding_client_writes_its_cpu_and_wall_time(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    before = process_cpu_s()
    started = time.monotonic()
    assert _runner(layout, BusyEngine(0.3, 0.4)).run(load_inputs(layout), 0, "5", "n") == EXIT_OK
    elapsed, spent = time.monotonic() - started, process_cpu_s()
    usage = read_json(layout.shard(0).attempt("attempt-5").client_usage, ClientUsage)
    # RUSAGE_SELF counts the whole process (the client step is one process): at least what the engine burned,
    # at most all this process has used; the wall time is the generation's, sleep included.
    assert spent - before >= 0.3 and 0.3 <= usage.cpu_s <= spent + 0.01
    # what the process had spent when its generation began (imports) is kept apart: the engine's 0.3 s is after it
    assert before <= usage.setup_cpu_s and usage.cpu_s - usage.setup_cpu_s >= 0.3
    assert 0.7 <= usage.wall_s <= elapsed + 0.01


def test_a_failing_client_writes_it_too(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    assert _runner(layout, BusyEngine(0.0, 0.2, fail=True)).run(load_inputs(layout), 0, "6", "n") == EXIT_FAILED
    attempt = layout.shard(0).attempt("attempt-6")
    assert read_json(attempt.record, AttemptRecord).reason == "generation_failed"
    assert read_json(attempt.client_usage, ClientUsage).wall_s >= 0.2


def test_a_usage_file_that_cannot_be_written_never_fails_the_attempt(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    runner, inputs = _runner(layout, BusyEngine(0.0, 0.0)), load_inputs(layout)
    began = runner.begin(inputs, 0, "7", "n")
    attempt = began.layout
    attempt.client_usage.mkdir()  # a directory where the file goes: the write fails
    assert runner.generate(inputs, began, {}) == EXIT_OK
    assert read_json(attempt.record, AttemptRecord).state == "succeeded"
    events = [json.loads(line)["event"] for line in attempt.client_log.read_text().splitlines()]
    assert "client.usage_unwritten" in events
