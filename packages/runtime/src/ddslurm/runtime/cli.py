"""``ddslurm-runtime``: what runs on compute nodes. Reads only the run directory's plan and snapshot.

    ddslurm-runtime generate --run-dir DIR [--shard N] [--job-id ID]

Inside a Slurm array task the shard and job id come from ``SLURM_ARRAY_TASK_ID`` and ``SLURM_JOB_ID``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from ddslurm.config import RunLayout
from ddslurm.runtime._attempt import EXIT_FAILED, AttemptRunner, load_inputs
from ddslurm.runtime._engine import engine_environment, run_engine
from ddslurm.runtime._log import new_logger
from ddslurm.runtime.errors import RuntimeFailure

EXIT_USAGE = 64


def _int_from(value: str | None, what: str) -> int:
    if value is None or not value.strip().isdigit():
        raise SystemExit(f"ddslurm-runtime: {what} is required (got {value!r})")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddslurm-runtime", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="run one attempt of one shard")
    gen.add_argument("--run-dir", type=Path, required=True)
    gen.add_argument("--shard", type=int, default=None)
    gen.add_argument("--job-id", default=None)
    args = parser.parse_args(argv)

    env = os.environ
    shard = args.shard if args.shard is not None else _int_from(env.get("SLURM_ARRAY_TASK_ID"), "--shard")
    job_id = args.job_id or env.get("SLURM_JOB_ID")
    if not job_id:
        print("ddslurm-runtime: --job-id is required outside Slurm", file=sys.stderr)
        return EXIT_USAGE
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    layout = RunLayout(args.run_dir.resolve())
    scratch = Path(tempfile.mkdtemp(prefix=f"ddslurm-{job_id}-"))
    try:
        # Data Designer reads these at import time: set them before anything imports it.
        dd_home = scratch / "dd-home"
        os.environ.update(engine_environment(dd_home))

        def make_logger(stream: IO[bytes]) -> Any:
            return new_logger(stream, sys.stderr.buffer, component="runtime", run_id=layout.run_id)

        try:
            inputs = load_inputs(layout)
        except RuntimeFailure as exc:
            print(f"ddslurm-runtime: {exc.reason}: {exc.message}", file=sys.stderr)
            return EXIT_FAILED
        runner = AttemptRunner(layout, engine=run_engine, env=os.environ, scratch_home=dd_home, make_logger=make_logger)
        return runner.run(inputs, shard, job_id, node)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
