"""The client step's gate in front of its hosted providers (issue 36): Data Designer sends its hosted requests to a
loopback listener inside this same process, which admits them under the key's shared budget
(:mod:`ddslurm.runtime._key_budget`) and relays them to the provider unchanged.

    Data Designer ──► http://127.0.0.1:PORT/<secret>/<n>/chat/completions ──► gate (a thread of this process)
                                       └─ waits for its key's share, relays ──► the provider's endpoint

Everything the provider needs passes through as Data Designer sent it (the ``Authorization`` header with the key
included), so the key never leaves this process and the gate writes it nowhere; a path secret drawn per process
keeps other local users from sending through the gate. A 429 is not passed on while the key's budget can wait it
out: the gate pauses as the provider says (and tells the other clients, at its next settle) and sends the request
again, up to ``max_wait_s`` in all, so Data Designer's start-up health check and its requests see latency, not
429s. Every answer is counted per key and model (requests sent, answers, 429s, tokens from ``usage``) in the
attempt's ``hosted-usage.json`` (:class:`ddslurm.config.HostedUsage`), rewritten at every settle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

from ddslurm.config import (
    DD_DEFAULT_REQUEST_TIMEOUT_S,
    ConfigError,
    HostedUsage,
    KeyUsage,
    ProviderSnapshot,
    SnapshotModel,
    SnapshotProvider,
    atomic_write,
    budget_key,
    encode,
    make_private_dir,
    read_json,
    request_timeout_s,
)
from ddslurm.runtime._key_budget import INTERVAL_S, Caps, Pacer, Report, settle_file
from ddslurm.runtime._rate_headers import RateSignal, rate_signal

DEFAULT_TIMEOUT_S: Final = float(DD_DEFAULT_REQUEST_TIMEOUT_S)
_DROP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
     "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length", "expect", "content-encoding"}
)  # fmt: skip
MAX_WAIT_S = 600
"""How long the gate holds one request through the key's pauses and 429s before it passes the 429 on: added to
the hosted aliases' request timeouts in Data Designer (``recipe_with_models``), while the gate applies each
alias's own timeout to the provider's answer (504 when it passes)."""


def gate_wait_s(snapshot: ProviderSnapshot, endpoints: Mapping[str, str]) -> int:
    """:data:`MAX_WAIT_S` when ``endpoints`` put a hosted provider of ``snapshot`` behind a gate, else 0."""
    return MAX_WAIT_S if any(not p.local and p.name in endpoints for p in snapshot.providers) else 0


@dataclass
class _Key:
    """One key's state in this client: its pacer, what is out and waiting, what was seen since the last settle."""

    name: str
    path: Path
    pacer: Pacer
    caps: Caps = field(default_factory=Caps)
    in_flight: int = 0
    waiting: int = 0
    answered: int = 0
    limited: int = 0
    signal: RateSignal | None = None
    retry_after_s: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    usage: dict[str, KeyUsage] = field(default_factory=dict)

    def count(self, model: str, status: int, body: bytes | None) -> None:
        entry = self.usage.get(model) or KeyUsage(key=self.name, model=model)
        prompt = completion = 0
        if status == 200 and body:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                usage = json.loads(body).get("usage") or {}
                prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        self.usage[model] = KeyUsage(
            key=self.name,
            model=model,
            requests=entry.requests + 1,
            succeeded=entry.succeeded + (200 <= status < 300),
            limited=entry.limited + (status == 429),
            failed=entry.failed + (status >= 400 and status != 429),
            input_tokens=entry.input_tokens + prompt,
            output_tokens=entry.output_tokens + completion,
        )


