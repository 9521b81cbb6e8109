"""GPU-busy fraction: of the GPU-seconds a mixed run's generation jobs held, how many its servers spent working.

A mixed recipe (examples/mixed/recipe.yaml: a local ``generator`` deployment, a slow hosted ``judge``) is submitted
to the local Slurm cluster as ``ddslurm submit`` does it (``launcher.prepare`` + ``submit_shards``), at several shard
counts and in several *layouts* (run-file overrides, :data:`LAYOUTS`):

- ``anchor``: what a run did before pulling allocations, client sizing and stages: one allocation (servers) per
  shard (``allocations: SHARDS``, ``client_workers: 1``, ``stages: single``) and Data Designer's default
  ``max_parallel_requests`` (4);
- ``single``: the defaults in one stage (``stages: single``): the hosted judge runs in the GPU allocation;
- ``auto``: the defaults (``allocations``/``client_workers`` auto, ``max_parallel_requests`` sized by the plan,
  ``stages: auto``: the judge in a CPU allocation after the GPU stage, whose GPU-seconds are none);
- ``auto`` is planned by the cost model (``ddslurm.planner``) with its stated defaults: each run has a workspace
  of its own, with no facts;
- ``facts``: the defaults again, planned with the facts the run before it in this benchmark recorded (every run
  records its facts, ``ddslurm.launcher.record_facts``): list it after ``auto`` to plan each shard count with the
  facts of the same recipe and model measured at that count; a plan equal to one already run is measured once;
- ``alloc1``: the defaults with ``allocations: 1``: one allocation, its servers kept warm across every shard;
- ``alloc1w1``: ``alloc1`` with ``client_workers: 1`` (one client keeps the replicas' whole capacity in flight);
- ``budget``: the run file states a GPU budget instead of a shape (``gpus:`` the ``--replicas`` x ``--tp`` GPUs,
  ``replicas: auto``): the cost model picks the generator's replicas too, planned with its stated defaults;
  ``budgetfacts``: the same, planned with the facts the run before it recorded (facts are per model shape, not per
  replica count: list it after ``auto`` or ``budget``);
- ``twonode``: ``alloc1`` with one generator replica over both GPU nodes (``tensor_parallel: 4,
  pipeline_parallel: 2``: a leader on n1, a headless follower on n2, 8 GPUs behind one API) instead of
  ``--replicas`` one-node replicas.

A layout is a name, run-file lines, whether the plan keeps its client sizing and, optionally, the generator's
shape, so another one (``stages: auto``) is one more entry.

Allocated: for each generation job, its elapsed time (sacct Start..End) x its GPUs (sacct AllocTRES gres/gpu).
Busy: for each replica (a stand-in, ``--fake-request-log`` with the time each request got a running slot and the time
it ended; a replica over two nodes logs on its leader, its follower serves no requests), the integral over time of
min(running, capacity) / capacity, times its GPUs (tensor x pipeline x data parallel, on all its nodes).

The rest is split per job, from the controller's log (the job's slurm output), the attempts' records, the hosted
judge's request log (``--fake-log-match`` tags each request with its record, so with its shard and job) and the
replicas' request logs. Each idle moment counts once, in the first category that applies, in this order after
``first_request``: ``teardown``, ``tail``, ``sizing``, ``hosted_wait``, ``finish``, ``client``.

- ``startup``: job start -> every replica ready (``serving.ready``);
- ``first_request``: ready -> the job's first request (Data Designer's import and set-up not hidden by the load);
- ``sizing``: replicas idle while the job's clients had as many generator requests in flight as their
  ``max_parallel_requests`` allows (the client's limit, not the replicas', kept them from more);
- ``hosted_wait``: else, replicas idle while a hosted judge request of the job's shards was in flight (the client
  waited on the judge: its rows' next generator requests depend on nothing, so this is the row group's end);
- ``tail``: replicas idle while the job ran fewer clients than its ``client_workers`` (its pool was empty);
- ``client``: the remaining idle capacity while the clients generated (gaps between an answer and the next
  request, the row group's start);
- ``finish``: after the job's last generator request, its clients still running, no judge request in flight (Data
  Designer's end of run: the last batch's write, its dataset statistics; the attempt's verify and publish);
- ``teardown``: the job's last attempt ended -> job end (the steps' stop, the batch step's exit, Slurm's end).

    uv run python bench/gpu_busy.py [--shards 2,4,8,16] [--layouts auto,facts] [--skip alloc1@4]
                                    [--records 384] [--buffer 32] [--replicas 2] [--tp 1] [--capacity 8]
                                    [--latency 1.0] [--judge-latency 0.5] [--startup-delay 5]
                                    [--time-limit 01:00:00]

Each line with a prediction (layouts the cost model chose) holds it (``predicted``: wall time, GPU-hours,
GPU-busy) and ``measured_over_predicted`` (wall time: the first job's start to the last job's end, CPU-stage jobs
included; GPU-hours allocated; GPU-busy), and ``facts_origin`` (``default``, ``run``). The summary's
``worst_prediction`` is the largest |measured / predicted - 1| of wall time and GPU-hours over the ``facts`` lines.

Prints one JSON line per (shards, layout) and a summary line; a layout whose plan is one already run at that shard
count (``alloc1`` at 2 shards is ``auto``) is reported with ``same_as``, not run again. Takes 7-8 minutes: an
allocation has to work for about a minute before 0.85 is within reach of a 5 s model load.

Everything shares the 2 CPUs of the benchmark machine (servers, proxies, several Data Designer clients, Slurm): the
fractions are measured in the same benchmark run and each JSON line says how busy the machine's CPUs were.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from _cpu import busy_seconds
from _runs import epoch, json_lines, run_root, scratch, unsized, wait_jobs, write_profile

from fake_vllm.testing import start_server

if TYPE_CHECKING:
    pass

MIXED = Path(__file__).resolve().parents[1] / "examples" / "mixed"
KEY_ENV = "DEMO_HOSTED_API_KEY"
GOAL = 0.85
"""GPU-busy of the default layout planned without facts (the cost model's stated defaults)."""
GOAL_LEARNED = 0.9
"""GPU-busy of the default layout planned with the facts of an earlier run (``facts``)."""
DD_DEFAULT = 4
"""Data Designer's default ``max_parallel_requests`` (what an unsized plan leaves the generator with)."""
SPLIT = ("startup", "first_request", "sizing", "hosted_wait", "tail", "client", "finish", "teardown")
MATCH = r"\(#(\d+)\)"
"""The record number the seed rows' questions carry (``... (#17)``): which shard a hosted request came from."""


@dataclass(frozen=True)
class Layout:
    name: str
    run_lines: str
    """Run-file lines appended to the base run file (``{shards}`` is replaced by the shard count, ``{gpus}`` by
    ``--replicas`` x ``--tp``)."""
    sized: bool = True
    """Whether the plan keeps its client sizing (``max_parallel_requests`` from the replicas' capacity)."""
    shape: str | None = None
    """The generator deployment's parallel fields (run-file lines) instead of ``--replicas`` and ``--tp``."""
    learned: bool = False
    """Planned with the facts an earlier run of this benchmark recorded (its workspace's ``facts.json``), not the
    cost model's stated defaults."""


TWO_NODES = "replicas: 1\n  tensor_parallel: 4\n  pipeline_parallel: 2\n"
"""One replica of 8 GPUs: on the local cluster's 4-GPU nodes, a leader on n1 and a follower on n2."""
PINNED = "replicas: {replicas}\n  tensor_parallel: {tp}\n"
"""The generator's shape as ``--replicas`` and ``--tp`` pin it."""
BUDGET = "replicas: auto\n  tensor_parallel: {tp}\n"
"""The generator's replicas chosen by the cost model within ``gpus:``."""
LAYOUTS = {
    "anchor": Layout("anchor", "allocations: {shards}\nclient_workers: 1\nstages: single\n", sized=False),
    "single": Layout("single", "stages: single\n"),
    "auto": Layout("auto", ""),
    "facts": Layout("facts", "", learned=True),
    "alloc1": Layout("alloc1", "allocations: 1\n"),
    "alloc1w1": Layout("alloc1w1", "allocations: 1\nclient_workers: 1\n"),
    "budget": Layout("budget", "gpus: {gpus}\n", shape=BUDGET),
    "budgetfacts": Layout("budgetfacts", "gpus: {gpus}\n", shape=BUDGET, learned=True),
    "twonode": Layout("twonode", "allocations: 1\n", shape=TWO_NODES),
}


# --- run files -----------------------------------------------------------------------------------------------


def _recipe() -> str:
    """The mixed example, with the generator's own ``max_parallel_requests`` taken out (a recipe that sets one
    keeps it; the point is what ddslurm chooses) and the seed file a local copy."""
    doc = yaml.safe_load((MIXED / "recipe.yaml").read_text())
    for model in doc["data_designer"]["model_configs"]:
        if model["alias"] == "generator":
            model["inference_parameters"].pop("max_parallel_requests", None)
    return yaml.safe_dump(doc, sort_keys=False)


def _seed(path: Path, rows: int) -> None:
    """The example's questions, repeated (and numbered) to ``rows`` rows, one per record."""
    with (MIXED / "questions.csv").open() as f:
        base = list(csv.DictReader(f))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["question", "tables"])
        writer.writeheader()
        for i in range(rows):
            row = base[i % len(base)]
            writer.writerow({"question": f"{row['question']} (#{i})", "tables": row["tables"]})


