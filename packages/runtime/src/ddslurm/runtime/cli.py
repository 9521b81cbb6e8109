"""``ddslurm-runtime``: what runs on compute nodes. Reads only the run directory's plan and snapshot.

    ddslurm-runtime generate --run-dir DIR [--shard N | --pool 0-9] [--stage 0|1] [--job-id ID]
                             [--launcher auto|srun|local]
        the array task: begin the attempt, start model servers and proxies as steps, run the client step,
        watch, tear everything down; with --pool, a pulling allocation: servers started once, shards of the pool
        claimed and generated (client_workers at a time) until none is left. --stage: a two-stage run's GPU
        stage (0) or CPU stage (1: a pulling allocation without servers over shards whose GPU stage is done)
    ddslurm-runtime client --run-dir DIR --shard N --attempt ID --endpoints FILE [--wait-endpoints CONTROLLER]
                           [--stage K]
        the Data Designer step (the only one that sees API keys); --wait-endpoints: started before its endpoints
        exist, it imports Data Designer and waits for FILE as long as its controller (PID:START:PIDNS) runs
    ddslurm-runtime proxy --listen HOST:PORT --upstream URL [--upstream URL ...]
        one endpoint in front of several replicas of a model
    ddslurm-runtime inspect
        at submit, in the profile's python_env: call a builder script, or check a recipe as the node will run it
        (Data Designer's validation, the plugins it uses, its columns); one JSON request on stdin, the answer on
        stdout (ddslurm.runtime._inspect)

Inside a Slurm array task the shard and job id come from ``SLURM_ARRAY_TASK_ID`` and ``SLURM_JOB_ID``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any

import httpx
import msgspec

from ddslurm.config import RunLayout, expand_ranges, read_plan
from ddslurm.runtime._attempt import EXIT_FAILED, AttemptRunner
from ddslurm.runtime._controller import Controller, controller_alive
from ddslurm.runtime._engine import engine_environment, local_token_names, preload_engine, run_engine
from ddslurm.runtime._inputs import Inputs, load_inputs
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._scratch import (
    SqueueJobs,
    Sweeper,
    own_scratch_owner,
    pid_alive,
    scratch_base,
    scratch_directory,
)
from ddslurm.runtime._steps import LocalLauncher, SrunLauncher, StepLauncher
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._workers import ClaimPool, ShardSource
from ddslurm.runtime.errors import RuntimeFailure

EXIT_USAGE = 64


def _int_from(value: str | None, what: str) -> int:
    if value is None or not value.strip().isdigit():
        raise SystemExit(f"ddslurm-runtime: {what} is required (got {value!r})")
    return int(value)


@contextmanager
def _engine_scratch(attempt: str, env: Mapping[str, str], log: Any) -> Iterator[Path]:
    """A per-process scratch home for Data Designer in the job's temporary directory, set up before anything
    imports it and removed however the step ends but SIGKILL; this user's stale ones on the node are swept first
    (rules in ``ddslurm.runtime._scratch``)."""
    base = scratch_base(env)
    _sweep_stale(base, env, uid=os.getuid(), host=socket.gethostname(), log=log)
    with scratch_directory(base, own_scratch_owner(env, attempt)) as scratch:
        home = scratch / "dd-home"
        os.environ.update(engine_environment(home))
        yield home


def _sweep_stale(base: Path, env: Mapping[str, str], *, uid: int, host: str, log: Any) -> None:
    """Remove this user's scratch directories under ``base`` whose creator and job are gone; never fails."""
    job = env.get("SLURM_JOB_ID", "")
    sweeper = Sweeper(
        uid=uid,
        host=host,
        job_id=job if job.isdigit() else None,
        pid_alive=pid_alive,
        jobs_running=SqueueJobs(),
        clock=lambda: datetime.now(UTC),
    )
    try:
        report = sweeper.sweep(base)
    except Exception as exc:  # node hygiene never fails an attempt
        log.warning("scratch.sweep_failed", base=str(base), error=repr(exc))
        return
    if report.error:
        log.warning("scratch.sweep_skipped", base=str(base), why=report.error)
    for entry in report.entries:
        if entry.action == "removed" or entry.why.startswith("could not"):
            log.info(f"scratch.{entry.action}", path=str(entry.path), why=entry.why)


