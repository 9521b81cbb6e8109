"""Errors of the contracts layer.

ConfigError                    root of every error this package raises
├── ConfigFileError            a file could not be read or parsed (names file:line:col and field)
└── UnsafePathError            a path is a symbolic link, not owned as expected, or already exists
"""

from __future__ import annotations

from pathlib import Path


class ConfigError(Exception):
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


class UnsafePathError(ConfigError):
    """A path that must be created or written safely is a symlink or already exists."""
