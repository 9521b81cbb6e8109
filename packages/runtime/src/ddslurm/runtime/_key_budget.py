"""One hosted key's rate budget, shared by every client step that uses it (issue 36).

Each client settles with the others every :data:`INTERVAL_S` through one small file in the run directory
(``budgets/<key>.json``, :class:`ddslurm.config.KeyBudgetState`), under a lock: it reports what it wants (requests
in flight and waiting), what it was answered since (answers, 429s, the provider's rate headers, ``Retry-After``) and
takes back its share of the key: requests at once and requests a minute. Together the clients run one AIMD on the
key's concurrency (a 429 anywhere cuts it for all; answers without one grow it), learn its requests a minute from
the headers, and pause together for the longest ``Retry-After``. A client that stops reporting is gone after
:data:`STALE_S` and its share returns to the others; a client that cannot read or write the file uses
:func:`fallback_share` until it can. Cost: one lock, one read and one write per client per interval, never one per
request. :func:`settle` is pure (the state, the report and the clock in); :func:`settle_file` does the file."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from ddslurm.config import (
    BudgetMember,
    ConfigError,
    KeyBudgetState,
    UnsafePathError,
    atomic_write,
    encode,
    exclusive_lock,
    read_json,
)
from ddslurm.runtime._rate_headers import RateSignal

INTERVAL_S = 2.0
"""How often a client settles with the others."""
STALE_S = 15.0
"""A member that has not reported for this long is gone (its step ended or died)."""
START_CEILING = 4.0
"""Requests a key admits at once before anything is known of it (all clients together): a conservative start,
grown by the answers."""
DECREASE = 0.75
"""A 429 cuts the key's concurrency to this share of itself (Data Designer's own factor inside one process)."""
DECREASE_GAP_S = 2.0
"""At most one cut per this many seconds: the 429s of one burst, reported by many clients, are one signal."""
CHECK_FRESH_S = 600.0
"""A model whose start-up check a client of the run had answered 200 this recently is not checked again."""


@dataclass(frozen=True, slots=True)
class Caps:
    """What the run file states for a provider (a key shared with other work); None: learned only."""

    in_flight: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """What one client saw since its last settle."""

    member: str
    """The client step (``<job>-<attempt>``): one entry per step in the file."""
    demand: int
    """Its requests in flight and waiting now."""
    in_flight: int
    answered: int = 0
    limited: int = 0
    """Of ``answered``, the 429s."""
    signal: RateSignal | None = None
    """The latest answer's rate headers."""
    retry_after_s: float | None = None
    """The longest ``Retry-After`` among its 429s."""
    tokens: int = 0
    """Input and output tokens of its answers (their ``usage``)."""
    checked: tuple[str, ...] = ()
    """Models whose start-up check it had answered 200 since."""


@dataclass(frozen=True, slots=True)
class Share:
    """What one client may use until its next settle."""

    in_flight: int
    requests_per_minute: float | None
    """None: no rate known, only ``in_flight`` bounds it."""
    paused_until: float
    """Epoch seconds before which it sends nothing (0: no pause)."""
    checked: frozenset[str] = frozenset()
    """Models a client of the run checked within :data:`CHECK_FRESH_S`: not to be checked again."""


def fallback_share(caps: Caps) -> Share:
    """A client that cannot settle (the file unreadable, its lock held too long): one request at once, and a
    tenth of a stated rate; small enough that many such clients stay safe."""
    rate = None if caps.requests_per_minute is None else max(1.0, caps.requests_per_minute / 10)
    return Share(in_flight=1, requests_per_minute=rate, paused_until=0.0)


def _learned(seen: int | None, before: int | None, cap: int | None) -> int | None:
    value = seen if seen is not None and seen > 0 else before
    if cap is not None:
        value = cap if value is None else min(value, cap)
    return value


def settle(
    state: KeyBudgetState | None, key: str, report: Report, caps: Caps, now: float
) -> tuple[KeyBudgetState, Share]:
    """The key's budget after ``report`` at ``now`` (epoch seconds), and the reporting client's share of it."""
    start = min(START_CEILING, float(caps.in_flight)) if caps.in_flight else START_CEILING
    state = state or KeyBudgetState(key=key, ceiling=start)
    signal = report.signal or RateSignal()
    rpm = _learned(signal.requests_limit, state.requests_per_minute, caps.requests_per_minute)
    tpm = _learned(signal.tokens_limit, state.tokens_per_minute, caps.tokens_per_minute)
    paused = state.paused_until
    if report.limited and report.retry_after_s is not None:
        paused = max(paused, now + report.retry_after_s)
    for remaining, reset in (
        (signal.requests_remaining, signal.requests_reset_s),
        (signal.tokens_remaining, signal.tokens_reset_s),
    ):
        if remaining == 0 and reset is not None:  # the window is spent: wait for it rather than for a 429
            paused = max(paused, now + reset)
    members = {m: v for m, v in state.members.items() if m != report.member and now - v.updated_at <= STALE_S}
    if report.demand > 0 or report.in_flight > 0:
        members[report.member] = BudgetMember(updated_at=now, demand=report.demand, in_flight=report.in_flight)
    total = sum(m.demand for m in members.values())
    ceiling, decreased = state.ceiling, state.decreased_at
    if report.limited:
        if now - decreased >= DECREASE_GAP_S:
            ceiling, decreased = max(1.0, ceiling * DECREASE), now
    elif report.answered and total > ceiling:  # wanted more than it had, and no 429: one more per ceiling answers
        ceiling += report.answered / ceiling
    if caps.in_flight is not None:
        ceiling = min(ceiling, float(caps.in_flight))
    seen = {**state.checked, **dict.fromkeys(report.checked, now)}
    fresh = {model: at for model, at in seen.items() if now - at <= CHECK_FRESH_S}
    state = KeyBudgetState(
        key=key,
        ceiling=max(1.0, ceiling),
        requests_per_minute=rpm,
        tokens_per_minute=tpm,
        paused_until=paused,
        decreased_at=decreased,
        answered=state.answered + report.answered,
        limited=state.limited + report.limited,
        tokens=state.tokens + report.tokens,
        checked=fresh,
        members=members,
    )
    return state, _share(state, report.member, paused)


