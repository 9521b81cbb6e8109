"""What ``ddslurm`` prints as data: exit codes, JSON output and the errors of every command.

Every exit code is one :class:`ExitCode` (``docs/cli.md`` lists them; a test compares the two). An error is
reported as one ``error: ...`` line (or more) on stderr and, with ``--json``, also as one JSON object on stdout:
``{"error": {"code": "<snake_case>", "message": "...", "exit_code": N, ...details}}``. Which errors are reported
(every :class:`~ddslurm.config.DdslurmError`, whichever package raised it: :func:`reported`) and the code and exit
code of each (:func:`error_report`) are decided here and nowhere else.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Any, TextIO

import msgspec
import typer

from ddslurm.config import ConfigError, ConfigFileError, DdslurmError, PlannedArray, compact_ranges
from ddslurm.launcher.cluster._slurm import SlurmTimeoutError
from ddslurm.launcher.errors import (
    CollectFailedError,
    OverrunError,
    RunNotFoundError,
    SlurmError,
    SubmitError,
    UsageError,
    WriteError,
)
from ddslurm.launcher.runs._follow import WaitTimeout

if TYPE_CHECKING:
    from ddslurm.launcher.submission._arrays import PartialSubmitError
    from ddslurm.planner import SubmissionPlan

SIGNAL_BASE = 128


class ExitCode(IntEnum):
    """The exit codes of ``ddslurm`` (``docs/cli.md``, table "Exit codes")."""

    OK = 0
    FAILED = 1
    USAGE = 2
    TIMEOUT = 3
    INTERRUPTED = 130
    CLOSED_PIPE = 141
    TERMINATED = 143


class ErrorCode(StrEnum):
    """The ``code`` of a ``--json`` error object (``docs/cli.md``, table "Error codes")."""

    USAGE = "usage"
    RUN_NOT_FOUND = "run_not_found"
    INVALID_INPUT = "invalid_input"
    PROVIDERS = "providers"
    SUBMIT_REFUSED = "submit_refused"
    SUBMISSION_INCOMPLETE = "submission_incomplete"
    SLURM = "slurm"
    SLURM_TIMEOUT = "slurm_timeout"
    TIMEOUT = "timeout"
    COLLECT_FAILED = "collect_failed"
    WRITE_FAILED = "write_failed"
    RUN_UNREADABLE = "run_unreadable"
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ErrorReport:
    code: ErrorCode
    message: str
    exit_code: int
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"error": {"code": str(self.code), "message": self.message, "exit_code": self.exit_code, **self.details}}


class CommandFailed(Exception):
    """A command ends with this error report (``main`` prints it like any other error; ``said``: the command
    printed its ``error:`` lines on stderr itself)."""

    def __init__(self, report: ErrorReport, *, said: bool = False) -> None:
        super().__init__(report.message)
        self.report, self.said = report, said


def write_json(obj: Any, out: TextIO) -> None:
    out.write(msgspec.json.encode(obj).decode() + "\n")
    out.flush()


def emit_error(report: ErrorReport, *, out: TextIO, err: TextIO, as_json: bool, said: bool = False) -> None:
    """``error: MESSAGE`` on stderr (unless ``said``); with ``as_json`` the error object on stdout too."""
    if report.message and not said:
        err.write(f"error: {report.message}\n")
        err.flush()
    if as_json:
        write_json(report.as_json(), out)


def _submit_exit(command: str | None) -> ExitCode:
    """``submit`` refuses (exit 2, nothing submitted) where any other command fails (exit 1)."""
    return ExitCode.USAGE if command == "submit" else ExitCode.FAILED


def _loaded_error(module: str, name: str) -> type[BaseException] | None:
    """The error class ``name`` of ``module`` if that module was imported, else None (an error of a module that was
    never imported cannot have been raised). The providers' and the collector's roots, which have codes of their
    own, are found so, without importing those packages (the collector's loads pyarrow) for commands that never use
    them."""
    loaded = sys.modules.get(module)
    found = getattr(loaded, name, None) if loaded is not None else None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _providers_error() -> type[BaseException] | None:
    return _loaded_error("ddslurm.providers.errors", "ProvidersError")


def _collect_error() -> type[BaseException] | None:
    return _loaded_error("ddslurm.collector.errors", "CollectError")


def _partial_submit(exc: BaseException) -> PartialSubmitError | None:
    """``exc`` if it is a submission that stopped part-way (raised by ``_submit``, so imported already)."""
    if "ddslurm.launcher.submission._submit" not in sys.modules:
        return None
    from ddslurm.launcher.submission._arrays import PartialSubmitError

    return exc if isinstance(exc, PartialSubmitError) else None


def error_report(exc: BaseException, command: str | None) -> ErrorReport:
    """The code, message and exit code of an error that ended ``command`` (one :func:`reported` says ddslurm
    reports): the one mapping of errors to ``docs/cli.md``'s tables "Error codes" and "Exit codes"."""
    message = str(exc)
    if isinstance(exc, CommandFailed):
        return exc.report
    if isinstance(exc, typer.TyperException):  # the command line itself (Typer's parser)
        return ErrorReport(ErrorCode.USAGE, exc.format_message(), exc.exit_code)
    if (partial := _partial_submit(exc)) is not None:
        return ErrorReport(ErrorCode.SUBMISSION_INCOMPLETE, message, ExitCode.FAILED, partial_json(partial))
    if isinstance(exc, WaitTimeout):  # ``wait --timeout``: the run's last status comes with the error
        return ErrorReport(ErrorCode.TIMEOUT, message, ExitCode.TIMEOUT, {"status": exc.status})
    if isinstance(exc, CollectFailedError):  # ``workflow``'s collection: the exit code ``collect`` would give
        return collect_report(exc)
    if isinstance(exc, OverrunError):  # each overrun's field and what fits come with the refusal
        overruns = [msgspec.to_builtins(o) for o in exc.overruns]
        return ErrorReport(ErrorCode.SUBMIT_REFUSED, message, ExitCode.USAGE, {"overruns": overruns})
    fixed: list[tuple[type[BaseException] | None, ErrorCode, ExitCode]] = [
        (UsageError, ErrorCode.USAGE, ExitCode.USAGE),
        (RunNotFoundError, ErrorCode.RUN_NOT_FOUND, ExitCode.USAGE),
        (SubmitError, ErrorCode.SUBMIT_REFUSED, ExitCode.USAGE),
        (ConfigError, ErrorCode.INVALID_INPUT, ExitCode.USAGE),
        (_providers_error(), ErrorCode.PROVIDERS, ExitCode.USAGE),
        (_collect_error(), ErrorCode.COLLECT_FAILED, ExitCode.FAILED),
    ]
    for kind, code, exit_code in fixed:
        if kind is not None and isinstance(exc, kind):
            return ErrorReport(code, message, exit_code, problems_json(exc))
    if isinstance(exc, WriteError):
        return ErrorReport(ErrorCode.WRITE_FAILED, message, _submit_exit(command))
    if isinstance(exc, SlurmTimeoutError):
        return ErrorReport(ErrorCode.SLURM_TIMEOUT, message, _submit_exit(command))
    if isinstance(exc, SlurmError):
        return ErrorReport(ErrorCode.SLURM, message, _submit_exit(command))
    if isinstance(exc, DdslurmError):  # any other ddslurm error: the launcher's, the planner's, the runtime's
        return ErrorReport(
            ErrorCode.SUBMIT_REFUSED if command == "submit" else ErrorCode.FAILED, message, _submit_exit(command)
        )
    raise TypeError(f"not an error ddslurm reports: {exc!r}") from exc


def problems_json(exc: BaseException) -> dict[str, Any]:
    """``{"problems": [...]}`` of an error that is (or whose cause is) an invalid file: each problem found in it
    (one, or all that ``ConfigFileErrors`` lists) as ``--json`` shows it; else nothing."""
    found = exc if isinstance(exc, ConfigFileError) else exc.__cause__
    if not isinstance(found, ConfigFileError):
        return {}
    return {"problems": [problem.as_dict() for problem in found.problems]}


REPORTED: tuple[type[BaseException], ...] = (CommandFailed, typer.TyperException, DdslurmError)
"""The errors that ``main`` reports as ``error: ...``: every package's (their roots derive from
:class:`~ddslurm.config.DdslurmError`), a command's own report, and a command line Typer cannot parse."""


def reported(exc: BaseException) -> bool:
    """Whether ``main`` reports ``exc`` as ``error: ...`` (anything else is a bug and keeps its traceback)."""
    return isinstance(exc, REPORTED)


def collect_report(exc: CollectFailedError) -> ErrorReport:
    """The error of a collection that published nothing: its message (the ``error: ...`` lines it said) and the
    exit code it ended with (``ddslurm.collector.collect_command``'s codes)."""
    code = exc.exit_code
    if code == ExitCode.USAGE:
        kind = ErrorCode.RUN_UNREADABLE
    elif code == ExitCode.INTERRUPTED:
        kind = ErrorCode.INTERRUPTED
    elif code > SIGNAL_BASE:
        kind = ErrorCode.TERMINATED
    else:
        kind = ErrorCode.COLLECT_FAILED
    return ErrorReport(kind, str(exc), code)


def array_json(array: PlannedArray, job_id: str | None = None, *, plan: Sequence[PlannedArray] = ()) -> dict[str, Any]:
    """One planned array; ``plan``: the arrays of its submission, for ``after_failure_of`` (an automatic retry
    waits for the failure of every one of these arrays, nearest first: ``--dependency=afternotok:...``)."""
    from ddslurm.planner import array_tasks, failure_chain

    return {
        "index": array.index,
        "kind": array.kind,
        "array": array.array,
        "shards": compact_ranges(array.shards),
        "tasks": array_tasks(array),
        "pulling": array.tasks is not None,
        "after": array.after,
        "after_failure_of": list(failure_chain([*plan, array], array, whole=False)),
        **({"stage": array.stage, "after_any": list(array.after_any)} if array.stage is not None else {}),
        **({"job_id": job_id} if job_id is not None else {}),
    }


def partial_json(exc: PartialSubmitError) -> dict[str, Any]:
    """What a submission that stopped part-way adds to its error object."""
    arrays = [*(a for a, _ in exc.submitted), *exc.missing]
    return {
        "run_id": exc.layout.run_id,
        "run_dir": str(exc.layout.root),
        "state": "incomplete",
        "cause": str(exc.cause),
        "submitted": [array_json(a, job, plan=arrays) for a, job in exc.submitted],
        "not_submitted": [array_json(a, plan=arrays) for a in exc.missing],
    }


def limits_json(planned: SubmissionPlan) -> dict[str, Any]:
    from ddslurm.planner import HEADROOM

    return {
        "max_array_size": planned.limits.max_array_size,
        "headroom": HEADROOM,
        "checked": [
            {"name": c.name, "scope": c.scope, "limit": c.limit, "used": c.used, "usable": c.usable}
            for c in planned.checks
        ],
        "notes": list(planned.limits.notes),
    }
