"""Per-process state the handlers share: readiness, metrics, faults, the request log, the capacity's slots, the
gate, the rate limiter, and the crash after ``crash_after`` answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import NoReturn

from starlette.background import BackgroundTask
from starlette.responses import Response

from fake_vllm.faults import FaultInjector
from fake_vllm.gate import Gate
from fake_vllm.metrics import Metrics
from fake_vllm.ratelimit import RateLimiter
from fake_vllm.request_log import RequestLog
from fake_vllm.settings import Settings


class ServerState:
    """Per-process state shared by the handlers (only touched from the event loop)."""

    def __init__(self, settings: Settings, crash: Callable[[str], NoReturn]) -> None:
        self.settings = settings
        self.crash = crash
        self.ready = False
        self.engine_dead = False  # ``--fake-engine-process``: the engine's process has died (/health 503 for good)
        self.metrics = Metrics(model_name=settings.primary_name, capacity=settings.capacity, engine=settings.engine)
        self.faults = FaultInjector(settings)
        self.request_log = RequestLog(settings.request_log) if settings.request_log else None
        self.slots = asyncio.Semaphore(settings.capacity) if settings.capacity > 0 else None
        self.gate = Gate(settings.gate) if settings.gate is not None else None
        self.created = int(time.time())
        self.limiter = (
            RateLimiter(
                requests_per_minute=settings.rate_limit_rpm,
                tokens_per_minute=settings.rate_limit_tpm,
                in_flight=settings.rate_limit_in_flight,
                style=settings.rate_headers,  # type: ignore[arg-type]
            )
            if settings.rate_limited
            else None
        )
        self.answered = 0  # of the first ``crash_after`` chat requests: how many have their answer
        self.doomed = asyncio.Event()  # never set: a request after the ``crash_after``-th waits for the crash
        self.output = asyncio.Event()
        """Set (and replaced) whenever a generation produces output: what SGLang's generating /health waits for."""

    def produced(self) -> None:
        """A generation produced output (a chat answer, or a health probe's own token)."""
        self.output.set()
        self.output = asyncio.Event()

    def answer_counted(self, response: Response | None) -> None:
        """One of the first ``crash_after`` chat requests has its answer (``None``: it ended without one). The
        last of them ends the process once its answer is sent, so every life of a crashing server answers
        exactly ``crash_after`` requests, however many arrive at once, and the requests after them die with it."""
        crash_after = self.settings.crash_after
        if crash_after is None:
            return
        self.answered += 1
        if self.answered < crash_after:
            return
        reason = f"injected crash after answering {crash_after} chat requests (--fake-crash-after {crash_after})"
        if response is None:
            self.crash(reason)
        response.background = BackgroundTask(self.crash, reason)
