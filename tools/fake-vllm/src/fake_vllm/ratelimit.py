"""A hosted API's rate limit on one key, as OpenAI-style APIs answer it (``--fake-rate-limit-*``): requests and
tokens a minute, each a bucket of a minute's worth refilled continuously, and requests at once. Over any of them a
chat request is answered 429 with ``Retry-After`` and the ``x-ratelimit-*`` headers (or Anthropic's
``anthropic-ratelimit-*``; or none at all, not even ``Retry-After``, as some endpoints send nothing but the 429);
every answer carries the headers. The clock is injected, so the limiter's own tests need no sleep."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

HeaderStyle = Literal["openai", "anthropic", "none"]


@dataclass(frozen=True, slots=True)
class Admission:
    """What the limiter decided for one request: admitted or not, and the headers its answer carries."""

    admitted: bool
    headers: dict[str, str]
    reason: str = ""
    """Which limit refused it (``requests``, ``tokens``, ``concurrency``); empty when admitted."""


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``1m30s``, ``2s``, ``250ms``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{int(minutes)}m" if minutes >= 1 else ""
    return text + f"{rest:.3g}s"


class RateLimiter:
    """One key's limits. ``requests_per_minute`` / ``tokens_per_minute`` / ``in_flight``: None for no such limit."""

    def __init__(
        self,
        *,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        in_flight: int | None,
        style: HeaderStyle = "openai",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._rpm = requests_per_minute
        self._tpm = tokens_per_minute
        self._in_flight_limit = in_flight
        self._style = style
        self._clock = clock
        self._wall = wall
        self._requests = float(requests_per_minute or 0)
        self._tokens = float(tokens_per_minute or 0)
        self._at = clock()
        self.in_flight = 0
        self.admitted = 0
        self.refused = 0

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._at)
        self._at = now
        if self._rpm is not None:
            self._requests = min(float(self._rpm), self._requests + elapsed * self._rpm / 60)
        if self._tpm is not None:
            self._tokens = min(float(self._tpm), self._tokens + elapsed * self._tpm / 60)

    def admit(self, tokens: int) -> Admission:
        """A chat request that would use ``tokens`` (its prompt and its ``max_tokens``): admitted (counted in
        flight until :meth:`done`) or refused with how long to wait."""
        self._refill()
        waits: list[tuple[float, str]] = []
        if self._rpm is not None and self._requests < 1:
            waits.append(((1 - self._requests) * 60 / self._rpm, "requests"))
        if self._tpm is not None and self._tokens < tokens:
            waits.append(((min(tokens, self._tpm) - self._tokens) * 60 / self._tpm, "tokens"))
        if self._in_flight_limit is not None and self.in_flight >= self._in_flight_limit:
            waits.append((1.0, "concurrency"))
        if waits:
            self.refused += 1
            wait, reason = max(waits)
            headers = self.headers()
            if self._style != "none":  # "none": the 429 alone, as some endpoints answer
                headers["retry-after"] = str(max(1, math.ceil(wait)))
            return Admission(False, headers, reason)
        if self._rpm is not None:
            self._requests -= 1
        if self._tpm is not None:
            self._tokens -= tokens
        self.in_flight += 1
        self.admitted += 1
        return Admission(True, self.headers())

    def done(self) -> None:
        """An admitted request has its answer."""
        self.in_flight = max(0, self.in_flight - 1)

    def headers(self) -> dict[str, str]:
        """The key's state in the chosen style (nothing for ``none``)."""
        if self._style == "none":
            return {}
        out: dict[str, str] = {}
        for kind, limit, left in (("requests", self._rpm, self._requests), ("tokens", self._tpm, self._tokens)):
            if limit is None:
                continue
            reset_s = (limit - left) * 60 / limit
            if self._style == "openai":
                out[f"x-ratelimit-limit-{kind}"] = str(limit)
                out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(left)))
                out[f"x-ratelimit-reset-{kind}"] = _duration(reset_s)
            else:
                at = (self._wall() + timedelta(seconds=reset_s)).isoformat().replace("+00:00", "Z")
                out[f"anthropic-ratelimit-{kind}-limit"] = str(limit)
                out[f"anthropic-ratelimit-{kind}-remaining"] = str(max(0, math.floor(left)))
                out[f"anthropic-ratelimit-{kind}-reset"] = at
        return out
