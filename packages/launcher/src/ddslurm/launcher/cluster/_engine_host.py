"""How the submit host asks the profile's ``python_env`` about Data Designer: the one way to it, for every question.

The launcher never imports Data Designer to judge a run: what the nodes will run answers instead, through
``<python_env>/bin/ddslurm-runtime inspect`` (:mod:`ddslurm.runtime._inspect`), one request on its standard input
and one answer on its standard output, the typed and versioned structs of ``ddslurm.config`` (``BuildRequest``,
``CheckRequest``, ``VersionsRequest``, ``ToolsRequest`` and their answers; :data:`ddslurm.config.INSPECT_VERSION`).
Every question goes through an :class:`EngineHost`: a builder script run (``_recipe``), Data Designer's check of
the recipe (``_validate``), ``doctor``'s versions (``_doctor_checks``) and the MCP tool listing (``_mcp_check``).
:meth:`EngineHost.ask` sends the typed request and reads the typed answer; an answer it cannot read (a
``python_env`` with another ddslurm, whose protocol differs), the runtime's error answer, or none at all is an
:class:`~ddslurm.launcher.errors.InspectAnswerError` that says so, with what to install where.

:class:`RuntimeProcess` is the real process, and what every command uses. ``submit``, its dry run and ``doctor``
take a host, so a test of the launcher's own logic can answer in its process
(:class:`ddslurm.launcher.testing.InProcessHost`) instead of paying a Data Designer import in a new process for
every question; the real process stays what the cluster tests and every user run."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from ddslurm.config import (
    ANSWER_TYPES,
    INSPECT_VERSION,
    BuildAnswer,
    BuildRequest,
    CheckAnswer,
    CheckRequest,
    ErrorAnswer,
    InspectProtocolError,
    InspectRequest,
    ToolsAnswer,
    ToolsRequest,
    VersionsAnswer,
    VersionsRequest,
    decode_answer,
    encode_message,
)
from ddslurm.launcher.cluster._process import Finished, run_in_group
from ddslurm.launcher.errors import InspectAnswerError
from ddslurm.runtime import installed_versions

A = TypeVar("A", BuildAnswer, CheckAnswer, VersionsAnswer, ToolsAnswer)


@dataclass(frozen=True, slots=True)
class Answered(Generic[A]):
    """What ``python_env`` answered, and what it printed on stderr meanwhile (Data Designer's and a builder
    script's prints: the script's output a failed build shows)."""

    answer: A
    stderr: str


class EngineHost(abc.ABC):
    """Answers ``ddslurm-runtime inspect`` requests of ``runtime`` (``<python_env>/bin/ddslurm-runtime``)."""

    @abc.abstractmethod
    def exchange(
        self, runtime: Path, request: str, *, timeout_s: float, env: Mapping[str, str], cwd: Path | None = None
    ) -> Finished:
        """Give ``request`` (the JSON text of one request) to ``runtime``'s ``inspect`` with environment ``env`` and
        working directory ``cwd``: what it printed and its exit code. Raises
        :class:`ddslurm.launcher.cluster._process.Stopped` past ``timeout_s``, ``OSError`` when it cannot be asked."""

    @overload
    def ask(
        self,
        runtime: Path,
        request: BuildRequest,
        *,
        timeout_s: float,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Answered[BuildAnswer]: ...
    @overload
    def ask(
        self,
        runtime: Path,
        request: CheckRequest,
        *,
        timeout_s: float,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Answered[CheckAnswer]: ...
    @overload
    def ask(
        self,
        runtime: Path,
        request: VersionsRequest,
        *,
        timeout_s: float,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Answered[VersionsAnswer]: ...
    @overload
    def ask(
        self,
        runtime: Path,
        request: ToolsRequest,
        *,
        timeout_s: float,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Answered[ToolsAnswer]: ...
    def ask(
        self,
        runtime: Path,
        request: InspectRequest,
        *,
        timeout_s: float,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Answered[BuildAnswer] | Answered[CheckAnswer] | Answered[VersionsAnswer] | Answered[ToolsAnswer]:
        """The answer to ``request`` (see :meth:`exchange`); :class:`~ddslurm.launcher.errors.InspectAnswerError`
        when there is none the submit host can use."""
        done = self.exchange(runtime, encode_message(request), timeout_s=timeout_s, env=env, cwd=cwd)
        expected: Any = ANSWER_TYPES[type(request)]  # the overloads say which
        return read_answer(done, expected, runtime)


def read_answer(done: Finished, expected: type[A], runtime: Path) -> Answered[A]:
    """``runtime``'s answer in ``done``, of type ``expected``; :class:`~ddslurm.launcher.errors.InspectAnswerError`
    for none (it failed), its error answer, or one this side cannot read (another ddslurm in ``python_env``: the
    message names ``python_env``, both protocol versions and what to install there)."""
    if done.returncode != 0 or not done.stdout.strip():
        raise InspectAnswerError(
            f"{runtime} gave no answer (exit code {done.returncode})",
            answered=False,
            returncode=done.returncode,
            stderr=done.stderr,
        )
    try:
        answer = decode_answer(done.stdout, expected)
    except InspectProtocolError as exc:
        ours = installed_versions(("ddslurm-runtime",))["ddslurm-runtime"]
        raise InspectAnswerError(
            f"{runtime} (the profile's python_env {runtime.parent.parent}) answers in a form the submit host cannot "
            f"read: {exc}. The submit host has ddslurm-runtime {ours} (inspect protocol {INSPECT_VERSION}): install "
            f"the same ddslurm in python_env (ddslurm-runtime=={ours})",
            answered=True,
            returncode=done.returncode,
            stderr=done.stderr,
        ) from None
    if isinstance(answer, ErrorAnswer):
        raise InspectAnswerError(answer.error, answered=True, returncode=done.returncode, stderr=done.stderr)
    return Answered(answer, done.stderr)


@dataclass(frozen=True, slots=True)
class RuntimeProcess(EngineHost):
    """The real host: a ``runtime inspect`` process for each request, with ``env`` and working directory ``cwd``,
    stopped with everything it started past ``timeout_s``."""

    def exchange(
        self, runtime: Path, request: str, *, timeout_s: float, env: Mapping[str, str], cwd: Path | None = None
    ) -> Finished:
        return run_in_group([str(runtime), "inspect"], timeout_s=timeout_s, input=request, env=env, cwd=cwd)


RUNTIME_PROCESS = RuntimeProcess()
"""The host every command uses."""
