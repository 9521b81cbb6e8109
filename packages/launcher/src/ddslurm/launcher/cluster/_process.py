"""The commands the launcher runs on the submit host (the scheduler's commands, the questions it asks the profile's
``python_env`` about a recipe, the MCP tool listing): each in a session and process group of its own, without a
shell, and stopped with everything it started when it runs past its timeout or the launcher is interrupted (Ctrl-C:
the command is in its own session, so it is stopped here)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class Stopped(Exception):
    """The command ran past its timeout and was stopped; ``stderr``: what it had printed there by then."""

    def __init__(self, stderr: str) -> None:
        super().__init__("stopped at its timeout")
        self.stderr = stderr


@dataclass(frozen=True, slots=True)
class Finished:
    """What a command printed on stdout and stderr, and its exit code."""

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
