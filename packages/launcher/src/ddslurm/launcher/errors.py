"""Errors of the launcher.

LauncherError            root of every error the ddslurm CLI reports
├── SlurmError           a scheduler command failed; carries the command and its stderr
├── RunNotFoundError     RUN names no run directory
├── UsageError           a command-line value the run does not have (a shard, an attempt) or cannot take
└── SubmitError          the run cannot be submitted (inputs invalid); nothing was left behind
"""

from __future__ import annotations


class LauncherError(Exception):
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


class SubmitError(LauncherError):
    pass
