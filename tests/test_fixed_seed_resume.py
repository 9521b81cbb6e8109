"""Every attempt of a shard reads the same seed rows in the same order, with the real Data Designer engine.

A shuffled seed (``sampling_strategy: shuffle``) and a two-stage run's CPU stage are the cases where an attempt
derives what Data Designer reads: Data Designer draws a new random order on each ``create()``, and it resumes only
the config that began a dataset (the seed path is part of its fingerprint). Here an attempt is killed (SIGKILL of
its whole process group) after two batches, a second attempt resumes it, and the shard must hold every seed row
exactly as often as an unsharded run uses it.
"""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import (
    AttemptRecord,
    Progress,
    RunLayout,
    WinnerRecord,
    encode,
    make_private_dir,
    publish_once,
    read_json,
    sha256_file,
)
from ddslurm.launcher import prepare, write_run_dir
from ddslurm.launcher.testing import InProcessHost

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""

pytestmark = pytest.mark.dd

REPO = Path(__file__).resolve().parents[1]
RUNTIME = str(Path(sys.executable).parent / "ddslurm-runtime")
ROWS = 10


@pytest.fixture
def slow_endpoint(hosted_endpoint: Any) -> Iterator[str]:
    """A stand-in with the hosted endpoint's key, slow enough (0.4 s a request) to kill an attempt between
    batches."""
    from fake_vllm.testing import start_server

    args = ["--served-model-name", "demo/writer-8b", "demo/judge-70b"]
    env = {"FAKE_VLLM_LATENCY": "0.4"}
    with start_server("demo", args=args, env=env, api_key=hosted_endpoint.api_key) as server:
        yield server.base_url


def _point_at(files: Any, base_url: str) -> None:
    providers = files.dd_home / "model_providers.yaml"
    text = providers.read_text()
    old = next(line for line in text.splitlines() if line.strip().startswith("endpoint:"))
    providers.write_text(text.replace(old, f"  endpoint: {base_url}"))


def _seed_csv(root: Path) -> None:
    with (root / "items.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["item_id", "item"])
        writer.writerows([[i, f"item number {i}"] for i in range(ROWS)])


SHUFFLED_RECIPE = """\
data_designer:
  seed_config:
    source: {seed_type: local, path: items.csv}
    sampling_strategy: shuffle
  columns:
  - {name: blurb, column_type: llm-text, model_alias: writer, prompt: 'Describe {{ item }}.'}
  model_configs:
  - alias: writer
    model: demo/writer-8b
    provider: demo-hosted
    inference_parameters: {max_parallel_requests: 1, max_tokens: 32}
"""


def _env(files: Any) -> dict[str, str]:
    env = {k: v for k, v in files.env.items() if not k.startswith("SLURM")}
    env["DDSLURM_LOCAL_TOKEN"] = "local-token-of-the-allocation"  # what a controller gives its clients
    return env


def _kill_after_batches(argv: list[str], env: dict[str, str], progress: Path, batches: int) -> None:
    """Run ``argv`` in its own process group and SIGKILL the group, and every process whose command line names
    the run directory and then the attempt (tests running beside this one have attempts of the same name), once
    ``progress`` counts ``batches``."""
    marker = f"{progress.parents[4]}.*{progress.parent.name}"  # <run>/shards/shard-N/attempts/<attempt>/progress
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            if progress.is_file() and read_json(progress, Progress).batches >= batches:
                return
            assert proc.poll() is None, f"the attempt ended before it was killed: {proc.stderr.read()[-2000:]}"  # type: ignore[union-attr]
            time.sleep(0.05)
        raise AssertionError(f"{progress} did not reach {batches} batches")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # the steps a controller starts outside Slurm run in process groups of their own
        subprocess.run(["pkill", "-9", "-f", marker], check=False)


def _winner_table(shard: Any) -> pa.Table:
    winner = read_json(shard.winner, WinnerRecord)
    assert not winner.partial
    return pa.concat_tables(
        [pq.read_table(Path(winner.dataset_dir) / f.path) for f in winner.files], promote_options="default"
    )


def test_a_resumed_shuffled_shard_uses_every_seed_row_exactly_once(make_run_files: Any, slow_endpoint: str) -> None:
    files = make_run_files("shuffle", num_records=ROWS, shards=1, buffer_size=2)
    _point_at(files, slow_endpoint)
    _seed_csv(files.root)
    (files.root / "recipe.yaml").write_text(SHUFFLED_RECIPE)
    prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=HOST)
    write_run_dir(prepared)
    layout = prepared.layout
    assert prepared.plan.seed is not None and prepared.plan.seed.shuffle_seed is not None
    generate = [RUNTIME, "generate", "--run-dir", str(layout.root), "--shard", "0", "--launcher", "local"]
    shard = layout.shard(0)

    _kill_after_batches([*generate, "--job-id", "first"], _env(files), shard.attempt("attempt-first").progress, 2)
    done = subprocess.run(
        [*generate, "--job-id", "second"], env=_env(files), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]

    record = read_json(shard.attempt("attempt-second").record, AttemptRecord)
    assert record.state == "succeeded" and record.resumed_from == "attempt-first" and (record.resumed_rows or 0) >= 4
    ids = _winner_table(shard).column("item_id").to_pylist()
    assert Counter(ids) == Counter(range(ROWS)), "each seed row once, as an unsharded shuffled run uses it"
    assert ids != sorted(ids), "still a shuffle"
    # The order is the shard's, fixed once: the file every attempt read, and what the plan's seed gives.
    from ddslurm.runtime._shard_seed import shard_permutation

    assert pq.read_table(shard.seed_order).column("item_id").to_pylist() == shard_permutation(
        prepared.plan.seed.shuffle_seed, 0, ROWS
    )
    assert ids == shard_permutation(prepared.plan.seed.shuffle_seed, 0, ROWS)
    # Issue 35, item 2: the facts this run teaches count the requests of the rows the winner generated itself
    # (the killed attempt left no Data Designer summary: its rows and requests are both left out), so the rate is
    # the recipe's own: one writer request a record, as a fault-free run measures it.
    from ddslurm.launcher.facts._measure import measure_run

    _models, recipe = measure_run(layout, None)
    assert recipe is not None and recipe.requests_per_record == {"writer": 1.0}, recipe


