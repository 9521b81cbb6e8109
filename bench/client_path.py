"""The whole client path against the replicas' capacity, measured in the same run.

Measured: a run with one local deployment of R replicas (R = 1, 2, 4), submitted to the local Slurm cluster as a
real user submits one (``launcher.prepare`` + ``submit_shards``), its node side started by the real runtime
controller: Data Designer's client -> the balancing proxy (R > 1) -> R vLLM stand-ins as srun steps. Its rate is
taken from the stand-ins' own request logs (``--fake-request-log``) over the generation window, not from wall time,
which would count scheduling, server start-up, Data Designer's import and teardown.

Baseline: a plain async load generator (``httpx.AsyncClient``, concurrency = R x capacity, each replica kept at
exactly its capacity) against R stand-ins with the same settings, started in this process, measured the same way.

    uv run python bench/client_path.py [--replicas 1,2,4] [--seconds 20] [--baseline-seconds 12]
                                       [--latency 1.0] [--capacity 8] [--launcher slurm|local]

Each stand-in runs ``--max-num-seqs CAPACITY --fake-latency LATENCY``: at most CAPACITY requests at once, each taking
``LATENCY * (1 + k / CAPACITY)`` with k others running (about ``CAPACITY / (2 * LATENCY)`` requests/s when full).
The run sizes its client from the same ``--max-num-seqs`` (the planner's capacity): ``sized``. The same run with the
plan's sizing removed (a plan as compiled before the sizing: Data Designer's default of 4 requests in flight) is
``dd_default``. The defaults keep the whole rate at or below ~17 requests/s, so that the client's ~11 ms of CPU per
request leaves the 2 CPUs of the benchmark machine far from saturated: what is measured is how well the client keeps
the replicas busy, not how fast a CPU is.

Rate: the chat completions the stand-ins logged, in completion order, with the first and last 15 % dropped (Data
Designer's health probe, the ramp-up and the drain); the least-squares slope of their count over their time.

``--launcher local`` runs the node side with ``ddslurm-runtime generate --launcher local`` outside Slurm (the same
controller with plain processes for steps), for a machine without the cluster.

Prints one JSON line per replica count (``ratio`` = the run's rate / the baseline's, ``sized`` and ``dd_default``;
the ``max_parallel_requests`` the client logged; the machine's busy CPUs during each run), then a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from _cpu import busy_seconds
from _runs import scratch, unsized

from fake_vllm.testing import start_server

if TYPE_CHECKING:
    pass

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOAL = 0.9
TRIM = 0.15  # of the completions, dropped at each end of a run
RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {values: [sea, sky, salt, stone]}}
  - {name: text, column_type: llm-text, model_alias: gen, prompt: "Write one sentence about {{ topic }}."}
"""
BODY = {"model": "gen", "messages": [{"role": "user", "content": "Write one sentence about sea."}]}


@dataclass(frozen=True)
class Measured:
    rate: float
    completions: int
    window_s: float
    busy_cpus: float | None


def steady_rate(times: list[float]) -> tuple[float, float]:
    """(requests/s, seconds of the window) from completion times: the slope of the completion count over time,
    least squares, after dropping the first and last ``TRIM`` of the completions."""
    times = sorted(times)
    cut = int(len(times) * TRIM)
    window = times[cut : len(times) - cut]
    if len(window) < 3 or window[-1] <= window[0]:
        raise RuntimeError(f"too few completions to measure a rate ({len(times)})")
    mean_t = statistics.fmean(window)
    mean_i = (len(window) - 1) / 2
    cov = sum((t - mean_t) * (i - mean_i) for i, t in enumerate(window))
    var = sum((t - mean_t) ** 2 for t in window)
    return cov / var, window[-1] - window[0]


def completions(logs: list[Path]) -> list[float]:
    """Completion times of the successful chat requests in the stand-ins' request logs."""
    times = []
    for log in logs:
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if entry["path"] == "/v1/chat/completions" and entry["status"] == 200:
                times.append(float(entry["time"]))
    return times


def _measure(logs: Callable[[], list[Path]], action: Callable[[], Any]) -> tuple[Measured, Any]:
    busy, started = busy_seconds(), time.monotonic()
    result = action()
    seconds = time.monotonic() - started
    busy_end = busy_seconds()
    times = completions(logs())
    rate, window = steady_rate(times)
    cpus = None if busy is None or busy_end is None else round((busy_end - busy) / seconds, 2)
    return Measured(rate, len(times), window, cpus), result