def _logger_factory(layout: RunLayout, component: str) -> Any:
    def make(stream: IO[bytes]) -> Any:
        return new_logger(stream, sys.stderr.buffer, component=component, run_id=layout.run_id)

    return make


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
    try:
        inputs = load_inputs(layout, plan_sha256=args.plan_sha256)
    except RuntimeFailure as exc:
        print(f"ddslurm-runtime: {exc.reason}: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    try:
        inputs = stage_inputs(inputs, args.stage)
    except ValueError as exc:
        print(f"ddslurm-runtime: --stage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.stage == 1 and args.pool is None:
        print("ddslurm-runtime: --stage 1 runs pulling allocations only (--pool)", file=sys.stderr)
        return EXIT_USAGE
    make_logger = _logger_factory(layout, "controller")
    runner = AttemptRunner(layout, engine=run_engine, env=env, make_logger=make_logger, stage=args.stage)
    with httpx.Client(timeout=5.0) as http:
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


def stage_inputs(inputs: Inputs, stage: int | None) -> Inputs:
    """The inputs as a stage of a two-stage run sees them: the CPU stage (1) runs no model server and
    ``cpu_stage_workers`` client steps at once per allocation, sharing its CPUs. ValueError for a stage the plan
    does not have."""
    plan = inputs.plan
    if stage is None:
        return inputs
    if len(plan.stages) < 2 or stage not in (0, 1):
        raise ValueError(f"stage {stage} does not exist: the run has {max(1, len(plan.stages))} stage(s)")
    if stage == 0:
        return inputs
    cpus = plan.cpu_stage.cpus_per_task if plan.cpu_stage is not None else plan.client_cpus
    workers = max(1, plan.cpu_stage_workers)
    cpu_plan = msgspec.structs.replace(plan, serving=None, client_workers=workers, client_cpus=max(1, cpus // workers))
    return dataclasses.replace(inputs, plan=cpu_plan)


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


def _await_endpoints(
    path: Path,
    alive: Callable[[], bool],
    *,
    poll: float = 0.05,
    check_every: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Started before its endpoints exist (the model load, or a pulling allocation's spare client, which waits for
    a worker's shard to end however long that shard takes): import Data Designer meanwhile, then wait for the
    endpoints file, as long as the controller that started this step runs (``alive``, asked every
    ``check_every`` seconds). No deadline of its own: the controller stops this step when serving fails or it no
    longer needs it."""
    preload_engine()
    next_check = time.monotonic()
    while not path.exists():
        if time.monotonic() >= next_check:
            if not alive():
                raise SystemExit(f"ddslurm-runtime: the controller ended before {path} appeared")
            next_check = time.monotonic() + check_every
        sleep(poll)


def client_inputs(inputs: Inputs) -> Inputs:
    """The client's view of the inputs: the local providers' token variables count among the run's secrets, so
    the client refuses to start without the attempt's token and scans the attempt's files for it before it
    publishes (the plan's own ``secret_env`` names only what the submitting shell exports)."""
    names = local_token_names(inputs.snapshot)
    if not names:
        return inputs
    plan = msgspec.structs.replace(inputs.plan, secret_env=tuple(sorted({*inputs.plan.secret_env, *names})))
    return dataclasses.replace(inputs, plan=plan)


def cmd_client(args: argparse.Namespace) -> int:
    layout = RunLayout(args.run_dir.resolve())
    log = new_logger(sys.stderr.buffer, component="client", run_id=layout.run_id)
    with _engine_scratch(args.attempt, os.environ, log) as home:
        alive: Callable[[], bool] | None = None  # set: started before its endpoints exist
        if args.endpoints and args.wait_endpoints is not None:
            try:
                alive = controller_alive(args.wait_endpoints)
            except ValueError as exc:
                print(f"ddslurm-runtime: --wait-endpoints: {exc}", file=sys.stderr)
                return EXIT_USAGE
        try:  # before the endpoints: reading and checking the inputs overlaps the model load or the drain
            inputs = client_inputs(stage_inputs(load_inputs(layout, plan_sha256=args.plan_sha256), args.stage))
        except RuntimeFailure as exc:
            print(f"ddslurm-runtime: {exc.reason}: {exc.message}", file=sys.stderr)
            return EXIT_FAILED
        except ValueError as exc:
            print(f"ddslurm-runtime: --stage: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if alive is not None:
            _await_endpoints(args.endpoints, alive)
        endpoints = msgspec.json.decode(args.endpoints.read_bytes(), type=dict[str, str]) if args.endpoints else {}
        runner = AttemptRunner(
            layout,
            engine=run_engine,
            env=os.environ,
            scratch_home=home,
            make_logger=_logger_factory(layout, "client"),
            stage=args.stage,
        )
        began = runner.resume(args.shard, args.attempt)
        return runner.generate(inputs, began, endpoints, resume_own=args.resume)


def raise_open_files_limit() -> int:
    """Raise the soft open-file limit to the hard one (each request in flight holds a connection: one in the client,
    two in the proxy; sized clients keep hundreds in flight, more than a soft limit of 1024 allows). Returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            return soft
    return hard


def main(argv: list[str] | None = None) -> int:
    raise_open_files_limit()
    parser = argparse.ArgumentParser(
        prog="ddslurm-runtime", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="run one attempt of one shard (the array task)")
    gen.add_argument("--run-dir", type=Path, required=True)
    gen.add_argument("--plan-sha256", default=None, help="the submitted plan's digest (the batch script's)")
    gen.add_argument("--shard", type=int, default=None)
    gen.add_argument("--pool", default=None, help="a pulling allocation's shards, e.g. 0-9,12")
    gen.add_argument("--job-id", default=None)
    gen.add_argument(
        "--stage", type=int, choices=[0, 1], default=None, help="a two-stage run's GPU (0) or CPU (1) stage"
    )
    gen.add_argument("--launcher", choices=["auto", "srun", "local"], default="auto")
    gen.add_argument("--grace", type=float, default=15.0, help="seconds between TERM and KILL at teardown")
    gen.add_argument("--health-interval", type=float, default=5.0, help="seconds between health checks")
    gen.add_argument("--unhealthy-limit", type=int, default=6, help="failed checks in a row that stop a replica")
    client = sub.add_parser("client", help="the Data Designer step of an attempt")
    client.add_argument("--run-dir", type=Path, required=True)
    client.add_argument("--plan-sha256", default=None, help="the plan's digest, as the controller checked it")
    client.add_argument("--shard", type=int, required=True)
    client.add_argument("--attempt", required=True)
    client.add_argument("--endpoints", type=Path, default=None)
    client.add_argument(
        "--wait-endpoints",
        default=None,
        metavar="CONTROLLER",
        help="wait for the endpoints file while this controller (PID:START:PIDNS, as it passes it) runs",
    )
    client.add_argument("--resume", action="store_true", help="continue this attempt's own dataset (a rerun)")
    client.add_argument("--stage", type=int, choices=[0, 1], default=None, help="a two-stage run's stage")
    sub.add_parser("proxy", help="balancing endpoint in front of several replicas", add_help=False)
    sub.add_parser("inspect", help="answer the submit host's questions about a recipe (JSON on stdin and stdout)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "inspect" and not rest:
        from ddslurm.runtime._inspect import inspect_main

        return inspect_main()
    if args.command == "proxy":
        from ddslurm.runtime._proxy import main as proxy_main

        return proxy_main(rest, os.environ)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return cmd_generate(args) if args.command == "generate" else cmd_client(args)
