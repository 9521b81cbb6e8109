"""What the end-to-end tests share: the ``ddslurm`` CLI run as a user runs it (a subprocess of this environment's
entry point), and waiting, bounded, for what a run does next."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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
