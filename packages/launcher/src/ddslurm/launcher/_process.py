"""The commands the launcher runs on the submit host (the scheduler's commands, the questions it asks the profile's
``python_env`` about a recipe, the MCP tool listing): each in a session and process group of its own, without a
shell, and stopped with everything it started when it runs past its timeout or the launcher is interrupted (Ctrl-C:
the command is in its own session, so it is stopped here)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Stopped(Exception):
    """The command ran past its timeout and was stopped; ``stderr``: what it had printed there by then."""

    def __init__(self, stderr: str) -> None:
        super().__init__("stopped at its timeout")
        self.stderr = stderr


@dataclass(frozen=True, slots=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_in_group(
    argv: Sequence[str],
    *,
    timeout_s: float,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    umask: int = -1,
) -> Finished:
    """Run ``argv`` (stdin: ``input``, else /dev/null) and return what it printed; :class:`Stopped` when it takes
    longer than ``timeout_s``. A command that is not installed raises ``FileNotFoundError``."""
    proc = subprocess.Popen(
        list(argv),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        umask=umask,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise Stopped(stop_group(proc)) from None
    except BaseException:
        stop_group(proc)
        raise
    return Finished(proc.returncode, out, err)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a command asked with JSON answered: the JSON object it printed on stdout (None when it printed none),
    its exit code and what it printed on stderr."""

    value: dict[str, Any] | None
    returncode: int
    stderr: str


def ask_json(
    argv: Sequence[str], request: Any, *, timeout_s: float, env: Mapping[str, str], cwd: Path | None = None
) -> Answer:
    """Run ``argv`` as :func:`run_in_group` does, with ``request`` as JSON on its stdin, and read the JSON object it
    prints. :class:`Stopped` at the timeout; ``OSError`` when ``argv`` cannot be run."""
    done = run_in_group(argv, timeout_s=timeout_s, input=json.dumps(request), env=env, cwd=cwd)
    try:
        value = json.loads(done.stdout)
    except ValueError:
        value = None
    return Answer(value if isinstance(value, dict) else None, done.returncode, done.stderr)


def stop_group(proc: subprocess.Popen[str]) -> str:
    """Kill the command's whole process group and reap it (bounded: a child that left the group and still holds
    the pipes is not waited for); what it printed to stderr that was not read yet."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    err = ""
    with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
        _, err = proc.communicate(timeout=5)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return err or ""