def phase(member: str) -> float:
    """A member's fixed place in ``[0, 1)``: where in a spacing or a turn it goes, so that clients told the same
    thing at once do not all act at the same moment."""
    return int(hashlib.sha256(member.encode()).hexdigest()[:8], 16) / 2**32


def slots(state: KeyBudgetState) -> dict[str, int]:
    """The key's requests at once (``floor(ceiling)``, at least one) dealt to its members in proportion to what
    each wants, whole requests only: each its whole part, then the remainders, largest first, ties in a fixed order
    (:func:`phase`), so every member computes the same deal from the same state and their sum never exceeds it."""
    wanting = [m for m, v in state.members.items() if v.demand > 0]
    total = sum(state.members[m].demand for m in wanting)
    if not wanting:
        return {}
    count = max(1, math.floor(state.ceiling))
    parts = {m: count * state.members[m].demand / total for m in wanting}
    dealt = {m: math.floor(p) for m, p in parts.items()}
    order = sorted(wanting, key=lambda m: (-(parts[m] - dealt[m]), phase(m), m))
    for m in order[: count - sum(dealt.values())]:
        dealt[m] += 1
    return dealt


def request_rate(state: KeyBudgetState) -> float | None:
    """The key's requests a minute: its known requests a minute, and its tokens a minute over the tokens an answer
    has cost so far (once answers are known), whichever is lower; None when neither is known."""
    rates: list[float] = []
    if state.requests_per_minute is not None:
        rates.append(float(state.requests_per_minute))
    ok = state.answered - state.limited
    if state.tokens_per_minute is not None and ok > 0 and state.tokens > 0:
        rates.append(max(1.0, state.tokens_per_minute / (state.tokens / ok)))
    return min(rates) if rates else None


def _share(state: KeyBudgetState, member: str, paused: float) -> Share:
    """A client's part of the key: its slots (:func:`slots`), and of the requests a minute (:func:`request_rate`)
    the same share as of the slots (a client without a slot sends nothing until a later settle gives it one)."""
    dealt = slots(state)
    mine = dealt.get(member, 0)
    rpm = request_rate(state)
    rate = None if rpm is None else rpm * mine / max(1, sum(dealt.values()))
    return Share(in_flight=mine, requests_per_minute=rate, paused_until=paused, checked=frozenset(state.checked))


class Pacer:
    """A client's admission under its :class:`Share`: at most ``in_flight`` at once, not before the pause ends, and
    (a rate known) one request every ``60 / requests_per_minute`` seconds, starting at the member's
    :func:`phase` of that spacing, so that the clients of a key send evenly rather than in bursts."""

    def __init__(self, member: str, share: Share | None = None) -> None:
        self._phase = phase(member)
        self.share = share or Share(in_flight=0, requests_per_minute=None, paused_until=0.0)  # none before a settle
        self.next_at = 0.0

    def _spacing(self) -> float:
        rate = self.share.requests_per_minute
        return 60.0 / rate if rate else 0.0

    def update(self, share: Share, now: float) -> None:
        """A new share from a settle at ``now``."""
        had_rate = self.share.requests_per_minute
        self.share = share
        spacing = self._spacing()
        if share.paused_until > now:
            self.next_at = max(self.next_at, share.paused_until + self._phase * spacing)
        elif not had_rate and spacing:  # a rate from now on: the first request at its phase of the spacing
            self.next_at = max(self.next_at, now + self._phase * spacing)

    def ready(self, now: float, in_flight: int) -> bool:
        """Whether a request may be sent at ``now`` with ``in_flight`` of this client's already out."""
        return in_flight < self.share.in_flight and now >= self.share.paused_until and now >= self.next_at

    def sent(self, now: float) -> None:
        self.next_at = max(now, self.next_at) + self._spacing()

    def limited(self, now: float, retry_after_s: float | None) -> None:
        """A 429 answered: wait the provider's ``Retry-After`` (else a spacing or a second), plus this member's
        phase of a spacing."""
        wait = retry_after_s if retry_after_s is not None else max(1.0, self._spacing())
        self.next_at = max(self.next_at, now + wait + self._phase * max(1.0, self._spacing()))


def settle_file(path: Path, key: str, report: Report, caps: Caps, now: float) -> Share:
    """:func:`settle` through the key's file (read, settle, write, under its lock); :func:`fallback_share` when
    the file cannot be used (never an error: the client's rows matter more than its share)."""
    try:
        with exclusive_lock(path.with_name(path.name + ".lock"), wait_s=None):  # as long as another client settles
            try:
                state: KeyBudgetState | None = read_json(path, KeyBudgetState)
            except (FileNotFoundError, ConfigError):  # none yet, or damaged: the clients learn again
                state = None
            if state is not None and state.key != key:
                state = None
            state, share = settle(state, key, report, caps, now)
            atomic_write(path, encode(state))
            return share
    except (OSError, UnsafePathError):  # the folder or the file unusable, or a lock file not this user's own
        return fallback_share(caps)
