"""``ddslurm-runtime generate``: the array task. Begins the attempt, starts model servers and proxies as steps,
runs the client step, watches and tears everything down; with ``--pool``, a pulling allocation that claims shards
until none is left (:mod:`ddslurm.runtime.cli` parses the command line)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

import httpx

from ddslurm.config import RunLayout, expand_ranges, read_plan
from ddslurm.runtime._attempt import AttemptRunner
from ddslurm.runtime._attempt_record import EXIT_USAGE
from ddslurm.runtime._controller import Controller
from ddslurm.runtime._engine import run_engine
from ddslurm.runtime._inputs import load_inputs, stage_inputs
from ddslurm.runtime._log import logger_factory, new_logger
from ddslurm.runtime._peer_transport import own_peer_transport
from ddslurm.runtime._steps import LocalLauncher, SrunLauncher, StepLauncher
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._workers import ClaimPool, ShardSource


def _int_from(value: str | None, what: str) -> int:
    if value is None or not value.strip().isdigit():
        raise SystemExit(f"ddslurm-runtime: {what} is required (got {value!r})")
    return int(value)


def _launcher(kind: str, env: os._Environ[str]) -> StepLauncher:
    job_id = env.get("SLURM_JOB_ID", "")
    if kind == "srun" or (kind == "auto" and job_id and shutil.which("srun")):
        return SrunLauncher(
            job_id, array_job_id=env.get("SLURM_ARRAY_JOB_ID"), array_task_id=env.get("SLURM_ARRAY_TASK_ID")
        )
    return LocalLauncher()


def cmd_generate(args: argparse.Namespace) -> int:
    env = os.environ
    if args.pool is None:
        shard = args.shard if args.shard is not None else _int_from(env.get("SLURM_ARRAY_TASK_ID"), "--shard")
    job_id = args.job_id or env.get("SLURM_JOB_ID")
    if not job_id:
        print("ddslurm-runtime: --job-id is required outside Slurm", file=sys.stderr)
        return EXIT_USAGE
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    layout = RunLayout(args.run_dir.resolve())
    stop = StopSignal()

    def on_signal(signum: int, _: FrameType | None) -> None:
        stop.set("time_limit" if signum == signal.SIGUSR1 else signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    inputs = load_inputs(layout, plan_sha256=args.plan_sha256)  # an InputsError: ``cli.failed``
    try:
        inputs = stage_inputs(inputs, args.stage)
    except ValueError as exc:
        print(f"ddslurm-runtime: --stage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.stage == 1 and args.pool is None:
        print("ddslurm-runtime: --stage 1 runs pulling allocations only (--pool)", file=sys.stderr)
        return EXIT_USAGE
    make_logger = logger_factory(layout.run_id, "controller")
    runner = AttemptRunner(layout, engine=run_engine, env=env, make_logger=make_logger, stage=args.stage)
    # The probes' client: each new connection proved this user's listener's; only this allocation's listeners,
    # never through a proxy the environment names.
    with httpx.Client(timeout=5.0, transport=own_peer_transport(), trust_env=False) as http:
        controller = Controller(
            runner,
            launcher=_launcher(args.launcher, env),
            env=dict(env),
            runtime_exe=Path(sys.executable).parent / "ddslurm-runtime",
            run_dir=layout.root,
            logger=new_logger(sys.stderr.buffer, component="controller", run_id=layout.run_id),
            http=http,
            stop=stop,
            grace=args.grace,
            health_interval=args.health_interval,
            unhealthy_limit=args.unhealthy_limit,
        )
        restart = env.get("SLURM_RESTART_COUNT", "0")
        source: ShardSource | int = (
            shard if args.pool is None else _pool(layout, args.pool, job_id, node, env, args.stage)
        )
        return controller.run(inputs, source, job_id, node, int(restart) if restart.isdigit() else 0)


def _pool(
    layout: RunLayout, spec: str, job_id: str, node: str, env: Mapping[str, str], stage: int | None = None
) -> ClaimPool:
    try:
        shards = expand_ranges(spec, below=len(read_plan(layout.plan).shards))
    except ValueError as exc:
        raise SystemExit(f"ddslurm-runtime: --pool: {exc}") from exc
    task = env.get("SLURM_ARRAY_TASK_ID", "0")
    return ClaimPool(
        layout,
        shards,
        array_job_id=env.get("SLURM_ARRAY_JOB_ID") or job_id,
        task=int(task) if task.isdigit() else 0,
        job_id=job_id,
        node=node,
        clock=lambda: datetime.now(UTC).isoformat(),
        stage=stage,
    )