def _files(root: Path, shards: int, layout: Layout, args: argparse.Namespace, hosted_url: str) -> tuple[Path, Path]:
    providers = (
        f"providers:\n- name: demo-hosted\n  endpoint: {hosted_url}\n  provider_type: openai\n  api_key: {KEY_ENV}\n"
    )
    wrapper = run_root(root, _recipe(), providers)
    records = args.records
    _seed(root / "questions.csv", records)
    extra = json.dumps(
        [
            *("--max-num-seqs", str(args.capacity), "--fake-latency", str(args.latency)),
            *("--fake-startup-delay", str(args.startup_delay)),
        ]
    )
    shape = (layout.shape or PINNED).format(replicas=args.replicas, tp=args.tp)
    run = root / "run.yaml"
    run.write_text(
        f"name: bench-gpu-busy\nrecipe: recipe.yaml\nnum_records: {records}\nshards: {shards}\n"
        f"buffer_size: {args.buffer}\n"
        "deployments:\n- model_alias: generator\n  model: bench/gen\n  served_model_name: qwen3-8b\n"
        f"  {shape}"
        f"  server: {{cpus: 1, startup_timeout: 120, extra_args: {extra}}}\n"
        f"submission: {{time_limit: '{args.time_limit}', cpus: {args.replicas}, memory: 4G}}\nclient_retries: 0\n"
        + layout.run_lines.format(shards=shards, gpus=args.replicas * args.tp)
    )
    return run, write_profile(root, wrapper)


