"""How the submit host asks the profile's ``python_env`` about Data Designer: the one seam for every such question.

The launcher never imports Data Designer to judge a run: what the nodes will run answers instead, through
``<python_env>/bin/ddslurm-runtime inspect`` (:mod:`ddslurm.runtime._inspect`), one JSON request on its standard
input and one JSON answer on its standard output. :class:`RuntimeProcess` is that process, and what every command
uses. ``submit``, its dry run and ``doctor`` take an :class:`EngineHost`, so a test of the launcher's own logic can
answer in its process (:class:`ddslurm.launcher.testing.InProcessHost`) instead of paying a Data Designer import in
a new process for every question; the real process stays what the cluster tests and every user run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddslurm.launcher._process import Answer, ask_json


class EngineHost(Protocol):
    """Answers one ``ddslurm-runtime inspect`` request of ``runtime`` (``<python_env>/bin/ddslurm-runtime``).
    Raises :class:`ddslurm.launcher._process.Stopped` past ``timeout_s``, ``OSError`` when it cannot be asked."""

    def ask(
        self,
        runtime: Path,
        request: Mapping[str, Any],
        *,
        timeout_s: float,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Answer: ...


@dataclass(frozen=True, slots=True)
class RuntimeProcess:
    """The real host: a ``runtime inspect`` process for each request, with ``env`` and working directory ``cwd``,
    stopped with everything it started past ``timeout_s``."""

    def ask(
        self,
        runtime: Path,
        request: Mapping[str, Any],
        *,
        timeout_s: float,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Answer:
        return ask_json([str(runtime), "inspect"], dict(request), timeout_s=timeout_s, env=env, cwd=cwd)


RUNTIME_PROCESS = RuntimeProcess()
"""The host every command uses."""
