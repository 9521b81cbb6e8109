"""The fault model: which chat request crashes the server, gets a 500/429 or a 200 without ``choices``,
deterministic given the seed."""

from __future__ import annotations

import enum
import random

from fake_vllm.settings import Settings


class Fault(enum.Enum):
    NONE = "none"
    CRASH = "crash"
    ERROR_500 = "500"
    ERROR_429 = "429"
    NO_CHOICES = "no-choices"


class FaultInjector:
    """Decides the fate of each accepted chat request in arrival order.

    Request number ``k`` (1-based) is ``CRASH`` when ``k > crash_after``: it is never answered, and the process
    dies once the first ``crash_after`` have their answers (``ServerState.answer_counted``). Otherwise one uniform draw
    from ``random.Random(seed)`` per request picks 500 (``u < error_rate``), 429
    (``u < error_rate + rate_429``), a 200 answer without ``choices`` (``u < error_rate + rate_429 +
    no_choices_rate``) or success, so a sequential client sees the same faults on every run.
    """

    def __init__(self, settings: Settings) -> None:
        self._crash_after = settings.crash_after
        self._error_rate = settings.error_rate
        self._rate_429 = settings.rate_429
        self._no_choices_rate = settings.no_choices_rate
        self._rng = random.Random(settings.seed)
        self.chat_requests = 0

    def next_chat_request(self) -> Fault:
        self.chat_requests += 1
        if self._crash_after is not None and self.chat_requests > self._crash_after:
            return Fault.CRASH
        draw = self._rng.random()
        if draw < self._error_rate:
            return Fault.ERROR_500
        if draw < self._error_rate + self._rate_429:
            return Fault.ERROR_429
        if draw < self._error_rate + self._rate_429 + self._no_choices_rate:
            return Fault.NO_CHOICES
        return Fault.NONE