# --- measuring -----------------------------------------------------------------------------------------------


@dataclass
class Job:
    raw: str
    key: str
    """``array_task``, as in the slurm output's name."""
    start: float
    end: float
    gpus: int
    state: str
    replicas: list[list[tuple[float, float]]] = field(default_factory=list)
    """Each replica's requests as (got a slot, ended)."""
    ready: float | None = None
    workers: int = 1
    attempts: list[tuple[float, float]] = field(default_factory=list)
    judging: list[tuple[float, float]] = field(default_factory=list)
    """The hosted judge's requests for the job's shards."""


def _sacct(jobs: list[str], env: Mapping[str, str]) -> list[Job]:
    fmt = "--format=JobIDRaw,JobID,Start,End,AllocTRES,State"
    for _ in range(20):  # accounting lags the end of a job by a moment
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", ",".join(jobs), fmt], capture_output=True, text=True,
                             env=env, check=True).stdout  # fmt: skip
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        if rows and all(r[3] not in ("", "Unknown") for r in rows):
            break
        time.sleep(0.5)
    found = []
    for raw, key, start, end, tres, state in rows:
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        found.append(Job(raw, key, epoch(start), epoch(end), int(gpus.group(1)) if gpus else 0, state))
    return found


def _busy(requests: list[tuple[float, float]], capacity: int, lo: float = 0.0, hi: float = float("inf")) -> float:
    """Seconds-equivalent of a full replica within [lo, hi]: the integral of min(running, capacity) / capacity."""
    events = sorted([(max(a, lo), 1) for a, b in requests if b > lo and a < hi] +
                    [(min(b, hi), -1) for a, b in requests if b > lo and a < hi])  # fmt: skip
    total, running, last = 0.0, 0, 0.0
    for t, step in events:
        if running:
            total += (t - last) * min(running, capacity) / capacity
        running += step
        last = t
    return total


