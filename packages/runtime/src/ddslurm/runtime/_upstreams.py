"""The replicas behind one proxy: what it knows of each (healthy, saturated, in flight, served, failed), how it
learns it (``GET /health`` and ``GET /metrics`` of each, without the token), and which one a request goes to.

Choice: least requests in flight among the healthy, non-saturated upstreams; ties go to the fewest requests
waiting (last scrape: vLLM's ``vllm:num_requests_waiting``, SGLang's ``sglang:num_queue_reqs``), then round-robin.
An upstream whose waiting queue exceeds ``max_waiting`` is skipped; when every healthy one is saturated a request
waits (without polling) until one is not. A health answer counts only from a listener proved to be this user's; a
verified upstream that refuses a connection has died, and counts again only once a probe proves its listener this
user's again (a replica the controller restarted); another user's listener is out for good. Everything here is
touched from the event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Sequence
from typing import Any, Final

import aiohttp

from ddslurm.runtime._listeners import (
    ListenerNotOursError,
    NothingListensError,
    check_own_listener,
    http_base,
    socket_path,
)
from ddslurm.runtime._peer_connector import OwnPeerConnector, disowned

_WAITING_METRICS: Final = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
"""The gauge of requests waiting in the engine's queue: vLLM's, SGLang's (a replica exposes its engine's)."""
# Below uvicorn's (and so vLLM's) 5 s keep-alive, so the pool rarely reuses a connection the server is closing.
_POOL_KEEPALIVE_S: Final = 3.0


def parse_waiting(text: str) -> int:
    """Sum of the waiting gauges (``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``: whichever the replica
    exposes) over all their label sets in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(_WAITING_METRICS):
            continue
        name = next(m for m in _WAITING_METRICS if line.startswith(m))
        rest = line[len(name) :]
        if rest.startswith("{"):
            rest = rest[rest.rfind("}") + 1 :]
        elif not rest.startswith((" ", "\t")):
            continue  # another metric whose name merely starts the same way
        fields = rest.split()
        if fields:
            with contextlib.suppress(ValueError):
                total += float(fields[0])
    return int(total)


class Upstream:
    """One replica and what the proxy knows about it (only touched from the event loop)."""

    __slots__ = (
        "base",
        "dead",
        "failed",
        "healthy",
        "in_flight",
        "metrics_refused",
        "probe_interval_s",
        "probes",
        "recheck",
        "served",
        "session",
        "url",
        "verified",
        "waiting",
    )

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.base = http_base(self.url)
        self.session: aiohttp.ClientSession | None = None  # pooled connections for forwarded requests
        self.probes: aiohttp.ClientSession | None = None  # a fresh connection per /health probe or /metrics scrape
        self.healthy = False
        self.verified = False  # its listener was proved to be this user's (since it last refused a connection)
        self.dead = False  # another user's listener: never probed or chosen again
        self.in_flight = 0
        self.waiting = 0
        self.served = 0
        self.failed = 0
        self.recheck = asyncio.Event()  # set to probe /health now instead of after the interval
        self.probe_interval_s = 0.0  # how long its health loop waits before the next probe (0: not started)
        self.metrics_refused: int | None = None  # the status (401, 403) of its last /metrics scrape, if refused

    def describe(self, max_waiting: int) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "dead": self.dead,
            "saturated": self.waiting > max_waiting,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "served": self.served,
            "failed": self.failed,
            "probe_interval_s": self.probe_interval_s,
            "metrics_refused": self.metrics_refused,
        }


def _refused(exc: BaseException) -> bool:
    """The connection was refused: nothing listens on the upstream's port (or socket) any more."""
    return isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno in (errno.ECONNREFUSED, errno.ENOENT)