class HostedGate:
    """Start with :meth:`running`: the endpoints Data Designer should use for each hosted provider, by name."""

    def __init__(
        self,
        providers: Sequence[SnapshotProvider],
        *,
        models: Sequence[SnapshotModel] = (),
        budgets: Path,
        member: str,
        usage_file: Path,
        caps: Mapping[str, Caps] | None = None,
        clock: Callable[[], float] = time.time,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self._providers = [p for p in providers if not p.local and p.endpoint]
        self._timeouts = {(m.provider, m.model): request_timeout_s(m.inference_parameters) for m in models}
        """Per provider and model, how long its answer may take (the alias's own timeout, Data Designer's default)."""
        self._budgets = budgets
        self._member = member
        self._usage_file = usage_file
        self._caps = dict(caps or {})
        self._clock = clock
        self._max_wait_s = max_wait_s
        self._secret = secrets.token_urlsafe(16)
        self._keys: dict[str, _Key] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._session: aiohttp.ClientSession

    @contextlib.contextmanager
    def running(self) -> Iterator[dict[str, str]]:
        """The gate's endpoints, by provider name, while it runs (none when no provider is hosted)."""
        if not self._providers:
            yield {}
            return
        started: dict[str, Any] = {}
        ready = threading.Event()
        thread = threading.Thread(target=self._serve, args=(started, ready), name="ddslurm-hosted-gate", daemon=True)
        thread.start()
        ready.wait()
        if "error" in started:
            raise started["error"]
        port = started["port"]
        try:
            yield {p.name: f"http://127.0.0.1:{port}/{self._secret}/{i}" for i, p in enumerate(self._providers)}
        finally:
            loop, stopping = self._loop, self._stopping
            if loop is not None and stopping is not None:
                loop.call_soon_threadsafe(stopping.set)
            thread.join(timeout=30)

    # -- the gate's thread ---------------------------------------------------------------------------------------

    def _serve(self, started: dict[str, Any], ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(started, ready))
        except BaseException as exc:  # reported to the caller if it happened before the gate was ready
            started.setdefault("error", exc)
            ready.set()
        finally:
            loop.close()

    async def _main(self, started: dict[str, Any], ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        for provider in self._providers:
            name = budget_key(provider.endpoint, provider.api_key_env)
            if name not in self._keys:
                caps = self._caps.get(provider.name, Caps())
                self._keys[name] = _Key(name, self._budgets / f"{name}.json", Pacer(self._member), caps)
        make_private_dir(self._budgets, exist_ok=True)
        with contextlib.suppress(FileNotFoundError, ConfigError):  # an earlier client run of the attempt: counted on
            for earlier in read_json(self._usage_file, HostedUsage).keys:
                if earlier.key in self._keys:
                    self._keys[earlier.key].usage[earlier.model] = earlier
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{secret}/{index}/{tail:.*}", self._relay)
        # a request Data Designer gave up on (its timeout) is cancelled here too: it holds no slot of the key
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
        # trust_env would read ~/.netrc (never the submitter's home): the proxy variables are read here instead
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False, auto_decompress=False) as session:
            self._session = session
            await site.start()
            started["port"] = runner.addresses[0][1]
            for key in self._keys.values():
                await self._settle(key)
            ready.set()
            settling = asyncio.ensure_future(self._settle_every())
            await self._stopping.wait()
            settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await settling
            await runner.cleanup()
            for key in self._keys.values():  # its share goes back to the others at once
                key.waiting = key.in_flight = 0
                await self._settle(key)

    async def _settle_every(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL_S)
            for key in self._keys.values():
                await self._settle(key)

    async def _settle(self, key: _Key) -> None:
        report = Report(
            self._member,
            demand=key.in_flight + key.waiting,
            in_flight=key.in_flight,
            answered=key.answered,
            limited=key.limited,
            signal=key.signal,
            retry_after_s=key.retry_after_s,
        )
        key.answered = key.limited = 0
        key.signal, key.retry_after_s = None, None
        now = self._clock()
        loop = asyncio.get_running_loop()
        share = await loop.run_in_executor(None, settle_file, key.path, key.name, report, key.caps, now)
        key.pacer.update(share, now)
        key.changed.set()
        await loop.run_in_executor(None, self._write_usage)

    def _write_usage(self) -> None:
        entries = tuple(u for k in self._keys.values() for u in k.usage.values())
        atomic_write(self._usage_file, encode(HostedUsage(keys=entries)))

    async def _admit(self, key: _Key, deadline: float) -> bool:
        """Wait until ``key``'s share lets one more request out (then it counts in flight); False at ``deadline``."""
        key.waiting += 1
        try:
            while True:
                now = self._clock()
                if key.pacer.ready(now, key.in_flight):
                    key.in_flight += 1
                    key.pacer.sent(now)
                    return True
                if now >= deadline:
                    return False
                until = max(key.pacer.next_at, key.pacer.share.paused_until)
                delay = until - now if until > now else INTERVAL_S  # blocked by its share: until it changes
                key.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(key.changed.wait(), timeout=min(max(delay, 0.01), deadline - now))
        finally:
            key.waiting -= 1

    def _done(self, key: _Key) -> None:
        key.in_flight -= 1
        key.changed.set()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["secret"] != self._secret:
            return web.json_response({"error": {"message": "not found", "type": "NotFound", "code": 404}}, status=404)
        try:
            provider = self._providers[int(request.match_info["index"])]
        except (ValueError, IndexError):
            return web.json_response({"error": {"message": "not found", "type": "NotFound", "code": 404}}, status=404)
        key = self._keys[budget_key(provider.endpoint, provider.api_key_env)]
        url = provider.endpoint.rstrip("/") + "/" + request.match_info["tail"]
        if request.query_string:
            url += "?" + request.query_string
        body = await request.read()
        model = _model_of(body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        deadline = self._clock() + self._max_wait_s
        while True:
            if not await self._admit(key, deadline):
                return web.json_response(
                    {"error": {"message": "the key's rate budget did not admit the request in time",
                               "type": "rate_limit_exceeded", "code": 429}},
                    status=429,
                )  # fmt: skip
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=60, sock_read=self._timeouts.get((provider.name, model), DEFAULT_TIMEOUT_S)
            )
            try:  # the slot is given back however the request ends (Data Designer gone: cancelled here)
                relay = self._session.request(
                    request.method, url, data=body, headers=headers, proxy=_proxy_for(url), timeout=timeout
                )
                async with relay as upstream:
                    payload = await upstream.read()
                    status = upstream.status
                    answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP}
                    signal = rate_signal(upstream.headers, _utc(self._clock()))
            except TimeoutError:
                return web.json_response(
                    {"error": {"message": f"the provider did not answer within {timeout.sock_read:g} s",
                               "type": "GatewayTimeout", "code": 504}},
                    status=504,
                )  # fmt: skip
            except aiohttp.ClientError as exc:
                return web.json_response(
                    {"error": {"message": f"the provider could not be reached: {type(exc).__name__}",
                               "type": "BadGateway", "code": 502}},
                    status=502,
                )  # fmt: skip
            finally:
                self._done(key)
            key.answered += 1
            key.signal = signal if not signal.empty else key.signal
            key.count(model, status, payload)
            if status == 429:
                key.limited += 1
                wait = signal.retry_after_s
                key.retry_after_s = max(key.retry_after_s or 0.0, wait or 0.0) or None
                key.pacer.limited(self._clock(), wait)
                if self._clock() < deadline:
                    continue  # waited out under the budget, then sent again
            return web.Response(status=status, body=payload, headers=answer_headers)


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``https_proxy``, ``no_proxy``, ...; never a file)."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):  # no_proxy (on Linux, the environment only)
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)


def _model_of(body: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        model = json.loads(body).get("model")
        if isinstance(model, str):
            return model
    return ""


def _utc(epoch: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC)
