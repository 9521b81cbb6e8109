"""Replicas across nodes and SGLang on the real local Slurm cluster (n1 and n2: 4 fake GPUs each), with the real
engine: the mixed example (its draws made deterministic, so every prompt and every stand-in reply is the same in
every run) served by one replica over two nodes (a leader on n1 that serves the API, a headless follower on n2),
by vLLM's data parallel on one node and over two, and by SGLang on one node and on two, each collecting exactly
the rows of a plain local ``DataDesigner.create`` of the recipe; a follower killed mid-run, which ends the
attempt ``server_died`` at once, while the automatic retry completes the shard with no row lost or duplicated; and
another user (``nobody``) who joins a replica's rendezvous as rank 1, read off the leader's command line, which
ends the attempt ``rendezvous_intruder`` before the replica serves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, read_json, read_plan
from fake_vllm.testing import impersonation, start_joiner
from tests.e2e import NOBODY, SYSTEM_PYTHON, attempts, local_dataset, one_draw_recipe, processes, until, vllm_stand_in
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

FAKE_SGLANG_PYTHON = Path(sys.executable).parent / "fake-sglang-python"
"""The stand-in as SGLang's Python (``<it> -m sglang.launch_server``, ``<it> -c BOOT``)."""
STAND_IN = "{FAKE_VLLM_LATENCY: '0.02', FAKE_VLLM_STARTUP_DELAY: '1'}"
RECORDS, SHARDS = 12, 1  # a shard a shape: several shards through one allocation are tests/test_e2e_pull.py's


def _deployment(model: str, shape: str, engine: str = "vllm", env: str = STAND_IN) -> str:
    """The run file's ``deployments:`` for the mixed example's ``generator`` (served as ``qwen3-8b``), its parallel
    fields ``shape`` (run-file lines, as ``tensor_parallel: 4, pipeline_parallel: 2``)."""
    fields = "".join(f"    {item.strip()}\n" for item in shape.split(","))
    return (
        f"deployments:\n  - model_alias: generator\n    model: {model}\n    served_model_name: qwen3-8b\n"
        f"    engine: {engine}\n{fields}    server:\n      cpus: 1\n      startup_timeout: 120\n      env: {env}\n"
    )


def _sglang_stand_in(folder: Path) -> Path:
    """``sglang_executable`` for a profile: a script that records its arguments (one a line,
    ``folder/sglang-args-<job>-<pid>.txt``) and becomes the stand-in's SGLang Python."""
    script = folder / "sglang-python"
    args = f"{folder}/sglang-args-${{SLURM_JOB_ID:-none}}-$$.txt"
    script.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$@" > "{args}"\nexec "{FAKE_SGLANG_PYTHON}" "$@"\n')
    script.chmod(0o755)
    return script


def _sacct(job: str, fields: str, *, allocation: bool = False) -> list[list[str]]:
    argv = ["sacct", "-n", "-P", "-j", job, f"--format={fields}", *(["-X"] if allocation else [])]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


@dataclass
class Submitted:
    name: str
    run_dir: Path
    env: dict[str, str]
    bin: Path


def _submit(make_run_files: Any, tmp_path: Path, name: str, deployment: str, recipe: Path) -> Submitted:
    bin_dir = tmp_path / f"{name}-bin"
    bin_dir.mkdir()
    files = make_run_files(
        name,
        num_records=RECORDS,
        shards=SHARDS,
        buffer_size=3,
        recipe=recipe,
        # one stage: each shape serves every column (tests/test_e2e_stages.py proves two stages)
        extra_run=deployment + "allocations: 1\nstages: single\n",
        vllm_executable=vllm_stand_in(bin_dir, record_args=True),
        extra_profile=f"sglang_executable: {_sglang_stand_in(bin_dir)}\n",
    )
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    return Submitted(name, Path(submitted["run_dir"]), files.env, bin_dir)


def _collected(run: Submitted) -> pa.Table:
    final = _cli("wait", str(run.run_dir), "--json", "--timeout", "600", env=run.env, timeout=700)
    logs = "\n".join(p.read_text()[-1500:] for p in run.run_dir.glob("**/server-*.log"))
    assert final["state"] == "succeeded", f"{run.name}: {final}\n{logs}"
    return pq.read_table(_cli("collect", str(run.run_dir), "--json", "--local", env=run.env)["dataset"])


def _args(run: Submitted, prefix: str = "args") -> list[list[str]]:
    """The arguments every server process of the run started with (one list per process; not the engine's
    version query)."""
    found = [f.read_text().splitlines() for f in sorted(run.bin.glob(f"{prefix}-*.txt"))]
    return [argv for argv in found if "--model-path" in argv or argv[:1] == ["serve"]]


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _generation_job(run: Submitted) -> str:
    """The Slurm job of the run's (first) GPU allocation."""
    records = sorted(run.run_dir.glob("shards/*/stage-0/attempts/*/attempt.json")) or sorted(
        run.run_dir.glob("shards/*/attempts/*/attempt.json")
    )
    return read_json(records[0], AttemptRecord).job_id.partition(".")[0]