def _requests(log: Path) -> list[tuple[float, float, str | None]]:
    """A stand-in's answered chat requests: (got a slot, ended, the record number its prompt names)."""
    out = []
    for line in log.read_text().splitlines():
        e = json.loads(line)
        if e["path"] == "/v1/chat/completions" and e.get("admitted") is not None:
            out.append((float(e["admitted"]), float(e["time"]), e.get("match")))
    return out


def _split_generating(
    job: Job, first: float, last: float, capacity: int, tp: int, limit: int, split: dict[str, float]
) -> None:
    """The job's idle GPU-seconds from its first request to its end, by what its clients were doing (a sweep over
    every request's and attempt's start and end: the state is constant between two of them)."""
    events: list[tuple[float, str, int, int]] = []  # (time, kind, replica, +1/-1)
    for i, rep in enumerate(job.replicas):
        for a, b in rep:
            events += [(a, "gen", i, 1), (b, "gen", i, -1)]
    for a, b in job.judging:
        events += [(a, "judge", 0, 1), (b, "judge", 0, -1)]
    for a, b in job.attempts:
        events += [(a, "worker", 0, 1), (b, "worker", 0, -1)]
    events.sort()
    running = [0] * len(job.replicas)
    judging = workers = 0
    last_start = max((a for a, _ in job.attempts), default=first)
    last_end = max((b for _, b in job.attempts), default=last)
    events.append((job.end, "end", 0, 0))
    t_prev = events[0][0]
    for t, kind, i, step in events:
        lo, hi = max(t_prev, first), min(t, job.end)
        if hi > lo:
            used = sum(min(r, capacity) for r in running) / capacity * tp
            idle = (hi - lo) * (job.gpus - used)
            if lo >= last_end:
                split["teardown"] += idle
            elif workers < job.workers and lo >= last_start:
                split["tail"] += idle
            elif sum(running) >= workers * limit:
                split["sizing"] += idle
            elif judging:
                split["hosted_wait"] += idle
            elif lo >= last:
                split["finish"] += idle
            else:
                split["client"] += idle
        t_prev = t
        if kind == "gen":
            running[i] += step
        elif kind == "judge":
            judging += step
        else:
            workers += step


