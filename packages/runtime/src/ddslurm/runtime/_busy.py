"""When one model server (a replica) had work: the spans in which at least one request was in flight to it
through its proxy (one :class:`BusyLog` per upstream), appended to the replica's ``busy-<alias>-<i>.jsonl``
(:func:`ddslurm.config.busy_log`, one :class:`~ddslurm.config.BusySpan` a line) for the report's GPU time
generating (docs/performance.md).

Cost per request: a counter and, when it goes 0 → 1 or 1 → 0, one clock reading; spans that touch are merged in
memory and written at most once per ``flush_every`` seconds (when one ends) and when the proxy stops, so an idle
gap of a fraction of a millisecond is one line, not one per request. Only times are written, never a request."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ddslurm.config import BusySpan, encode, open_append


class BusyLog:
    """Counts requests in flight (:meth:`enter`, :meth:`leave`) and records the spans in which there was one.
    ``path`` None records nothing (a proxy run without ``--busy-log``); ``clock``: seconds since the epoch."""

    def __init__(self, path: Path | None, *, clock: Callable[[], float] = time.time, flush_every: float = 1.0) -> None:
        self._path = path
        self._clock = clock
        self._flush_every = flush_every
        self._in_flight = 0
        self._since = 0.0
        self._spans: list[tuple[float, float]] = []
        """Ended spans not written yet, merged where they touch."""
        self._flushed = clock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def enter(self) -> None:
        if self._in_flight == 0:
            self._since = self._clock()
        self._in_flight += 1

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight > 0:
            return
        now = self._clock()
        self._end(now)
        if now - self._flushed >= self._flush_every:
            self.flush()

    def _end(self, now: float) -> None:
        if self._spans and self._since <= self._spans[-1][1]:
            self._spans[-1] = (self._spans[-1][0], max(now, self._spans[-1][1]))
        else:
            self._spans.append((self._since, now))

    def close(self) -> None:
        """End the span in progress (its requests are cut off by the stop) and write what is left."""
        if self._in_flight > 0:
            now = self._clock()
            self._end(now)
            self._since = now
        self.flush()

    def flush(self) -> None:
        self._flushed = self._clock()
        if self._path is None or not self._spans:
            self._spans.clear()
            return
        lines = b"".join(encode(BusySpan(start=start, end=end)) for start, end in self._spans)
        self._spans.clear()
        with open_append(self._path) as stream:
            stream.write(lines)
