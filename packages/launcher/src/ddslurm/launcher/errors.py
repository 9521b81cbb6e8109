"""Errors of the launcher.

LauncherError            root of every error the ddslurm CLI reports
├── SlurmError           a scheduler command failed; carries the command and its stderr
├── RunNotFoundError     RUN names no run directory
├── InitError            ddslurm init wrote nothing (its files exist, or the cluster could not be read)
├── UsageError           a command-line value the run does not have (a shard, an attempt) or cannot take
└── SubmitError          the run cannot be submitted (inputs invalid); nothing was left behind
    └── RecipeError      a builder script (recipe: build.py, module:function) failed or returned no config
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


class RecipeError(SubmitError):
    """The Python that builds the recipe failed, raised or returned no config; names the script and line."""


class InitError(LauncherError):
    """``ddslurm init`` wrote nothing: its files exist (without ``--force``), or the cluster could not be read."""