def analyse(
    run_dir: Path,
    logs: Path,
    hosted_log: Path,
    jobs: list[Job],
    replica: tuple[int, int],
    workers: int,
    firsts: list[int],
    limit: int,
) -> dict[str, Any]:
    """``replica``: the sequences one generator replica runs at once and its GPUs; ``firsts``: each shard's first
    record (the seed row, and so the ``(#N)`` its prompts carry); ``limit``: the generator's
    ``max_parallel_requests`` in each client."""
    from ddslurm.config import AttemptRecord, read_json

    capacity, tp = replica
    by_raw = {j.raw: j for j in jobs}
    for log in logs.glob("requests-*.jsonl"):
        job = by_raw.get(log.name.split("-")[1])
        reqs = [(a, b) for a, b, _ in _requests(log)]
        if job is not None and reqs:
            job.replicas.append(reqs)
    for job in jobs:
        events = json_lines(run_dir / "logs" / f"slurm-{job.key}.out")
        readies = [epoch(e["timestamp"]) for e in events if e.get("event") == "serving.ready"]
        job.ready = readies[0] if readies else None
        job.workers = workers
    shard_job: dict[int, Job] = {}
    # A two-stage run's GPU-stage attempts are under stage-0/; the final stage's (its CPU jobs', which send the
    # judge's requests) under attempts/, read last so that a shard's judge requests go to its CPU job.
    records = [*run_dir.glob("shards/shard-*/stage-0/attempts/attempt-*/attempt.json"),
               *run_dir.glob("shards/shard-*/attempts/attempt-*/attempt.json")]  # fmt: skip
    for record_path in records:
        record = read_json(record_path, AttemptRecord)
        job = by_raw.get(record_path.parent.name.removeprefix("attempt-"))
        if job is None or record.ended_at is None:
            continue
        job.attempts.append((epoch(record.started_at), epoch(record.ended_at)))
        shard_job[record.shard] = job
    lo, hi = min(j.start for j in jobs), max(j.end for j in jobs) + 1  # the hosted stand-in serves every run
    for a, b, match in _requests(hosted_log) if hosted_log.exists() else []:
        job = None if match is None else shard_job.get(bisect.bisect_right(firsts, int(match)) - 1)
        if lo <= a and b <= hi and job is not None:
            job.judging.append((a, b))

    split = dict.fromkeys(SPLIT, 0.0)
    allocated = busy = 0.0
    for job in jobs:
        elapsed = job.end - job.start
        allocated += elapsed * job.gpus
        reqs = [r for rep in job.replicas for r in rep]
        job_busy = sum(_busy(rep, capacity) for rep in job.replicas) * tp
        busy += job_busy
        if not reqs or job.ready is None:
            split["startup"] += elapsed * job.gpus - job_busy
            continue
        first, last = min(a for a, _ in reqs), max(b for _, b in reqs)
        ready = min(max(job.ready, job.start), first)
        split["startup"] += (ready - job.start) * job.gpus
        split["first_request"] += (first - ready) * job.gpus
        _split_generating(job, first, last, capacity, tp, limit, split)
    return {
        "fraction": round(busy / allocated, 3) if allocated else None,
        "gpu_s_allocated": round(allocated, 1),
        "gpu_s_busy": round(busy, 1),
        "rest": {k: round(v / allocated, 3) for k, v in split.items()} if allocated else {},
        "jobs": len(jobs),
        "model_loads": sum(len(j.replicas) for j in jobs),
        "job_seconds": [round(j.end - j.start) for j in jobs],
        "span_s": round(max(j.end for j in jobs) - min(j.start for j in jobs), 1),
        "judge_requests": sum(len(j.judging) for j in jobs),
    }