STAGED_RECIPE = """\
data_designer:
  seed_config:
    source: {seed_type: local, path: items.csv}
  columns:
  - {name: draft, column_type: llm-text, model_alias: generator, prompt: 'Draft {{ item }}.', drop: true}
  - {name: kind, column_type: expression, expr: '{{ item_id | int % 2 }}', drop: false}
  - {name: blurb, column_type: llm-text, model_alias: writer, prompt: 'Improve {{ draft }} ({{ kind }}).'}
  # dropped by the CPU stage itself: its row numbers must still reach the preserved files (chaos seed 500106)
  - {name: blurb_chars, column_type: expression, expr: '{{ blurb | length }}', drop: true}
  model_configs:
  - alias: generator
    model: qwen3-8b
    provider: local
  - alias: writer
    model: demo/writer-8b
    provider: demo-hosted
    inference_parameters: {max_parallel_requests: 1, max_tokens: 32}
"""
DEPLOYMENT = (
    "deployments:\n  - model_alias: generator\n    model: Qwen/Qwen3-8B\n    served_model_name: qwen3-8b\n"
    "    replicas: 1\n    tensor_parallel: 1\n"
)


def _publish_gpu_stage(layout: RunLayout, shard_index: int, rows: int, *, partial: bool = False) -> WinnerRecord:
    """The shard's GPU-stage winner, made here (the CPU stage only reads it): the seed columns and the drafts."""
    shard = layout.shard(shard_index).stage(0)
    dataset = shard.attempt("attempt-gpu").output / f"shard-{shard_index:05d}"
    make_private_dir(dataset / "parquet-files", exist_ok=True)
    batch = dataset / "parquet-files" / "batch_00000.parquet"
    table = pa.table(
        {
            "item_id": list(range(rows)),
            "item": [f"item number {i}" for i in range(rows)],
            "draft": [f"draft of item {i}" for i in range(rows)],
        }
    )
    pq.write_table(table, batch)
    from ddslurm.config import FileEntry

    entry = FileEntry(path="parquet-files/batch_00000.parquet", size=batch.stat().st_size, sha256=sha256_file(batch))
    winner = WinnerRecord(
        shard=shard_index,
        attempt="attempt-gpu",
        rows=rows,
        dataset_dir=str(dataset),
        files=(entry,),
        plan_sha256="x",
        published_at=datetime.now(UTC).isoformat(),
        partial=partial,
    )
    make_private_dir(shard.dir, exist_ok=True)
    assert publish_once(shard.winner, encode(winner))
    return winner


def _staged_run(make_run_files: Any, slow_endpoint: str, name: str, records: int) -> Any:
    files = make_run_files(name, num_records=records, shards=1, buffer_size=2, extra_run=DEPLOYMENT)
    _point_at(files, slow_endpoint)
    _seed_csv(files.root)
    (files.root / "recipe.yaml").write_text(STAGED_RECIPE)
    prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=HOST)
    assert len(prepared.plan.stages) == 2, prepared.plan.stage_reason
    write_run_dir(prepared)
    return files, prepared


def _cpu_stage_attempt(files: Any, layout: RunLayout, job: str) -> list[str]:
    """The CPU stage's attempt ``job`` of shard 0 begun as its controller begins it; the client's command line."""
    from ddslurm.runtime import AttemptRunner, load_inputs
    from ddslurm.runtime._log import new_logger

    runner = AttemptRunner(layout, engine=lambda _: None, env={}, make_logger=new_logger, stage=1)  # type: ignore[arg-type,return-value]
    assert runner.begin(load_inputs(layout), 0, job, "local") is not None
    return [RUNTIME, "client", "--run-dir", str(layout.root), "--shard", "0", "--attempt", f"attempt-{job}"]