def _connector(url: str, **options: Any) -> aiohttp.BaseConnector:
    """A connection pool to one upstream: over its Unix-domain socket (in a directory only this user can enter), or
    TCP, each new connection proved accepted by this user's listener before it carries anything
    (:class:`~ddslurm.runtime._peer_connector.OwnPeerConnector`)."""
    path = socket_path(url)
    if path is not None:
        return aiohttp.UnixConnector(path=str(path), **options)
    return OwnPeerConnector(**options)


class Upstreams:
    """Every upstream of one proxy and the loops that probe them. ``open()``, ``await probe()`` (once, before the
    proxy listens), ``watch()`` (the probe loops), ``await close()``."""

    def __init__(
        self,
        urls: Sequence[str],
        logger: Any,
        *,
        max_waiting: int,
        health_interval: float,
        unhealthy_interval: float,
        metrics_interval: float,
        unavailable_grace: float,
        connect_timeout: float,
        probe_timeout: float,
        engine: str = "vllm",
        token: str | None = None,
    ) -> None:
        self._all = [Upstream(url) for url in urls]
        self._engine = engine
        """Whose replicas: SGLang's ``/health`` generates, so an SGLang upstream is probed on ``/v1/models``."""
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        """Sent only to a listener proved this user's: SGLang's ``/v1/models``, and ``/metrics`` (in case the
        engine guards it)."""
        self._log = logger
        self._max_waiting = max_waiting
        self._health_interval = health_interval
        self._unhealthy_interval = unhealthy_interval
        self._metrics_interval = metrics_interval
        self._unavailable_grace = unavailable_grace
        self._connect_timeout = connect_timeout
        self._probe_timeout = probe_timeout
        self._next = 0  # round-robin start for ties
        self._admitting = 0  # requests waiting for an upstream to have room (or to be healthy)
        self._changed = asyncio.Event()  # replaced on every health/saturation change; waiters hold the old one
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        return len(self._all)

    # -- lifecycle --------------------------------------------------------------------------------

    def open(self) -> None:
        """The connection pools: one for forwarded requests per upstream, and one for its probes."""
        for up in self._all:
            up.session = aiohttp.ClientSession(
                connector=_connector(up.url, limit=0, limit_per_host=0, keepalive_timeout=_POOL_KEEPALIVE_S),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
                trust_env=False,
            )
            # A fresh connection per probe: it tells whether the upstream accepts connections now.
            up.probes = aiohttp.ClientSession(
                connector=_connector(up.url, limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=self._probe_timeout),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,  # the token only per request, once the listener is proved this user's
            )

    async def probe(self) -> None:
        """Probe every upstream's health once, then scrape the healthy ones' queues (not logged one by one)."""
        await asyncio.gather(*(self._probe_health(up, announce=False) for up in self._all))
        await asyncio.gather(*(self._scrape(up) for up in self._all if up.healthy))

    def watch(self) -> None:
        """Start the probe loops: health every ``health_interval`` while healthy, every ``unhealthy_interval``
        while not (loading, or failed; at once after a failure), queues every ``metrics_interval``."""
        for up in self._all:
            self._tasks.append(asyncio.create_task(self._health_loop(up)))
            self._tasks.append(asyncio.create_task(self._metrics_loop(up)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for up in self._all:
            for session in (up.session, up.probes):
                if session is not None:
                    await session.close()
            up.session = up.probes = None

    # -- what is known ----------------------------------------------------------------------------

    def healthy(self) -> list[str]:
        return [up.url for up in self._all if up.healthy]

    def served(self) -> dict[str, int]:
        return {up.url: up.served for up in self._all}

    def failed(self) -> dict[str, int]:
        return {up.url: up.failed for up in self._all}

    def describe(self) -> dict[str, Any]:
        return {
            "max_waiting": self._max_waiting,
            "admitting": self._admitting,
            "upstreams": [up.describe(self._max_waiting) for up in self._all],
        }

    # -- upstream state ---------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _set_health(self, up: Upstream, healthy: bool, reason: str, *, announce: bool = True) -> None:
        healthy = healthy and not up.dead
        if up.healthy == healthy:
            return
        up.healthy = healthy
        if not healthy:
            up.waiting = 0  # stale once it is back; the first scrape after recovery sets it again
        if announce:  # the initial probe's outcome is in proxy.started
            if healthy:
                self._log.info("proxy.upstream_healthy", upstream=up.url)
            else:
                self._log.warning("proxy.upstream_unhealthy", upstream=up.url, reason=reason)
        self._notify()

    def request_failed(self, up: Upstream, exc: BaseException, where: str) -> None:
        """A request to ``up`` failed ``where``: it is unhealthy until a probe says otherwise (and proves its
        listener this user's again if it refused the connection), and is probed again at once."""
        up.failed += 1
        self._connection_failed(up, exc)
        self._set_health(up, False, f"{where}: {type(exc).__name__}: {exc}")
        up.recheck.set()

    def _gone(self, up: Upstream) -> None:
        """A verified upstream that refuses connections has died: its port is free for anyone to take, so it is
        chosen again only once a probe has proved its listener this user's again (the controller restarts a dead
        replica on the same listener, ``server.restarts``); another user's listener there is out for good."""
        if up.verified and not up.dead:
            up.verified = False
            self._log.warning(
                "proxy.upstream_gone", upstream=up.url, reason="its listener has gone; chosen again once proved ours"
            )

    async def _probe_health(self, up: Upstream, *, announce: bool = True) -> None:
        """``GET /health`` without the token; an answer counts only from a listener proved to be this user's
        (:func:`~ddslurm.runtime._listeners.check_own_listener`): another user's is out for good. An SGLang
        upstream, whose ``/health`` is a one-token generation (slow, and 503 under load), is asked ``/v1/models``
        instead, which does not generate but wants the token: its listener is proved first."""
        if up.dead:
            return
        assert up.probes is not None
        if self._engine == "sglang":
            healthy, reason = await self._ask_models(up)
            self._set_health(up, healthy, reason, announce=announce)
            return
        try:
            async with up.probes.get(up.base + "/health") as response:
                healthy, reason = response.status == 200, f"/health answered {response.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._connection_failed(up, exc)
            healthy, reason = False, f"/health failed: {type(exc).__name__}: {exc}"
        if healthy:
            healthy, reason = self._prove(up, reason)
        self._set_health(up, healthy, reason, announce=announce)

    def _prove(self, up: Upstream, reason: str) -> tuple[bool, str]:
        """Whether the upstream's listener is this user's (then it is ``verified``); another user's is dead for
        good, nothing listening is merely not healthy (gone)."""
        try:
            check_own_listener(up.url)
        except ListenerNotOursError as exc:
            self._disown(up, exc)
            return False, exc.message
        up.verified = True
        return True, reason

    def _connection_failed(self, up: Upstream, exc: BaseException) -> None:
        """What a request's or a probe's failure ``exc`` says of the upstream: refused (gone), or a new connection
        that another user's listener (or none) accepted (:meth:`_disown`)."""
        if _refused(exc):
            self._gone(up)
        if (failure := disowned(exc)) is not None:
            self._disown(up, failure)

    def _disown(self, up: Upstream, failure: ListenerNotOursError) -> None:
        """What listens on the upstream's port, or what accepted a connection to it, is not this user's: nothing
        (gone: its replica died), or another user's (dead for good)."""
        if isinstance(failure, NothingListensError):
            self._gone(up)
            return
        if not up.dead:
            up.dead = True
            self._log.warning("proxy.upstream_dead", upstream=up.url, reason=failure.message)

    async def _ask_models(self, up: Upstream) -> tuple[bool, str]:
        """An SGLang upstream's probe: its listener proved this user's, then ``GET /v1/models`` with the token."""
        assert up.probes is not None
        proved, reason = self._prove(up, "")
        if not proved:
            return False, reason
        try:
            async with up.probes.get(up.base + "/v1/models", headers=self._auth) as response:
                return response.status == 200, f"/v1/models answered {response.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._connection_failed(up, exc)
            return False, f"/v1/models failed: {type(exc).__name__}: {exc}"

    async def _scrape(self, up: Upstream) -> None:
        """The upstream's waiting queue from ``GET /metrics``, with the token (its listener proved this user's
        first): neither engine guards ``/metrics`` today, but a proposed vLLM change would put it behind the key,
        and a refused scrape would read as an empty queue, backpressure silently off. A 401 or 403 is logged
        once (``proxy.metrics_refused``) and shown in ``describe()`` (``metrics_refused``)."""
        assert up.probes is not None
        headers = self._auth
        if headers:
            try:
                check_own_listener(up.url)
            except ListenerNotOursError:
                headers = {}  # the health probe deals with it; the token goes nowhere unproved
        status = None
        try:
            async with up.probes.get(up.base + "/metrics", headers=headers) as response:
                status = response.status
                waiting = parse_waiting(await response.text()) if status == 200 else 0
        except (aiohttp.ClientError, OSError, TimeoutError, UnicodeDecodeError) as exc:
            waiting = 0  # advisory only: an unreadable queue never blocks admission
            if (failure := disowned(exc)) is not None:
                self._disown(up, failure)
        refused = status if status in (401, 403) else None
        if refused is not None and up.metrics_refused is None:
            self._log.warning(
                "proxy.metrics_refused",
                upstream=up.url,
                status=refused,
                why="the replica's /metrics refused the scrape: its waiting queue is unknown, no backpressure",
            )
        up.metrics_refused = refused
        limit = self._max_waiting
        was_saturated = up.waiting > limit
        up.waiting = waiting
        if was_saturated != (waiting > limit):
            self._log.debug("proxy.upstream_saturation", upstream=up.url, waiting=waiting, saturated=waiting > limit)
            self._notify()

    async def _health_loop(self, up: Upstream) -> None:
        while not up.dead:
            interval = self._health_interval if up.healthy else self._unhealthy_interval
            up.probe_interval_s = interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await up.recheck.wait()
            up.recheck.clear()
            await self._probe_health(up)

    async def _metrics_loop(self, up: Upstream) -> None:
        interval = self._metrics_interval
        while not up.dead:
            await asyncio.sleep(interval)
            if up.healthy:
                await self._scrape(up)

    # -- choosing one -----------------------------------------------------------------------------

    def pick(self) -> tuple[Upstream | None, bool]:
        """(least-loaded healthy non-saturated upstream or None, whether any upstream is healthy)."""
        ups = self._all
        n = len(ups)
        start = self._next
        self._next = (start + 1) % n
        limit = self._max_waiting
        best: Upstream | None = None
        any_healthy = False
        for i in range(n):
            up = ups[(start + i) % n]
            if not up.healthy:
                continue
            any_healthy = True
            if up.waiting > limit:
                continue
            if best is None or (up.in_flight, up.waiting) < (best.in_flight, best.waiting):
                best = up
        return best, any_healthy

    async def admit(self, deadline: float) -> Upstream | str:
        """Wait for an upstream to become usable; the reason for a 503 if none does in time. While it waits the
        request counts in ``describe()["admitting"]``."""
        self._admitting += 1
        try:
            return await self._admit(deadline)
        finally:
            self._admitting -= 1

    async def _admit(self, deadline: float) -> Upstream | str:
        loop = asyncio.get_running_loop()
        grace_until: float | None = None
        while True:
            changed = self._changed
            up, any_healthy = self.pick()
            if up is not None:
                return up
            now = loop.time()
            if any_healthy:
                grace_until = None
                until, reason = deadline, "every healthy upstream is saturated (requests waiting in its queue)"
            else:
                if grace_until is None:
                    grace_until = now + self._unavailable_grace
                until, reason = min(grace_until, deadline), "no healthy upstream"
            if until <= now:
                return reason
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until - now):
                    await changed.wait()