def run_layout(
    shards: int,
    layout: Layout,
    args: argparse.Namespace,
    root: Path,
    hosted: Any,
    hosted_log: Path,
    done: dict[tuple[Any, ...], dict[str, Any]],
    learned: Learned,
) -> dict[str, Any]:
    """One run of ``layout`` at ``shards`` shards; a layout whose plan is one already run (``done``) is not run
    again (at 2 shards, ``auto`` is one allocation: ``alloc1``). Every run's facts are recorded in its workspace
    (``learned``: the latest), and a ``learned`` layout plans with them."""
    from ddslurm.config import AttemptRecord, facts_path, read_json
    from ddslurm.launcher import Slurm, prepare, record_facts, submit_shards, write_run_dir
    from ddslurm.planner import parse_time_limit

    run, profile = _files(root, shards, layout, args, hosted.base_url)
    env = {**os.environ, "DATA_DESIGNER_HOME": str(root / "dd-home"), KEY_ENV: hosted.api_key}
    workspace = root / "work"
    if layout.learned:
        if learned.facts is None:
            raise RuntimeError(f"{layout.name}: no earlier run of this benchmark recorded facts (list auto first)")
        workspace.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(learned.facts, facts_path(workspace))
    prepared = prepare(run, profile, env, datetime.now(UTC))
    if not layout.sized:
        prepared = unsized(prepared)
    same = (
        prepared.plan.allocations,
        prepared.plan.client_workers,
        layout.sized,
        len(prepared.plan.stages),
        tuple((len(d.replicas), d.replica_gpus) for d in prepared.plan.serving.deployments)
        if prepared.plan.serving
        else (),
    )
    if same in done:
        # The same plan, so the same measurement; its prediction may differ (other facts).
        earlier = done[same]
        return {**earlier, "layout": layout.name, "same_as": earlier["layout"], **_versus(prepared.plan, earlier)}
    write_run_dir(prepared)
    plan, layout_dir = prepared.plan, prepared.layout
    busy0, t0 = busy_seconds(), time.monotonic()
    arrays = submit_shards(layout_dir, plan, [s.index for s in plan.shards], Slurm(env=env), env, datetime.now(UTC))
    wait_jobs(arrays, env, parse_time_limit(args.time_limit) * 60 + 300)
    wall = time.monotonic() - t0
    busy1 = busy_seconds()
    states = [read_json(p, AttemptRecord).state for p in layout_dir.root.glob("shards/*/attempts/*/attempt.json")]
    winners = len(list(layout_dir.root.glob("shards/*/winner.json")))
    if winners != shards:
        raise RuntimeError(f"{layout.name} at {shards} shards: {winners} winners; attempts {states} ({root})")
    jobs = _sacct(arrays, env)
    assert plan.serving is not None
    workers = plan.client_workers if plan.allocations else 1
    firsts = [sh.first_record for sh in plan.shards]
    generator = plan.serving.deployments[0]
    limit = generator.max_parallel_requests or DD_DEFAULT
    replica = (generator.capacity or args.capacity, generator.replica_gpus)
    got = analyse(layout_dir.root, root / "logs", hosted_log, jobs, replica, workers, firsts, limit)
    record_facts(workspace, layout_dir, Slurm(env=env))
    learned.facts = facts_path(workspace)
    done[same] = line = {
        "bench": "gpu_busy",
        "shards": shards,
        "layout": layout.name,
        "allocations": plan.allocations or shards,
        "replicas": len(generator.replicas),
        "client_workers": workers,
        "max_parallel_requests": limit,
        "nodes": plan.serving.nodes,
        "replica_gpus": generator.replica_gpus,
        **got,
        "wall_s": round(wall, 1),
        "busy_cpus": None if busy0 is None or busy1 is None else round((busy1 - busy0) / wall, 2),
    }
    line.update(_versus(plan, line))
    return line


@dataclass
class Learned:
    """The facts file of the latest run this benchmark measured (each run records its facts in its workspace)."""

    facts: Path | None = None


