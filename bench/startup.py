"""The runtime's own start-up: from the job's start to the first request reaching a replica, less the model load.

A run with one local deployment (1 and 2 replicas; 2 are behind the balancing proxy) and one LLM column is submitted
to the local Slurm cluster as ``ddslurm submit`` does it (``launcher.prepare`` + ``submit_shards``). The stand-ins
load for ``--startup-delay`` seconds (``--fake-startup-delay``): that is the model's, not ours, and is subtracted.
Neither is the scheduler's time from sbatch to the job's start.

    overhead = first request at a replica - job start - startup delay

Job start: sacct's Start (whole seconds; the job started within the second after it, so its middle is taken: the
figures carry +-0.5 s). Every other time comes from the runtime's own logs (JSON lines with UTC times: the
controller's in the job's slurm output, the client's ``client.log``), Data Designer's log (``client.out``, whole
seconds) and the stand-ins' request logs (the time each request got a slot). The breakdown:

- ``controller``: job start -> the controller's first event (the batch step's Python, its imports, the inputs'
  checks, the attempt record);
- ``launch``: -> every server and proxy step launched (``srun`` is asynchronous: the steps start meanwhile);
- ``servers``: -> every replica ready, less the startup delay (``srun`` step start, the server's own start-up,
  the readiness polling; ``vllm --version`` is asked meanwhile);
- ``proxy``: -> the proxy ready and the endpoints written (``serving.ready``);
- ``client``: -> the client's first event (it was started at the beginning and imported Data Designer during the
  load; here it reads the endpoints file and its inputs);
- ``engine``: -> Data Designer's first request (``create()``'s set-up: config, validation, the DAG; its first request
  is its health check of the model);
- ``generation`` (not in the overhead): -> the first request of the generation itself (the health checks, the seed
  and the samplers).

    uv run python bench/startup.py [--replicas 1,2] [--repeat 3] [--startup-delay 5]

Prints one JSON line per run and a summary line (medians per replica count). The 2 CPUs of the benchmark machine
are shared with other sessions: each line says how busy they were.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _cpu import busy_seconds
from _runs import epoch, json_lines, run_root, scratch, wait_jobs, write_profile

GOAL_S = 5.0
RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {values: [sea, sky, salt, stone]}}
  - {name: text, column_type: llm-text, model_alias: gen, prompt: "Write one sentence about {{ topic }}."}
"""
GENERATION = "Write one sentence"
"""In the generation's prompts only (the health check asks something else): ``--fake-log-match`` tags them."""
PIECES = ("controller", "launch", "servers", "proxy", "client", "engine")


def _files(root: Path, replicas: int, args: argparse.Namespace) -> tuple[Path, Path, dict[str, str]]:
    wrapper = run_root(root, RECIPE, log_env=f'FAKE_VLLM_LOG_MATCH="{GENERATION}" ')
    extra = json.dumps(
        ["--max-num-seqs", "8", "--fake-latency", "0.2", "--fake-startup-delay", str(args.startup_delay)]
    )
    run = root / "run.yaml"
    run.write_text(
        "name: bench-startup\nrecipe: recipe.yaml\nnum_records: 8\nshards: 1\nbuffer_size: 8\n"
        f"deployments:\n- model_alias: gen\n  model: bench/gen\n  replicas: {replicas}\n"
        f"  server: {{cpus: 1, startup_timeout: 120, extra_args: {extra}}}\n"
        "submission: {time_limit: '00:10:00', cpus: 1, memory: 4G}\nclient_retries: 0\n"
    )
    profile = write_profile(root, wrapper)
    return run, profile, {**os.environ, "DATA_DESIGNER_HOME": str(root / "dd-home")}


def _start(job: str, env: Mapping[str, str]) -> float:
    """The job's start (sacct, whole seconds: the middle of that second)."""
    for _ in range(20):
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "--format=Start"], capture_output=True,
                             text=True, env=env, check=True).stdout.split()  # fmt: skip
        if out and out[0] not in ("Unknown", "None"):
            return epoch(out[0]) + 0.5
        time.sleep(0.5)
    raise RuntimeError(f"no start time for job {job}")