def test_every_shape_and_engine_collects_the_laptops_rows(make_run_files: Any, tmp_path: Path) -> None:
    recipe = one_draw_recipe(tmp_path)
    shapes = {
        "tp4-pp2": ("tensor_parallel: 4, pipeline_parallel: 2", "vllm"),
        "dp2-ep": ("data_parallel: 2, expert_parallel: true", "vllm"),
        "dp8": ("data_parallel: 8", "vllm"),
        "sglang": ("tensor_parallel: 2", "sglang"),
        "sglang-tp4-pp2": ("tensor_parallel: 4, pipeline_parallel: 2", "sglang"),
    }
    runs = {
        name: _submit(make_run_files, tmp_path, name, _deployment(f"e2e/{name}", shape, engine), recipe)
        for name, (shape, engine) in shapes.items()
    }
    tables = {name: _collected(run) for name, run in runs.items()}
    # The laptop's rows: a local DataDesigner.create against one stand-in (its replies are a function of the request).
    laptop = local_dataset(recipe, RECORDS, tmp_path / "oracle")
    reference = laptop.to_pylist()
    assert len(reference) == RECORDS
    for name, table in tables.items():
        assert table.column_names == laptop.column_names, name
        assert table.to_pylist() == reference, f"{name} collected other rows than a local DataDesigner.create"

    # One replica over two nodes: a 2-node allocation (sacct), its leader on n1, its headless follower on n2.
    two = runs["tp4-pp2"]
    script = (two.run_dir / "generate.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:4" in script, script
    job = _generation_job(two)
    assert _sacct(job, "NNodes,NodeList", allocation=True) == [["2", "n[1-2]"]]
    steps = {name: nodes for name, nodes in _sacct(job, "JobName,NodeList")}
    assert steps.get("server-generator-0") == "n1" and steps.get("server-generator-0-rank1") == "n2", steps
    leader, follower = sorted(_args(two), key=lambda a: a.count("--headless"))
    assert (_flag(leader, "--nnodes"), _flag(leader, "--node-rank"), _flag(follower, "--node-rank")) == ("2", "0", "1")
    assert _flag(leader, "--master-port") == _flag(follower, "--master-port") is not None
    assert "--headless" in follower and "--uds" in leader and "--uds" not in follower

    # Data parallel over two nodes: one API (one replica behind the proxy), four ranks on each node.
    dp8 = sorted(_args(runs["dp8"]), key=lambda a: a.count("--headless"))
    assert [_flag(a, "--data-parallel-size-local") for a in dp8] == ["4", "4"]
    assert [_flag(a, "--data-parallel-start-rank") for a in dp8][1] == "4" and "--headless" in dp8[1]
    plan = read_plan(runs["dp8"].run_dir / "run.json")
    assert plan.serving is not None and plan.serving.nodes == 2
    assert len(plan.serving.deployments[0].replicas) == 1 and plan.serving.deployments[0].replica_gpus == 8
    (dp2,) = _args(runs["dp2-ep"])
    assert _flag(dp2, "--data-parallel-size") == "2" and "--enable-expert-parallel" in dp2

    # SGLang: the token reached it through its environment (the -c bootstrap), never its command line.
    for name in ("sglang", "sglang-tp4-pp2"):
        started = _args(runs[name], "sglang-args")  # -c BOOT, then SGLang's own arguments: no key among them
        assert started and all(a[0] == "-c" and not any(w.startswith("--api-key") for w in a[2:]) for a in started)
        # SGLang logs its arguments, the key among them, on every rank: its log reached the file without it.
        logs = [p.read_text() for p in runs[name].run_dir.glob("**/server-*.log")]
        assert logs and all("api_key='[redacted]'" in log for log in logs), name
    sglang_two = sorted(_args(runs["sglang-tp4-pp2"], "sglang-args"), key=lambda a: _flag(a, "--node-rank") or "")
    assert [_flag(a, "--node-rank") for a in sglang_two] == ["0", "1"]
    assert _flag(sglang_two[0], "--dist-init-addr") == _flag(sglang_two[1], "--dist-init-addr") is not None


def _follower_pid(model: str) -> int | None:
    """The running follower stand-in of ``model`` (its command line names the model and ``--headless``)."""
    for pid, argv in processes():
        if model in argv and "--headless" in argv and "serve" in argv:
            return pid
    return None


def test_killing_a_follower_ends_the_attempt_server_died_and_the_retry_completes_the_shard(
    make_run_files: Any, tmp_path: Path
) -> None:
    model = f"e2e/kill-{os.urandom(3).hex()}"
    records = 24
    files = make_run_files(
        "kill",
        num_records=records,
        shards=1,
        buffer_size=4,
        recipe=one_draw_recipe(tmp_path),
        extra_run=_deployment(model, "tensor_parallel: 4, pipeline_parallel: 2",
                              env="{FAKE_VLLM_LATENCY: '0.3', FAKE_VLLM_STARTUP_DELAY: '1'}")
        + "retries: 1\nclient_retries: 0\nstages: single\n",
    )  # fmt: skip
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir = Path(submitted["run_dir"])

    def generating() -> bool:
        progress = list(run_dir.glob("shards/shard-00000/attempts/*/progress.json"))
        return bool(progress) and _follower_pid(model) is not None

    until(generating, 240, "the first attempt's first batch, with its follower running")
    pid = _follower_pid(model)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    def first_ended() -> AttemptRecord | None:
        ended = [a for a in attempts(run_dir, 0) if a.state != "running"]
        return ended[0] if ended else None

    first = until(first_ended, 60, "the first attempt's end")  # a bound on the wait, not a measured time
    assert first.state == "failed" and first.reason == "server_died", first
    assert "rank1" in (first.message or "") or "rank 1" in (first.message or ""), first.message

    final = _cli("wait", str(run_dir), "--json", "--timeout", "600", env=files.env, timeout=700)
    assert final["state"] == "succeeded", final
    table = pq.read_table(_cli("collect", str(run_dir), "--json", "--local", env=files.env)["dataset"])
    assert table.num_rows == records
    seed = _seed_questions(tmp_path, records)
    assert table.column("question").to_pylist() == seed, "rows lost, duplicated or out of order after the retry"
    assert len(attempts(run_dir, 0)) == 2


def _seed_questions(tmp_path: Path, records: int) -> list[str]:
    """The questions of the first ``records`` records as Data Designer's ordered sampling takes them (cycling
    through the seed file's rows)."""
    import csv

    with (tmp_path / "recipe" / "questions.csv").open() as f:
        rows = [row["question"] for row in csv.DictReader(f)]
    return [rows[i % len(rows)] for i in range(records)]


def _leader_argv(model: str) -> list[str] | None:
    """The command line of the running leader of ``model``'s replica, as ``ps`` shows it to every user (not the
    ``srun`` that started it)."""
    for _, argv in processes():
        if model in argv and "--master-port" in argv and "--headless" not in argv and Path(argv[0]).name != "srun":
            return argv
    return None


@pytest.mark.skipif(os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists(), reason="nobody's joiner needs root")
def test_another_user_who_joins_the_rendezvous_ends_the_attempt_before_the_replica_serves(
    make_run_files: Any, tmp_path: Path
) -> None:
    """Issue 37, item 6: ``nobody`` reads the port, the sizes and the model off the leader's command line and joins
    as rank 1 (before the real follower or after it: the engine counts the first, refuses the second and dies).
    The controller sees nobody's socket on the rendezvous port and fails the attempt with that reason, before any
    endpoint is published. The leader's model load (``FAKE_VLLM_STARTUP_DELAY``) bounds how long the joiner may
    take; the attempt ends as soon as it is seen."""
    model = f"e2e/join-{os.urandom(3).hex()}"
    files = make_run_files(
        "join",
        num_records=RECORDS,
        shards=1,
        buffer_size=3,
        recipe=one_draw_recipe(tmp_path),
        extra_run=_deployment(model, "tensor_parallel: 4, pipeline_parallel: 2",
                              env="{FAKE_VLLM_LATENCY: '0.02', FAKE_VLLM_STARTUP_DELAY: '300'}")
        + "retries: 0\nstages: single\n",
    )  # fmt: skip
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    run_dir = Path(submitted["run_dir"])
    leader = until(lambda: _leader_argv(model), 240, "the replica's leader on the node")
    address, port = leader[leader.index("--master-addr") + 1], leader[leader.index("--master-port") + 1]

    def ended() -> AttemptRecord | None:
        done = [a for a in attempts(run_dir, 0) if a.state != "running"]
        return done[0] if done else None

    with start_joiner(address, int(port), impersonation(leader), user=NOBODY, python=SYSTEM_PYTHON) as joiner:
        assert "error" not in joiner.said, joiner.said  # it reached the rendezvous
        first = until(ended, 120, "the attempt's end")  # a bound on the wait, not a measured time
    assert (first.state, first.reason) == ("failed", "rendezvous_intruder"), first
    message = first.message or ""
    assert f"uid {NOBODY}" in message and f"rendezvous port {port}" in message, message
    assert "was stopped before it served" in message, message
    assert not list(run_dir.glob("shards/shard-00000/attempts/*/endpoints.json"))  # never served to the client