def _versus(plan: Any, measured: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's prediction beside the measurement: wall time (the first job's start to the last job's end),
    GPU-hours allocated and GPU-busy, each with measured / predicted; where the cost model's facts came from."""
    prediction = plan.prediction
    if prediction is None:
        return {}
    chosen = prediction.chosen
    pairs = {
        "wall_s": (chosen.wall_s, measured["span_s"]),
        "gpu_hours": (chosen.gpu_hours, measured["gpu_s_allocated"] / 3600),
        "gpu_busy": (chosen.gpu_busy, measured["fraction"]),
    }
    return {
        "predicted": {k: round(p, 4) for k, (p, _) in pairs.items()},
        "runners_up": [
            {
                "allocations": c.allocations,
                "replicas": list(c.replicas),
                "client_workers": c.client_workers,
                "wall_s": round(c.wall_s, 1),
                "gpu_hours": round(c.gpu_hours, 4),
                "gpu_busy": round(c.gpu_busy, 3),
            }
            for c in prediction.runners_up
        ],
        "measured_over_predicted": {k: round(m / p, 3) if p else None for k, (p, m) in pairs.items()},
        "facts_origin": sorted({f.origin for f in prediction.facts}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="2,4,8", help="comma-separated shard counts")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"of {', '.join(LAYOUTS)}")
    parser.add_argument("--records", type=int, default=960, help="records of each run (split evenly over its shards)")
    parser.add_argument("--buffer", type=int, default=32, help="buffer_size (records per batch)")
    parser.add_argument("--replicas", type=int, default=2, help="generator replicas per allocation")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica")
    parser.add_argument("--capacity", type=int, default=8, help="each replica's --max-num-seqs")
    parser.add_argument("--latency", type=float, default=1.0, help="the generator stand-in's --fake-latency")
    parser.add_argument("--judge-latency", type=float, default=0.5, help="the hosted judge's --fake-latency")
    parser.add_argument("--startup-delay", type=float, default=5.0, help="the generator's --fake-startup-delay")
    parser.add_argument(
        "--time-limit",
        default="01:00:00",
        help="submission.time_limit of each run (the planner keeps its allocations within 80 %% of it)",
    )
    parser.add_argument(
        "--skip",
        default="alloc1@4",
        help="LAYOUT@SHARDS pairs not to run (default alloc1@4: like alloc1@8, one allocation of 2 workers; saves a "
        "minute)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed to stderr)")
    args = parser.parse_args()
    counts = [int(n) for n in args.shards.split(",") if n.strip()]
    layouts = [LAYOUTS[n.strip()] for n in args.layouts.split(",") if n.strip()]
    started = time.monotonic()
    key = "sk-bench-" + os.urandom(8).hex()
    lines: list[dict[str, Any]] = []
    hosted_args = ["--served-model-name", "demo/judge-70b", "--fake-latency", str(args.judge_latency)]
    with ExitStack() as stack:
        root = stack.enter_context(scratch("ddslurm-bench-gpu-busy-", args.keep))
        log = root / "hosted.jsonl"
        hosted_args += ["--fake-log-match", MATCH, "--fake-request-log", str(log)]
        hosted = stack.enter_context(start_server("demo", args=hosted_args, api_key=key, log_path=root / "hosted.log"))
        learned = Learned()
        for shards in counts:
            done: dict[tuple[Any, ...], dict[str, Any]] = {}
            for layout in layouts:
                if f"{layout.name}@{shards}" in args.skip.split(","):
                    continue
                where = root / f"{layout.name}-{shards}"
                line = run_layout(shards, layout, args, where, _Hosted(hosted, key), log, done, learned)
                lines.append(line)
                print(json.dumps(line), flush=True)
    summary = {
        "bench": "gpu_busy",
        "summary": True,
        "goal": GOAL,
        "fraction": {f"{ln['layout']}@{ln['shards']}": ln["fraction"] for ln in lines},
        "meets_goal": all(
            ln["fraction"] >= (GOAL_LEARNED if ln["layout"] == "facts" else GOAL)
            for ln in lines
            if ln["layout"] in ("auto", "facts")
        ),
        "worst_prediction": max(
            (
                abs(r - 1)
                for ln in lines
                if ln["layout"] == "facts"
                for k, r in ln["measured_over_predicted"].items()
                if k != "gpu_busy" and r is not None
            ),
            default=None,
        ),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return 0


@dataclass(frozen=True)
class _Hosted:
    server: Any
    api_key: str

    @property
    def base_url(self) -> str:
        return str(self.server.base_url)


if __name__ == "__main__":
    raise SystemExit(main())