def run_once(replicas: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from ddslurm.launcher import Slurm, prepare, submit_shards, write_run_dir

    run, profile, env = _files(root, replicas, args)
    prepared = prepare(run, profile, env, datetime.now(UTC))
    write_run_dir(prepared)
    layout = prepared.layout
    busy0, t0 = busy_seconds(), time.monotonic()
    [job] = submit_shards(layout, prepared.plan, [0], Slurm(env=env), env, datetime.now(UTC))
    wait_jobs([job], env, 300)
    wall = time.monotonic() - t0
    busy1 = busy_seconds()
    [attempt] = sorted(layout.shard(0).attempts.glob("attempt-*"))
    record = json.loads((attempt / "attempt.json").read_text())
    if record["state"] != "succeeded":
        raise RuntimeError(f"{replicas} replica(s): {record['state']} {record.get('message')} ({root})")
    [slurm_out] = sorted((layout.root / "logs").glob("slurm-*.out"))
    ctl = json_lines(slurm_out)

    def at(event: str, last: bool = False) -> float:
        times = [epoch(e["timestamp"]) for e in ctl if e.get("event") == event]
        return (max if last else min)(times)

    started = _start(job, env)
    first_event = epoch(ctl[0]["timestamp"])
    launched = max(at("server.started", last=True), at("proxy.started") if replicas > 1 else 0.0)
    servers_ready = at("server.ready", last=True)
    serving_ready = at("serving.ready")
    generating = min(
        epoch(e["timestamp"]) for e in json_lines(attempt / "client.log") if e["event"] == "attempt.generating"
    )
    chat = [
        json.loads(line)
        for log in (root / "logs").glob("requests-*.jsonl")
        for line in log.read_text().splitlines()
        if '"/v1/chat/completions"' in line
    ]
    first = min(float(e["admitted"]) for e in chat if e.get("admitted") is not None)
    first_generation = min(float(e["admitted"]) for e in chat if e.get("match") == GENERATION)
    delay = args.startup_delay
    pieces = {
        "controller": first_event - started,
        "launch": launched - first_event,
        "servers": servers_ready - launched - delay,
        "proxy": serving_ready - servers_ready,
        "client": generating - serving_ready,
        "engine": first - generating,
    }
    return {
        "bench": "startup",
        "replicas": replicas,
        "overhead_s": round(first - started - delay, 2),
        "pieces_s": {k: round(v, 2) for k, v in pieces.items()},
        "generation_s": round(first_generation - first, 2),
        "to_generation_s": round(first_generation - started - delay, 2),
        "startup_delay_s": delay,
        "wall_s": round(wall, 1),
        "busy_cpus": None if busy0 is None or busy1 is None else round((busy1 - busy0) / wall, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per replica count")
    parser.add_argument("--startup-delay", type=float, default=5.0, help="the stand-ins' --fake-startup-delay")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed to stderr)")
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",") if n.strip()]
    started = time.monotonic()
    lines: list[dict[str, Any]] = []
    with scratch("ddslurm-bench-startup-", args.keep) as root:
        for i in range(args.repeat):
            for replicas in counts:
                line = run_once(replicas, args, root / f"r{replicas}-{i}")
                lines.append(line)
                print(json.dumps(line), flush=True)
    medians: dict[str, Any] = {}
    for replicas in counts:
        mine = [ln for ln in lines if ln["replicas"] == replicas]
        medians[str(replicas)] = {
            "overhead_s": round(statistics.median(ln["overhead_s"] for ln in mine), 2),
            "pieces_s": {p: round(statistics.median(ln["pieces_s"][p] for ln in mine), 2) for p in PIECES},
            "to_generation_s": round(statistics.median(ln["to_generation_s"] for ln in mine), 2),
        }
    summary = {
        "bench": "startup",
        "summary": True,
        "goal_s": GOAL_S,
        "median": medians,
        "meets_goal": all(m["overhead_s"] < GOAL_S for m in medians.values()),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
