"""``ddslurm-runtime client``: the Data Designer step of an attempt, the only one that sees API keys. It runs
in a scratch home of its own, may start before its endpoints exist (it imports Data Designer meanwhile) and
generates, verifies and publishes the shard (:mod:`ddslurm.runtime.cli` parses the command line)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import RunLayout
from ddslurm.runtime._attempt import AttemptRunner
from ddslurm.runtime._attempt_record import EXIT_USAGE
from ddslurm.runtime._controller import controller_alive
from ddslurm.runtime._engine import engine_environment, local_token_names, preload_engine, run_engine
from ddslurm.runtime._inputs import Inputs, load_inputs, stage_inputs
from ddslurm.runtime._log import logger_factory, new_logger
from ddslurm.runtime._scratch import own_scratch_owner, scratch_base, scratch_directory, sweep_stale


@contextmanager
def _engine_scratch(attempt: str, env: Mapping[str, str], log: Any) -> Iterator[Path]:
    """A per-process scratch home for Data Designer in the job's temporary directory, set up before anything
    imports it and removed however the step ends but SIGKILL; this user's stale ones on the node are swept first
    (rules in ``ddslurm.runtime._scratch``)."""
    base = scratch_base(env)
    sweep_stale(base, env, uid=os.getuid(), host=socket.gethostname(), log=log)
    with scratch_directory(base, own_scratch_owner(env, attempt)) as scratch:
        home = scratch / "dd-home"
        os.environ.update(engine_environment(home))
        yield home


def await_endpoints(
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
        # before the endpoints: reading and checking the inputs overlaps the model load or the drain (an
        # InputsError ends the step: ``cli.failed``)
        loaded = load_inputs(layout, plan_sha256=args.plan_sha256)
        try:
            inputs = client_inputs(stage_inputs(loaded, args.stage))
        except ValueError as exc:
            print(f"ddslurm-runtime: --stage: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if alive is not None:
            await_endpoints(args.endpoints, alive)  # imports Data Designer while it waits
        else:
            preload_engine()  # before the generation begins: its usage keeps the imports apart from the requests
        endpoints = msgspec.json.decode(args.endpoints.read_bytes(), type=dict[str, str]) if args.endpoints else {}
        runner = AttemptRunner(
            layout,
            engine=run_engine,
            env=os.environ,
            scratch_home=home,
            make_logger=logger_factory(layout.run_id, "client"),
            stage=args.stage,
        )
        began = runner.resume(args.shard, args.attempt)
        return runner.generate(inputs, began, endpoints, resume_own=args.resume)
