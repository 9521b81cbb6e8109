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

Exit codes of generate and client: 0 every shard succeeded (or was superseded); 1 one failed (its attempt record
says why), or an error of ddslurm ended the step before it had an attempt (one line on stderr,
``ddslurm-runtime: REASON: MESSAGE``); 3 a shard ended with a partial result; 64 a command line the step cannot
run (no shard or job id, a stage the run does not have).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path

from ddslurm.config import DdslurmError, frozen_imports
from ddslurm.runtime.errors import RuntimeFailure


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


def failed(exc: DdslurmError) -> int:
    """What ``ddslurm-runtime`` does with an error of ddslurm that ends a command (the inputs of a step that cannot
    be read, before it has an attempt to record a failure in): one line on stderr, ``ddslurm-runtime: REASON:
    MESSAGE`` (REASON: a runtime failure's stable code) or ``ddslurm-runtime: MESSAGE`` (another package's error),
    and exit 1 (``EXIT_FAILED``). The only place the runtime's errors become an exit code; an attempt's own failures
    are recorded in its attempt record and give theirs through it (``_attempt_record.exit_code_for``)."""
    from ddslurm.runtime._attempt_record import EXIT_FAILED  # loaded already by the commands that raise one

    if isinstance(exc, RuntimeFailure):
        print(f"ddslurm-runtime: {exc.reason}: {exc.message}", file=sys.stderr, flush=True)
    else:
        print(f"ddslurm-runtime: {exc}", file=sys.stderr, flush=True)
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    """``ddslurm-runtime ARGV``; returns the exit code (an error of ddslurm: :func:`failed`)."""
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
    try:
        return _command(parser, args, rest)
    except DdslurmError as exc:
        return failed(exc)


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> int:
    if rest and args.command != "proxy":  # the proxy parses its own arguments
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    with frozen_imports():  # what the command imports, its collections (and its exit) never walk again
        run = _entry(args.command)
    return run(args, rest)


def _entry(command: str) -> Callable[[argparse.Namespace, list[str]], int]:
    """``command``'s function; each command imports what it runs, no more: a proxy or an inspect step does not load
    the engine or pyarrow."""
    if command == "inspect":
        from ddslurm.runtime._inspect import inspect_main

        return lambda _args, _rest: inspect_main()
    if command == "proxy":
        from ddslurm.runtime._proxy import main as proxy_main

        return lambda _args, rest: proxy_main(rest, os.environ)
    if command == "generate":
        from ddslurm.runtime._generate_step import cmd_generate

        return lambda args, _rest: cmd_generate(args)
    from ddslurm.runtime._client_step import cmd_client

    return lambda args, _rest: cmd_client(args)
