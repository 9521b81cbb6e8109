"""Errors of the providers layer.

ProvidersError               root of every error this package raises (a DdslurmError)
├── SettingsError            a native settings file is malformed (wraps ConfigFileError text)
├── ResolutionError          aliases, providers or secrets do not resolve; lists every problem found
└── RedirectedError          an endpoint answered ``providers --check`` with a redirect (never followed)
"""

from __future__ import annotations

from ddslurm.config import DdslurmError


class ProvidersError(DdslurmError):
    """Root of the errors raised by ddslurm.providers."""


class SettingsError(ProvidersError):
    """A Data Designer settings file could not be read."""


class ResolutionError(ProvidersError):
    """The recipe's model aliases cannot be resolved to providers; ``problems`` lists each reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) resolving model providers:\n{lines}")


class RedirectedError(ProvidersError):
    """An endpoint answered with a redirect, which ``providers --check`` never follows (the request carried the
    key); ``origin`` is where it pointed, scheme, host and port only (no user-info, path or query)."""

    def __init__(self, status: int, origin: str) -> None:
        self.status = status
        self.origin = origin
        super().__init__(f"HTTP {status} redirect to {origin}")
