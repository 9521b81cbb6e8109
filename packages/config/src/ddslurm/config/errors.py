"""Errors of the contracts layer, and the root of every ddslurm error.

DdslurmError                   root of every error any ddslurm package raises (each package's errors derive from it)
└── ConfigError                root of every error this package raises
    ├── ConfigFileError        a file could not be read or parsed (names file:line:col and field)
    │   └── ConfigFileErrors   several problems of one file, each a ConfigFileError
    ├── UnsafePathError        a path is a symbolic link, not owned as expected, or already exists
    ├── LockHeldError          another process holds a lock past the wait (``exclusive_lock``)
    └── InspectProtocolError   a ``ddslurm-runtime inspect`` message of another protocol version, or unreadable
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class DdslurmError(Exception):
    """Root of the errors raised by every ddslurm package: ``except DdslurmError`` catches any of them (anything
    else is a bug). The command lines map it to their exit codes (``ddslurm``:
    ``ddslurm.launcher.commands._output``)."""


class ConfigError(DdslurmError):
    """Root of the errors raised by ddslurm.config."""


class ConfigFileError(ConfigError):
    """A config file is malformed; the message points at file, line, column and field."""

    def __init__(
        self,
        path: Path | str,
        message: str,
        *,
        line: int | None = None,
        col: int | None = None,
        field: str = "",
    ) -> None:
        self.path = Path(path)
        self.line = line
        self.col = col
        self.field = field
        self.message = message
        where = str(path)
        if line is not None:
            where += f":{line}"
            if col is not None:
                where += f":{col}"
        text = f"{where}: {field}: {message}" if field else f"{where}: {message}"
        super().__init__(text)

    @property
    def problems(self) -> tuple[ConfigFileError, ...]:
        """Every problem this error reports, each at its file:line:col (this one alone, here)."""
        return (self,)

    def as_dict(self) -> dict[str, str | int | None]:
        """This problem as the ``--json`` of ``ddslurm`` and ``ddslurm-config`` shows it: file, line, col, field,
        message."""
        where = {"file": str(self.path), "line": self.line, "col": self.col}
        return {**where, "field": self.field, "message": self.message}


class ConfigFileErrors(ConfigFileError):
    """Several problems of one file, each a :class:`ConfigFileError`, one line each in the message. ``path``,
    ``line``, ``col``, ``field`` and ``message`` are the first problem's."""

    def __init__(self, problems: Sequence[ConfigFileError]) -> None:
        first = problems[0]
        super().__init__(first.path, first.message, line=first.line, col=first.col, field=first.field)
        self._problems = tuple(problems)
        self.args = ("\n".join(str(problem) for problem in self._problems),)

    @property
    def problems(self) -> tuple[ConfigFileError, ...]:
        return self._problems


class UnsafePathError(ConfigError):
    """A path that must be created or written safely is a symlink or already exists."""


class LockHeldError(ConfigError):
    """Another process held a lock file past the wait (:func:`~ddslurm.config.exclusive_lock`): ``path`` the file,
    ``holder`` who holds it as ``/proc/locks`` tells it (``process 123 of uid 1000``; "" when it does not say). A
    caller that tries once turns it into its own refusal."""

    def __init__(self, path: Path, holder: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


class InspectProtocolError(ConfigError):
    """A ``ddslurm-runtime inspect`` request or answer this side cannot read (``ddslurm.config.decode_request``,
    ``decode_answer``): of another protocol version (``theirs``: the one it says; None when it says none, or is no
    JSON object), or not of the shape this version gives it. The message names both versions."""

    def __init__(self, message: str, *, theirs: int | None) -> None:
        super().__init__(message)
        self.theirs = theirs
