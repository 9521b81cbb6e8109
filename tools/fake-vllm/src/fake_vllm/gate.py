"""The gate: a test decides, by writing a file, how many chat requests the server may answer.

A test injects its fault at the moment it names ("once shard 1 has a batch on disk"), never "after 3 s": with
``--fake-gate PATH`` every chat request waits, before anything else happens to it (faults, the latency model),
until the file lets it through. What the file holds:

- nothing, or no file at all: every request passes (the gate is open);
- a number N: the first N chat requests of this server pass, every later one waits (N may grow: waiting requests
  then pass in arrival order);
- ``hold``: no request passes that has not passed already.

A test that wants no shard to finish writes the number before the run starts, waits for the event it needs (the
request log has N lines, a batch is on disk), acts, then opens the gate (empties the file). Requests that wait are
counted in ``/metrics`` as waiting, as a queued request of the engine is."""

from __future__ import annotations

import asyncio
from pathlib import Path

POLL_S = 0.02
"""How often a waiting request reads the file again (only while one waits)."""


class Gate:
    """Admits chat requests in arrival order while the gate file allows; one per server process (event loop)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self.passed = 0
        self._queue = asyncio.Lock()  # binds to no loop until first used

    def _limit(self) -> int | None:
        """How many requests may have passed in all; None when the gate is open."""
        try:
            text = self._path.read_text().strip()
        except FileNotFoundError:
            return None
        if not text:
            return None
        if text == "hold":
            return self.passed
        if not text.isdigit():
            raise ValueError(f"{self._path}: a gate file holds nothing, a number of requests or 'hold', not {text!r}")
        return int(text)

    async def admit(self) -> None:
        """Return once this request may pass (requests pass in the order they arrived)."""
        async with self._queue:  # the first to arrive is the first to pass
            while True:
                limit = self._limit()
                if limit is None or self.passed < limit:
                    self.passed += 1
                    return
                await asyncio.sleep(POLL_S)

    async def wait_open(self) -> None:
        """Return once one more request would pass, behind those already waiting, without passing one: how a
        generation that is not a chat request (SGLang's generating ``/health``, :mod:`fake_vllm.sglang_health`)
        queues behind the held work. It takes none of the file's count."""
        async with self._queue:
            while (limit := self._limit()) is not None and self.passed >= limit:
                await asyncio.sleep(POLL_S)
