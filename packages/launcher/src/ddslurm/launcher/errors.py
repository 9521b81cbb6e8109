"""Errors of the launcher.

LauncherError            root of the launcher's own errors (a DdslurmError, as every package's root is)
├── SlurmError           a scheduler command failed; carries the command and its stderr
├── RunNotFoundError     RUN names no run directory
├── InitError            ddslurm init wrote nothing (its files exist, or the cluster could not be read)
├── UsageError           a command-line value the run does not have (a shard, an attempt) or cannot take
├── RetryRefusedError    retry submitted nothing: a key the provider still refuses, a failure the plan repeats
├── WriteError           a file could not be written (a full disk or quota, an I/O error); what was half-written
│                        was removed
├── InspectAnswerError   the profile's python_env gave no answer the submit host can use to its question
├── CollectFailedError   a collection published no dataset; carries the exit code ``ddslurm collect`` exits with
└── SubmitError          the run cannot be submitted (inputs invalid); nothing was left behind
    ├── BuilderError     a builder script (recipe: build.py, module:function) failed or returned no config
    └── OverrunError     the run is predicted not to fit its time limit, and the user did not confirm it
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ddslurm.config import DdslurmError

if TYPE_CHECKING:
    from ddslurm.planner import Overrun

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errors of a full file system or quota."""


class LauncherError(DdslurmError):
    """Root of the errors raised by ddslurm.launcher."""


class SlurmError(LauncherError):
    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"{argv[0]} failed (exit {returncode}): {self.stderr or '(no output)'}")


class RunNotFoundError(LauncherError):
    pass


class UsageError(LauncherError):
    pass


class RetryRefusedError(LauncherError):
    """``retry`` submitted nothing: the shards failed in a way a new attempt would repeat (a key their provider still
    refuses; a failure the run's frozen plan repeats, unless forced). The message says what to do instead."""


class WriteError(LauncherError):
    """``what`` could not be written (``cause``: the OSError, a full disk or quota most often); ``after``: what the
    command did about it (``nothing was submitted and no run directory was left``)."""

    def __init__(self, what: str, cause: OSError, after: str = "") -> None:
        self.cause = cause
        where = f" ({cause.filename})" if cause.filename else ""
        full = ": the file system or your quota is full" if cause.errno in DISK_FULL else ""
        then = f"; {after}" if after else ""
        super().__init__(f"cannot write {what}: {cause.strerror or cause}{where}{full}{then}")


class SubmitError(LauncherError):
    pass


class BuilderError(SubmitError):
    """The Python that builds the recipe failed, raised or returned no config; names the script and line."""


class OverrunError(SubmitError):
    """The plan's prediction says the run will not fit its time limit (``overruns``: each way, the run file's field
    and what fits, :func:`ddslurm.planner.overruns`) and ``submit`` was not told to run it anyway
    (``--accept-overrun``); nothing was written or submitted."""

    def __init__(self, overruns: Sequence[Overrun]) -> None:
        self.overruns = tuple(overruns)
        lines = [f"  {o.message}" for o in self.overruns]
        super().__init__(
            "the run is predicted not to fit its time limit; nothing was written or submitted:\n"
            + "\n".join(lines)
            + "\nchange the run file as said (ddslurm submit --dry-run shows the prediction), or submit with "
            "--accept-overrun to run it as it is"
        )


class InitError(LauncherError):
    """``ddslurm init`` wrote nothing: its files exist (without ``--force``), or the cluster could not be read."""


class InspectAnswerError(LauncherError):
    """``<python_env>/bin/ddslurm-runtime inspect`` gave no answer the submit host can use
    (:mod:`ddslurm.launcher.cluster._engine_host`). ``answered``: it printed one, and the message says why it is of no
    use (its error answer, or an answer of another protocol version, naming both and what to install); else it printed
    none (``returncode``, and ``stderr``: what it printed there, the way to see why)."""

    def __init__(self, message: str, *, answered: bool, returncode: int, stderr: str) -> None:
        super().__init__(message)
        self.answered = answered
        self.returncode = returncode
        self.stderr = stderr

    def tail(self, lines: int = 10) -> str:
        """The last ``lines`` lines it printed on stderr."""
        return "\n".join(self.stderr.strip().splitlines()[-lines:])


class CollectFailedError(LauncherError):
    """A collection that published no dataset (``ddslurm collect``'s work, by a Slurm job or in this process):
    ``exit_code`` is the collector's code that ``ddslurm collect`` exits with (1 failed, 2 the run directory
    unreadable, 128 + N ended by signal N), ``errors`` the ``error: ...`` lines it said."""

    def __init__(self, exit_code: int, errors: str) -> None:
        self.exit_code, self.errors = exit_code, errors
        lines = [line.removeprefix("error: ") for line in errors.splitlines() if line.startswith("error: ")]
        super().__init__("\n".join(lines) or f"the collection ended with exit code {exit_code}")