def test_a_cpu_stage_attempt_resumes_the_batches_of_an_earlier_one(make_run_files: Any, slow_endpoint: str) -> None:
    files, prepared = _staged_run(make_run_files, slow_endpoint, "staged", ROWS)
    layout = prepared.layout
    _publish_gpu_stage(layout, 0, ROWS)
    shard = layout.shard(0)

    first = _cpu_stage_attempt(files, layout, "cpu1")
    _kill_after_batches([*first, "--stage", "1"], _env(files), shard.attempt("attempt-cpu1").progress, 2)
    second = _cpu_stage_attempt(files, layout, "cpu2")
    done = subprocess.run([*second, "--stage", "1"], env=_env(files), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]

    record = read_json(shard.attempt("attempt-cpu2").record, AttemptRecord)
    assert record.state == "succeeded", record
    assert record.resumed_from == "attempt-cpu1" and (record.resumed_rows or 0) >= 4
    table = _winner_table(shard)
    assert Counter(table.column("item_id").to_pylist()) == Counter(range(ROWS))
    assert sorted(table.column_names) == ["blurb", "item", "item_id", "kind"]
    # Data Designer preserved the row numbers it dropped row for row with its batches: what a fill relies on.
    winner = read_json(shard.winner, WinnerRecord)
    for entry in winner.files:
        batch = pq.read_table(Path(winner.dataset_dir) / entry.path)
        numbers = pq.read_table(Path(winner.dataset_dir) / "dropped-columns-parquet-files" / Path(entry.path).name)
        assert numbers.column("_ddslurm_stage_row").to_pylist() == batch.column("item_id").to_pylist()


def _batches_with_empty_values(dataset: Path, column: str) -> tuple[list[str], list[str]]:
    """(clean, with an empty or blank value of ``column``): the names of the dataset's batch files."""
    clean, dirty = [], []
    for batch in sorted((dataset / "parquet-files").glob("batch_*.parquet")):
        values = pq.read_table(batch).column(column).to_pylist()
        (dirty if any(v is None or not str(v).strip() for v in values) else clean).append(batch.name)
    return clean, dirty


def test_a_retry_does_not_resume_the_empty_answers_of_a_killed_attempt(
    make_run_files: Any, hosted_endpoint: Any
) -> None:
    """The first attempt's provider answers some requests with HTTP 200 and no ``choices`` (Data Designer stores
    an empty value) and the attempt is killed before it could verify anything. The retry, against the provider
    healed at the same address, continues only the batches without empty values: Data Designer generates the
    others again into their holes, every seed row is used once, and nothing empty is published
    (``max_empty_outputs: 0``). Before, each retry resumed the empty values and, without a rerun inside the
    attempt (``client_retries: 0``), was rejected in turn: a chaos campaign's five retries of one shard."""
    from fake_vllm.testing import start_server

    files = make_run_files("empty-resume", num_records=ROWS, shards=1, buffer_size=2, extra_run="client_retries: 0\n")
    _seed_csv(files.root)
    (files.root / "recipe.yaml").write_text(SHUFFLED_RECIPE)
    models = ["--served-model-name", "demo/writer-8b", "--fake-latency", "0.4"]
    faulty = [*models, "--fake-no-choices-rate", "0.3", "--fake-seed", "5"]
    with start_server("demo", args=faulty, api_key=hosted_endpoint.api_key) as broken:
        port = int(broken.base_url.split(":")[-1].split("/")[0])
        _point_at(files, broken.base_url)
        prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), host=HOST)
        write_run_dir(prepared)
        shard = prepared.layout.shard(0)
        generate = [RUNTIME, "generate", "--run-dir", str(prepared.layout.root), "--shard", "0", "--launcher", "local"]
        _kill_after_batches([*generate, "--job-id", "first"], _env(files), shard.attempt("attempt-first").progress, 3)
    clean, dirty = _batches_with_empty_values(shard.attempt("attempt-first").output / "shard-00000", "blurb")
    assert dirty and clean, f"the provider's empty answers reached some batches, not all: {clean} {dirty}"

    with start_server("demo", args=models, api_key=hosted_endpoint.api_key, port=port):
        done = subprocess.run(
            [*generate, "--job-id", "second"], env=_env(files), capture_output=True, text=True, timeout=240
        )
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_json(shard.attempt("attempt-second").record, AttemptRecord)
    assert (record.state, record.resumed_from, record.resumed_rows) == ("succeeded", "attempt-first", 2 * len(clean))
    table = _winner_table(shard)
    assert Counter(table.column("item_id").to_pylist()) == Counter(range(ROWS))
    assert all(str(v).strip() for v in table.column("blurb").to_pylist())
    winner = read_json(shard.winner, WinnerRecord)
    continued = {Path(f.path).name for f in winner.files} & set(clean)
    first = shard.attempt("attempt-first").output / "shard-00000" / "parquet-files"
    assert continued == set(clean)  # the clean batches were linked, not generated again
    assert all((Path(winner.dataset_dir) / "parquet-files" / name).samefile(first / name) for name in continued)
