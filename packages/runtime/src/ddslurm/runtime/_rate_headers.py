"""What a hosted provider's answer says of its key's rate limits: the OpenAI-style ``x-ratelimit-*`` headers (OpenAI,
Azure OpenAI, most OpenAI-compatible gateways), Anthropic's ``anthropic-ratelimit-*`` and ``Retry-After``. Pure:
headers and a clock in, numbers out; a header that does not parse is left out, never an error (a provider's answer
is not ddslurm's input to refuse). Some endpoints send none of them: then only the 429 itself says anything."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

_DURATION = re.compile(r"(?P<value>\d+(?:\.\d+)?)(?P<unit>ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class RateSignal:
    """One answer's word on its key's limits; None where it said nothing. The limits are the provider's window's
    (a minute for every provider named here); ``*_reset_s`` is how long until that count is whole again."""

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_s: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_s: float | None = None
    retry_after_s: float | None = None
    """``Retry-After`` (seconds, or an HTTP date), or ``retry-after-ms``: wait at least this long before the next."""

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__slots__)


def parse_duration(text: str) -> float | None:
    """OpenAI's reset durations (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``) or plain seconds (``12``, ``0.5``), in
    seconds; None for anything else."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    parts = list(_DURATION.finditer(text))
    if not parts or "".join(p.group(0) for p in parts) != text:
        return None
    return sum(float(p.group("value")) * _UNIT_S[p.group("unit")] for p in parts)


def _count(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(float(value.strip()))
    except (ValueError, OverflowError):
        return None
    return number if number >= 0 else None


def _until(value: str | None, now: datetime) -> float | None:
    """An RFC 3339 time (Anthropic's resets) as seconds from ``now`` (0 when past); a duration as itself."""
    if value is None:
        return None
    duration = parse_duration(value)
    if duration is not None:
        return duration
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return max(0.0, (at - now).total_seconds())


def _retry_after(headers: Mapping[str, str], now: datetime) -> float | None:
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None and (ms := parse_duration(milliseconds)) is not None:
        return ms / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds is not None:
        return seconds
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return max(0.0, (at - now).total_seconds())


def rate_signal(headers: Mapping[str, str], now: datetime) -> RateSignal:
    """What ``headers`` say (names in any case): the OpenAI-style names first, Anthropic's where those are absent;
    of Anthropic's separate input and output token limits (when it sends no combined one), the smaller, which binds
    first."""
    h = {k.lower(): v for k, v in headers.items()}
    requests = (
        _count(h.get("x-ratelimit-limit-requests") or h.get("anthropic-ratelimit-requests-limit")),
        _count(h.get("x-ratelimit-remaining-requests") or h.get("anthropic-ratelimit-requests-remaining")),
        _until(h.get("x-ratelimit-reset-requests") or h.get("anthropic-ratelimit-requests-reset"), now),
    )
    tokens = (
        _count(h.get("x-ratelimit-limit-tokens") or h.get("anthropic-ratelimit-tokens-limit")),
        _count(h.get("x-ratelimit-remaining-tokens") or h.get("anthropic-ratelimit-tokens-remaining")),
        _until(h.get("x-ratelimit-reset-tokens") or h.get("anthropic-ratelimit-tokens-reset"), now),
    )
    if tokens == (None, None, None):  # Anthropic's split limits: the tighter one binds
        split = [
            (
                _count(h.get(f"anthropic-ratelimit-{kind}-tokens-limit")),
                _count(h.get(f"anthropic-ratelimit-{kind}-tokens-remaining")),
                _until(h.get(f"anthropic-ratelimit-{kind}-tokens-reset"), now),
            )
            for kind in ("input", "output")
        ]
        known = [s for s in split if s[0] is not None]
        if known:
            tokens = min(known, key=lambda s: s[0] or 0)
    return RateSignal(
        requests_limit=requests[0],
        requests_remaining=requests[1],
        requests_reset_s=requests[2],
        tokens_limit=tokens[0],
        tokens_remaining=tokens[1],
        tokens_reset_s=tokens[2],
        retry_after_s=_retry_after(h, now),
    )
