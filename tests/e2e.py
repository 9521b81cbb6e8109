"""What the end-to-end tests share: the ``ddslurm`` CLI run as a user runs it (a subprocess of this environment's
entry point), waiting, bounded, for what a run does next, a run's Slurm arrays, and a script run as another,
unprivileged user of the node."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import SubmissionRecord, read_json

NOBODY = 65534
"""The other user of the shared-node tests (``nobody``); starting its processes needs root."""
SYSTEM_PYTHON = "/usr/bin/python3"
"""A Python another user can run (the project's environment may be unreadable to it)."""
DDSLURM = str(Path(sys.executable).parent / "ddslurm")


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 600, umask: int | None = None
) -> subprocess.CompletedProcess[str]:
    """``ddslurm ARGS`` with ``env`` (and ``umask``, else this process's), its output captured."""
    return subprocess.run(
        [DDSLURM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False,
        umask=-1 if umask is None else umask,
    )  # fmt: skip


def cli_json(
    *args: str, env: dict[str, str], timeout: float = 600, umask: int | None = None, codes: tuple[int, ...] = (0,)
) -> Any:
    """``ddslurm ARGS`` that must exit with one of ``codes``; its standard output decoded as JSON."""
    done = run_cli(*args, env=env, timeout=timeout, umask=umask)
    assert done.returncode in codes, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    show: Callable[[], Any] | None = None,
    *,
    interval: float = 0.2,
) -> Any:
    """The first true value of ``predicate()`` within ``timeout`` seconds; the test fails naming ``what`` (and
    ``show()``, the last state seen) otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}" + (f"; last seen: {show()}" if show else ""))


def array_jobs(run_dir: Path) -> list[str]:
    """The Slurm array job ids of every submission of the run, oldest first."""
    return sorted((read_json(p, SubmissionRecord).array_job_id for p in run_dir.glob("submissions/*.json")), key=int)


def as_nobody(script: str, *args: str, timeout: float = 60) -> str:
    """What the Python ``script`` (with ``args``) prints when :data:`NOBODY` runs it, from ``/``."""
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", script, *args], user=NOBODY, group=NOBODY, cwd="/", capture_output=True, text=True,
        timeout=timeout, check=True,
    )  # fmt: skip
    return done.stdout.strip()