# --- baseline: a plain load generator against stand-ins ------------------------------------------------------


async def _load(urls: list[str], per_replica: int, seconds: float) -> int:
    """``per_replica`` workers per replica, each sending one request after the other until ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    done = 0
    limits = httpx.Limits(max_connections=len(urls) * per_replica, max_keepalive_connections=len(urls) * per_replica)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker(url: str) -> None:
            nonlocal done
            while time.monotonic() < deadline:
                response = await client.post(f"{url}/chat/completions", json=BODY)
                response.raise_for_status()
                done += 1

        await asyncio.gather(*(worker(url) for url in urls for _ in range(per_replica)))
    return done


def baseline(replicas: int, args: argparse.Namespace, root: Path) -> Measured:
    logs = [root / f"baseline-{replicas}-{i}.jsonl" for i in range(replicas)]
    with ExitStack() as stack:
        servers = [
            stack.enter_context(start_server("gen", args=[*_stand_in_args(args), "--fake-request-log", str(log)]))
            for log in logs
        ]
        urls = [s.base_url for s in servers]
        measured, _ = _measure(lambda: logs, lambda: asyncio.run(_load(urls, args.capacity, args.baseline_seconds)))
    return measured


def _stand_in_args(args: argparse.Namespace) -> list[str]:
    return ["--max-num-seqs", str(args.capacity), "--fake-latency", str(args.latency)]


# --- the runtime path: a real run ----------------------------------------------------------------------------


def _files(root: Path, replicas: int, records: int, args: argparse.Namespace) -> tuple[Path, Path, dict[str, str]]:
    """Run file, recipe, empty Data Designer home and profile; the profile's ``vllm`` is a wrapper that gives each
    stand-in process its own request log."""
    root.mkdir(parents=True)
    (root / "dd-home").mkdir()
    (root / "dd-home" / "model_providers.yaml").write_text("providers: []\n")
    (root / "recipe.yaml").write_text(RECIPE)
    (root / "logs").mkdir()
    wrapper = root / "vllm"
    wrapper.write_text(
        f'#!/bin/sh\nFAKE_VLLM_REQUEST_LOG="{root}/logs/requests-$$.jsonl" exec "{BIN / "fake-vllm"}" "$@"\n'
    )
    wrapper.chmod(0o755)
    extra = json.dumps(_stand_in_args(args))
    run = root / "run.yaml"
    run.write_text(
        f"name: bench-client-path\nrecipe: recipe.yaml\nnum_records: {records}\nshards: 1\nbuffer_size: {records}\n"
        f"deployments:\n- model_alias: gen\n  model: bench/gen\n  replicas: {replicas}\n"
        f"  server: {{cpus: 1, startup_timeout: 120, extra_args: {extra}}}\n"
        "submission: {time_limit: '00:10:00', cpus: 1, memory: 4G}\nclient_retries: 0\n"
    )
    profile = root / "profile.yaml"
    profile.write_text(
        f"name: bench\nworkspace: {root / 'work'}\npython_env: {REPO / '.venv'}\npartition: gpu\n"
        f"cpu_partition: cpu\ngpus_per_node: 4\nvllm_executable: {wrapper}\n"
    )
    env = {**os.environ, "DATA_DESIGNER_HOME": str(root / "dd-home")}
    return run, profile, env


def _wait_slurm(job_id: str, env: Mapping[str, str], timeout: float) -> None:
    """Until the job (its teardown included) has left the queue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=env, check=False)
        if out.returncode == 0 and not out.stdout.strip():
            return
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=env, check=False)
    raise RuntimeError(f"job {job_id} did not finish within {timeout:.0f} s")


