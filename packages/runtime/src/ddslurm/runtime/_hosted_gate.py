"""The client step's gate in front of its hosted providers (issue 36): Data Designer sends its hosted requests to a
loopback listener inside this same process, which admits them under the key's shared budget
(:mod:`ddslurm.runtime._key_budget`) and relays them to the provider unchanged (but for a request id).

    Data Designer ──► http://127.0.0.1:PORT/<secret>/<n>/chat/completions ──► gate (a thread of this process)
                                       └─ waits for its key's share, relays ──► the provider's endpoint

Everything the provider needs passes through as Data Designer sent it (the ``Authorization`` header with the key
included), so the key never leaves this process and the gate writes it nowhere; a path secret drawn per process
keeps other local users from sending through the gate. A 429 is not passed on while the key's budget can wait it
out: the gate pauses as the provider says (and tells the other clients, at its next settle) and sends the request
again, up to ``max_wait_s`` in all, so Data Designer's requests see latency, not 429s. Before Data Designer starts,
the gate makes Data Designer's start-up health check itself, under the budget (:meth:`HostedGate.check`). Each
request it sends carries an ``X-Client-Request-Id`` (``<job>-<attempt>-<run>-<n>``), and one line is appended to the
attempt's ``hosted-requests.jsonl`` (:class:`ddslurm.config.HostedRequest`) when it is sent and one when it is
answered (status, ``usage`` tokens): the exact record every hosted figure is summed from, which a kill at any moment
leaves whole."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ddslurm.config import (
    DD_DEFAULT_REQUEST_TIMEOUT_S,
    HostedRequest,
    ProviderSnapshot,
    SnapshotModel,
    SnapshotProvider,
    budget_key,
    encode,
    make_private_dir,
    request_timeout_s,
)
from ddslurm.runtime._engine import CHECK_FAILS
from ddslurm.runtime._key_budget import INTERVAL_S, Caps, Pacer, Report, settle_file
from ddslurm.runtime._rate_headers import RateSignal, rate_signal

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import web

DEFAULT_TIMEOUT_S: Final = float(DD_DEFAULT_REQUEST_TIMEOUT_S)
_DROP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
     "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length", "expect", "content-encoding"}
)  # fmt: skip
MAX_WAIT_S = 600
"""How long the gate holds one request through the key's pauses and 429s before it passes the 429 on: added to
the hosted aliases' request timeouts in Data Designer (``recipe_with_models``), while the gate applies each
alias's own timeout to the provider's answer (504 when it passes)."""


MAX_RECONNECTS = 2
"""How often one request is sent again at once when its connection turned out closed before any answer."""
"""Errors of a connection the provider closed (a kept-alive one it timed out): the request is sent again on a new
connection rather than answered 502."""


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
    tokens: int = 0
    checked: set[str] = field(default_factory=set)
    """Models whose start-up check was answered 200 since the last settle."""
    signal: RateSignal | None = None
    retry_after_s: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def count(self, status: int, body: bytes | None) -> tuple[int, int]:
        """Count one answer's tokens for the key's budget; its input and output tokens (its ``usage``; 0 for an
        error)."""
        prompt = completion = 0
        if status == 200 and body:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                usage = json.loads(body).get("usage") or {}
                prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        self.tokens += prompt + completion
        return prompt, completion


class HostedGate:
    """Start with :meth:`running`: the endpoints Data Designer should use for each hosted provider, by name."""

    def __init__(
        self,
        providers: Sequence[SnapshotProvider],
        *,
        models: Sequence[SnapshotModel] = (),
        budgets: Path,
        member: str,
        requests_file: Path | None = None,
        caps: Mapping[str, Caps] | None = None,
        clock: Callable[[], float] = time.time,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self._providers = [p for p in providers if not p.local and p.endpoint]
        self._timeouts = {(m.provider, m.model): request_timeout_s(m.inference_parameters) for m in models}
        """Per provider and model, how long its answer may take (the alias's own timeout, Data Designer's default)."""
        self._budgets = budgets
        self._member = member
        self._requests_file = requests_file
        self._journal_fd: int | None = None
        self._ids = itertools.count(1)
        self._run = secrets.token_hex(3)
        """Request ids are ``<member>-<run>-<n>``: unique across the client runs of one attempt."""
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
        import aiohttp
        from aiohttp import web

        self._stopping = asyncio.Event()
        for provider in self._providers:
            name = budget_key(provider.endpoint, provider.api_key_env)
            if name not in self._keys:
                caps = self._caps.get(provider.name, Caps())
                self._keys[name] = _Key(name, self._budgets / f"{name}.json", Pacer(self._member), caps)
        make_private_dir(self._budgets, exist_ok=True)
        if self._requests_file is not None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            self._journal_fd = os.open(self._requests_file, flags, 0o600)
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
            if self._journal_fd is not None:
                os.close(self._journal_fd)
                self._journal_fd = None

    def _journal(self, line: HostedRequest) -> None:
        """Append one line to the attempt's request record: one write, as it happens (a kill loses none)."""
        if self._journal_fd is not None:
            os.write(self._journal_fd, encode(line))  # one line, its newline included

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
            tokens=key.tokens,
            checked=tuple(sorted(key.checked)),
        )
        key.answered = key.limited = key.tokens = 0
        key.checked = set()
        key.signal, key.retry_after_s = None, None
        now = self._clock()
        loop = asyncio.get_running_loop()
        share = await loop.run_in_executor(None, settle_file, key.path, key.name, report, key.caps, now)
        key.pacer.update(share, now)
        key.changed.set()

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
        from aiohttp import web

        if request.match_info["secret"] != self._secret:
            return web.json_response({"error": {"message": "not found", "type": "NotFound", "code": 404}}, status=404)
        try:
            provider = self._providers[int(request.match_info["index"])]
        except (ValueError, IndexError):
            return web.json_response({"error": {"message": "not found", "type": "NotFound", "code": 404}}, status=404)
        tail = request.match_info["tail"] + (f"?{request.query_string}" if request.query_string else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        answer = await self._forward(provider, request.method, tail, await request.read(), headers)
        return web.Response(status=answer.status, body=answer.body, headers=answer.headers)

    async def _forward(
        self, provider: SnapshotProvider, method: str, tail: str, body: bytes, headers: Mapping[str, str]
    ) -> _Answer:
        """One request to ``provider`` under its key's budget: admitted by the key's share, sent, its 429s waited
        out and sent again until ``max_wait_s`` has passed; what the provider (or the gate, for a budget that
        never admitted it, a timeout or an unreachable provider) answered."""
        import aiohttp

        key = self._keys[budget_key(provider.endpoint, provider.api_key_env)]
        url = provider.endpoint.rstrip("/") + "/" + tail
        model = _model_of(body)
        deadline = self._clock() + self._max_wait_s
        headers = {k: v for k, v in headers.items() if k.lower() != "x-client-request-id"}
        reconnects = 0
        while True:
            if not await self._admit(key, deadline):
                refusal = "the key's rate budget did not admit the request in time"
                return _Answer.error(429, refusal, "rate_limit_exceeded")
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=60, sock_read=self._timeouts.get((provider.name, model), DEFAULT_TIMEOUT_S)
            )
            rid = f"{self._member}-{self._run}-{next(self._ids)}"
            sent = HostedRequest(id=rid, key=key.name, model=model, at=self._clock())
            self._journal(sent)
            try:  # the slot is given back however the request ends (Data Designer gone: cancelled here)
                relay = self._session.request(
                    method,
                    url,
                    data=body,
                    headers={**headers, "X-Client-Request-Id": rid},
                    proxy=_proxy_for(url),
                    timeout=timeout,
                )
                async with relay as upstream:
                    payload = await upstream.read()
                    status = upstream.status
                    answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP}
                    signal = rate_signal(upstream.headers, _utc(self._clock()))
            except TimeoutError:
                self._journal(msgspec.structs.replace(sent, at=self._clock(), status=504, gate=True))
                late = f"the provider did not answer within {timeout.sock_read:g} s"
                return _Answer.error(504, late, "GatewayTimeout")
            except aiohttp.ClientError as exc:
                self._journal(msgspec.structs.replace(sent, at=self._clock(), status=502, gate=True))
                if (
                    isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
                    and reconnects < MAX_RECONNECTS
                ):
                    reconnects += 1  # a kept-alive connection the provider had closed: again, on a new one
                    continue
                return _Answer.error(502, f"the provider could not be reached: {type(exc).__name__}", "BadGateway")
            finally:
                self._done(key)
            key.answered += 1
            key.signal = signal if not signal.empty else key.signal
            tokens_in, tokens_out = key.count(status, payload)
            self._journal(
                msgspec.structs.replace(
                    sent, at=self._clock(), status=status, input_tokens=tokens_in, output_tokens=tokens_out
                )
            )
            if status == 429:
                key.limited += 1
                wait = signal.retry_after_s
                key.retry_after_s = max(key.retry_after_s or 0.0, wait or 0.0) or None
                key.pacer.limited(self._clock(), wait)
                if self._clock() < deadline:
                    continue  # waited out under the budget, then sent again
            return _Answer(status, payload, answer_headers)

    async def _probe(self, provider: SnapshotProvider, model: SnapshotModel, env: Mapping[str, str]) -> _Answer:
        """Data Designer's start-up request for ``model`` ("Hello!" to a chat model, one text to an embedder), sent
        as Data Designer sends it: the key from the environment, the provider's extra headers and body."""
        params = dict(model.inference_parameters or {})
        embedding = params.get("generation_type") == "embedding"
        body: dict[str, Any] = {"model": model.model}
        if embedding:
            body["input"] = ["Hello!"]
        else:
            body["messages"] = [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Hello!"},
            ]
            body.update({k: params[k] for k in ("max_tokens", "temperature", "top_p") if params.get(k) is not None})
        body.update(provider.extra_body or {})
        body.update(params.get("extra_body") or {})
        headers = {"Content-Type": "application/json", **(provider.extra_headers or {})}
        if provider.api_key_env and env.get(provider.api_key_env):
            headers["Authorization"] = f"Bearer {env[provider.api_key_env]}"
        tail = "embeddings" if embedding else "chat/completions"
        answer = await self._forward(provider, "POST", tail, json.dumps(body).encode(), headers)
        if 200 <= answer.status < 300:
            self._keys[budget_key(provider.endpoint, provider.api_key_env)].checked.add(model.model)
        return answer

    def checker(self, env: Mapping[str, str]) -> Callable[[Sequence[SnapshotModel]], dict[str, int]]:
        """:meth:`check` with ``env``, each alias asked once per client run (a fill asks again for nothing)."""
        answered: dict[str, int] = {}

        def check(models: Sequence[SnapshotModel]) -> dict[str, int]:
            answered.update(self.check([m for m in models if m.alias not in answered], env))
            return {m.alias: answered[m.alias] for m in models if m.alias in answered}

        return check

    def check(self, models: Sequence[SnapshotModel], env: Mapping[str, str]) -> dict[str, int]:
        """Data Designer's start-up health check of ``models``, done here under each key's budget instead (Data
        Designer bounds its own at 180 s, which a key shared by many clients may need longer than to admit their
        first requests): per alias behind the gate, the status its provider answered. A model another client of
        the run had answered within :data:`~ddslurm.runtime._key_budget.CHECK_FRESH_S` (the key's budget says
        so) is not asked again: 200. An image model is left to Data Designer (its check generates an image); so
        is one whose config skips the check."""
        loop = self._loop
        providers = {p.name: p for p in self._providers}
        answered: dict[str, int] = {}
        for model in models:
            provider = providers.get(model.provider)
            kind = (model.inference_parameters or {}).get("generation_type", "chat-completion")
            if provider is None or model.skip_health_check or kind == "image" or loop is None:
                continue
            if model.model in self._keys[budget_key(provider.endpoint, provider.api_key_env)].pacer.share.checked:
                answered[model.alias] = 200  # a client of the run had it answered a moment ago: once for the run
                continue
            answer = asyncio.run_coroutine_threadsafe(self._probe(provider, model, env), loop).result()
            answered[model.alias] = answer.status
            if answer.status in CHECK_FAILS:  # the attempt fails (or waits) on it: the next ones would only wait
                break
        return answered


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def error(cls, status: int, message: str, kind: str) -> _Answer:
        """An answer of the gate's own, in the OpenAI error shape Data Designer reads."""
        body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
        return cls(status, body, {"Content-Type": "application/json"})


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
