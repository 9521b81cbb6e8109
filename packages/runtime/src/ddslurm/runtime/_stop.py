"""The job's own end: the signal (scancel, the time-limit warning) that the controller's loops look at, and the
failure its running attempts record."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ddslurm.runtime.errors import RuntimeFailure


class InterruptedFailure(RuntimeFailure):
    reason = "cancelled"


class TimeLimitFailure(RuntimeFailure):
    reason = "time_limit"


@dataclass(slots=True)
class StopSignal:
    """Set from a signal handler; the controller's loops look at it."""

    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.event.set()

    def failure(self) -> RuntimeFailure:
        """Why the job stops, as its attempts record it: ``time_limit`` or ``cancelled``."""
        if self.reason == "time_limit":
            return TimeLimitFailure("the job reached its time-limit warning; stopped cleanly before the limit")
        return InterruptedFailure(f"the job was cancelled ({self.reason or 'signal'})")

    def check(self) -> None:
        """Raise :meth:`failure` once the signal has come."""
        if self.event.is_set():
            raise self.failure()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; raise :meth:`failure` as soon as the signal comes meanwhile."""
        if self.event.wait(seconds):
            raise self.failure()
