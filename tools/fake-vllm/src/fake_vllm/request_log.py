"""The ``--fake-request-log`` JSON-lines file: one line per request, never the key or the header."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class RequestLogEntry:
    """What is recorded about one request. ``authorized``: an Authorization header was present and valid
    (valid means it matched a key; with no key configured, any header counts as valid). ``admitted``: when an
    answered chat request got a running slot (epoch s; it ran from then until ``time``), else None.
    ``match``: what ``--fake-log-match`` found in a chat request's messages."""

    time: float
    method: str
    path: str
    status: int
    model: str | None
    auth_present: bool
    authorized: bool
    n_messages: int | None
    admitted: float | None = None
    match: str | None = None
    client_request_id: str | None = None
    """The request's ``X-Client-Request-Id`` header (OpenAI's: a caller's own id for one request)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    """What the answer's ``usage`` says (answered 200 only)."""


class RequestLog:
    """Appends entries to a file, opening it per write so that a crash never loses a written line."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def write(self, entry: RequestLogEntry) -> None:
        line = json.dumps(asdict(entry), sort_keys=True)
        with self._path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def now() -> float:
    """Wall-clock seconds since the epoch, as recorded in the log."""
    return time.time()