def runtime_run(replicas: int, records: int, mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from ddslurm.config import AttemptRecord, read_json
    from ddslurm.launcher import Slurm, prepare, submit_shards, write_run_dir

    run, profile, env = _files(root, replicas, records, args)
    # Data Designer's validation of this fixed recipe (a subprocess of a few seconds) is left out to save time.
    prepared = prepare(run, profile, env, datetime.now(UTC))
    if mode == "dd_default":
        prepared = unsized(prepared)
    write_run_dir(prepared)
    layout = prepared.layout
    timeout = 120 + 4 * records / max(1.0, replicas)

    def go() -> None:
        if args.launcher == "slurm":
            [job] = submit_shards(layout, prepared.plan, [0], Slurm(env=env), env, datetime.now(UTC))
            _wait_slurm(job, env, timeout)
            return
        node_env = {k: v for k, v in env.items() if not k.startswith("SLURM")}
        node_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(replicas))
        argv = [str(BIN / "ddslurm-runtime"), "generate", "--run-dir", str(layout.root), "--shard", "0"]
        argv += ["--job-id", f"local-{replicas}-{mode}", "--launcher", "local", "--grace", "3"]
        subprocess.run(argv, env=node_env, capture_output=True, check=False, timeout=timeout)

    measured, _ = _measure(lambda: sorted((root / "logs").glob("requests-*.jsonl")), go)
    [attempt] = sorted(layout.shard(0).attempts.glob("attempt-*"))
    record = read_json(attempt / "attempt.json", AttemptRecord)
    if record.state != "succeeded":
        raise RuntimeError(f"{mode} with {replicas} replica(s): {record.state} {record.reason}: {record.message}")
    events = [json.loads(line) for line in (attempt / "client.log").read_text().splitlines()]
    generating = next(e for e in events if e["event"] == "attempt.generating")
    return {"measured": measured, "max_parallel_requests": generating["max_parallel_requests"]["gen"]}


def _records(rate: float, args: argparse.Namespace) -> int:
    """Records (one request each) for about ``args.seconds`` of generation at ``rate``."""
    seconds: float = args.seconds
    return max(30, math.ceil(rate * seconds))


def measure(replicas: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    base = baseline(replicas, args, root)
    # The expected rates only size the runs. With Data Designer's 4 requests in flight, spread over the replicas,
    # each takes latency * (1 + k / capacity) with k others running on its replica.
    others = math.ceil(4 / replicas) - 1
    expected = {"sized": base.rate, "dd_default": min(base.rate, 4 / (args.latency * (1 + others / args.capacity)))}
    runs = {
        mode: runtime_run(replicas, _records(expected[mode], args), mode, args, root / f"{mode}-{replicas}")
        for mode in ("sized", "dd_default")
    }
    line: dict[str, Any] = {
        "bench": "client_path",
        "replicas": replicas,
        "capacity": args.capacity,
        "latency_s": args.latency,
        "launcher": args.launcher,
        "baseline": {
            "concurrency": replicas * args.capacity,
            "rps": round(base.rate, 2),
            "completions": base.completions,
            "window_s": round(base.window_s, 1),
            "busy_cpus": base.busy_cpus,
        },
    }
    for mode, got in runs.items():
        m: Measured = got["measured"]
        line[mode] = {
            "ratio": round(m.rate / base.rate, 3),
            "rps": round(m.rate, 2),
            "max_parallel_requests": got["max_parallel_requests"],
            "completions": m.completions,
            "window_s": round(m.window_s, 1),
            "busy_cpus": m.busy_cpus,
        }
    line["ratio"] = line["sized"]["ratio"]
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,2,4", help="comma-separated replica counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="about this much generation per run")
    parser.add_argument("--baseline-seconds", type=float, default=12.0, help="load generation per baseline")
    parser.add_argument("--latency", type=float, default=1.0, help="the stand-in's --fake-latency")
    parser.add_argument("--capacity", type=int, default=8, help="the stand-in's --max-num-seqs")
    default_launcher = "slurm" if shutil.which("sbatch") else "local"
    parser.add_argument("--launcher", choices=("slurm", "local"), default=default_launcher)
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed to stderr)")
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",") if n.strip()]
    started = time.monotonic()
    lines = []
    with scratch("ddslurm-bench-client-path-", args.keep) as root:
        for replicas in counts:
            line = measure(replicas, args, root)
            lines.append(line)
            print(json.dumps(line), flush=True)
    summary = {
        "bench": "client_path",
        "summary": True,
        "goal": GOAL,
        "sized": {str(line["replicas"]): line["sized"]["ratio"] for line in lines},
        "dd_default": {str(line["replicas"]): line["dd_default"]["ratio"] for line in lines},
        "meets_goal": all(line["sized"]["ratio"] >= GOAL for line in lines),
        "launcher": args.launcher,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
