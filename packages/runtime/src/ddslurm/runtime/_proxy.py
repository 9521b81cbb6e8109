"""The per-model-alias endpoint: an asynchronous HTTP reverse proxy in front of several vLLM replicas.

    ddslurm-runtime proxy --listen HOST:PORT --upstream URL [--upstream URL ...] [--log PATH] [--max-waiting N]
                          [--loop auto|uvloop|asyncio] [--reuse-port] [--busy-log PATH ...]

An upstream is ``http://HOST:PORT`` or ``unix:/path.sock`` (a replica on a Unix-domain socket, vLLM's ``--uds``).
``--reuse-port`` binds the listening socket with ``SO_REUSEPORT``, beside the hold the controller keeps on the
port (``ddslurm.runtime._ports.PortHolds``), so that no other user can take the port while the proxy restarts.

Any method and path is forwarded to one upstream (``/v1/chat/completions``, ``/v1/models``, ...): the body and
headers are copied (minus hop-by-hop headers and Host) and status codes pass through unchanged. A response body
of known length up to 1 MiB (every non-streamed completion) is read whole and answered with its headers in one
write; a longer one, or one without a length (SSE, ``stream: true``), is streamed back chunk by chunk, headers
first, so large bodies are never buffered.

Choice of upstream: least requests in flight through this proxy among the healthy, non-saturated upstreams;
ties go to the fewest requests waiting (``vllm:num_requests_waiting`` or SGLang's ``sglang:num_queue_reqs``, last
scrape of ``GET /metrics``), then round-robin. An upstream whose waiting queue exceeds ``max_waiting`` is skipped;
when every healthy upstream is saturated a request waits (without polling) until one is not, up to
``admission_timeout``, then gets 503. (The upstreams' state, their probes and this choice are ``_upstreams.py``;
this module relays the requests.)

A connection failure before the response headers arrive (refused, reset, closed) is retried on another
replica and marks the upstream unhealthy until its ``GET /health`` answers 200 again (it is re-probed at
once, then every ``unhealthy_interval``, as an upstream that has not loaded yet is; a healthy one every
``health_interval``). With no healthy upstream a request waits ``unavailable_grace``
seconds for one, then gets 503 ``{"error": {"message": ..., "type": "ServiceUnavailable"}}``. A failure after
the headers is not retried (the replica may have done the work): before any byte went to the client it is 502
``BadGateway``, later the client's connection is aborted, so a truncated body never looks complete.

``--record-prompts PATH`` (a ``ddslurm tune`` allocation's) appends the body of each chat completion request
forwarded, at most 256, to PATH, one JSON object a line (``_prompts.py``): never a header, so never the token.

``--busy-log PATH``, once per ``--upstream`` and in the same order, appends the spans in which at least one request
was in flight to that upstream (``_busy.py``): when each model server (replica) had work, for the report's GPU time
generating.

The proxy's own endpoints: ``GET /health`` (200 when at least one upstream is healthy, else 503) and
``GET /ddslurm/upstreams`` (JSON: each upstream's healthy flag, in-flight, waiting, served and failed counts and
the interval before its next health probe, and ``admitting``, the requests waiting for an upstream with room).

With a token (``VLLM_API_KEY`` in the proxy's environment, the attempt's own token, never on its command line)
every request but ``GET /health`` needs ``Authorization: Bearer TOKEN`` and gets 401 without it; requests are
forwarded, and upstreams probed, with that same header, which the replicas require too.
The request body is read whole before forwarding (it has to be kept for a retry).

Cost per request: nothing is parsed but the HTTP framing (bodies are opaque bytes), nothing is logged per
request unless ``--debug``, upstream connections are kept alive and pooled, and the event loop is uvloop's where
it is installed (``--loop auto``; a dependency of ddslurm-runtime where it builds, asyncio's own elsewhere).
``bench/proxy.py`` measures it against direct requests and a null relay (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hmac
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import aiohttp
from aiohttp import web
from yarl import URL

from ddslurm.runtime._busy import BusyLog
from ddslurm.runtime._listeners import socket_path
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._prompts import PromptRecorder
from ddslurm.runtime._server_command import TOKEN_ENV
from ddslurm.runtime._serving import auth_headers
from ddslurm.runtime._upstreams import Upstream, Upstreams

_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Content-Length is recomputed by the client session from the body; Expect is answered by our own server.
_DROP_REQUEST: Final = _HOP_BY_HOP | {"host", "content-length", "expect"}
_DROP_RESPONSE: Final = _HOP_BY_HOP | {"content-length"}
_JSON: Final = "application/json"
# A response body of known length up to this size is read whole and sent with its headers in one write; longer
# ones, and those without a length (SSE, chunked), are streamed chunk by chunk.
_WHOLE_MAX: Final = 1 << 20
_NO_BODY: Final = frozenset({204, 304})


@functools.lru_cache(maxsize=1024)
def _url(base: str, raw_path: str) -> URL:
    """The upstream URL of a request (cached: parsing one costs more than the rest of a request's headers)."""
    return URL(base + raw_path, encoded=True)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    listen_host: str
    listen_port: int
    upstreams: tuple[str, ...]  # base URLs without /v1, e.g. "http://127.0.0.1:8101", or "unix:/path.sock"
    health_interval: float = 1.0  # seconds between /health probes of each healthy upstream
    # ... and of one that is not (loading, or failed): the proxy learns of a replica that has loaded about when the
    # controller does (it polls every 0.2 s), not up to health_interval later while the client already sends.
    unhealthy_interval: float = 0.2
    metrics_interval: float = 1.0  # seconds between /metrics scrapes of each upstream
    max_waiting: int = 64  # requests waiting (vLLM's or SGLang's gauge) above which an upstream is "saturated"
    admission_timeout: float = 600.0  # how long a request may wait for a non-saturated healthy upstream
    unavailable_grace: float = 1.0  # how long a request waits for a healthy upstream when none is
    connect_timeout: float = 5.0  # TCP connect to an upstream
    probe_timeout: float = 5.0  # one /health probe or /metrics scrape
    shutdown_timeout: float = 5.0  # how long a stop lets in-flight requests finish
    token: str | None = field(default=None, repr=False)  # required from clients, sent upstream; None: open
    reuse_port: bool = False  # bind with SO_REUSEPORT (beside the controller's hold on the port)
    busy_logs: tuple[Path, ...] = ()  # per upstream (same order): its spans with a request in flight; (): none
    record_prompts: Path | None = None  # a tune allocation's: append chat completion bodies here (_prompts.py)
    engine: str = "vllm"  # the replicas' engine: SGLang's are probed on /v1/models (its /health generates)

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("at least one upstream is required")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError(f"duplicate upstreams: {list(self.upstreams)}")
        if self.busy_logs and len(self.busy_logs) != len(self.upstreams):
            raise ValueError(f"{len(self.busy_logs)} busy logs for {len(self.upstreams)} upstreams: one per upstream")
        for url in self.upstreams:
            path = socket_path(url)
            if path is not None and not path.is_absolute():
                raise ValueError(f"a unix: upstream needs an absolute socket path: {url!r}")
            if path is None and not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream must be an http(s) base URL or unix:/path: {url!r}")
        if not 0 <= self.listen_port <= 65535:
            raise ValueError(f"listen_port out of range: {self.listen_port}")
        for name in ("health_interval", "unhealthy_interval", "metrics_interval", "connect_timeout", "probe_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("admission_timeout", "unavailable_grace", "shutdown_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.max_waiting < 0:
            raise ValueError("max_waiting must not be negative")


def _error(status: int, kind: str, message: str) -> web.Response:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}})
    return web.Response(status=status, text=body, content_type=_JSON)


class Proxy:
    """The proxy's state and server. ``await start()`` (returns the bound port), ``await stop()`` (counts)."""

    def __init__(self, config: ProxyConfig, logger: Any) -> None:
        self.config = config
        self._log = logger
        self._upstreams = Upstreams(
            config.upstreams,
            logger,
            max_waiting=config.max_waiting,
            health_interval=config.health_interval,
            unhealthy_interval=config.unhealthy_interval,
            metrics_interval=config.metrics_interval,
            unavailable_grace=config.unavailable_grace,
            connect_timeout=config.connect_timeout,
            probe_timeout=config.probe_timeout,
            engine=config.engine,
            token=config.token,
        )
        self._runner: web.ServerRunner | None = None
        logs = config.busy_logs or (None,) * len(config.upstreams)
        self._busy = {url.rstrip("/"): BusyLog(path) for url, path in zip(config.upstreams, logs, strict=True)}
        """Upstream URL (as :class:`Upstream` spells it) → the spans in which it had a request in flight."""
        self._recorder = PromptRecorder(config.record_prompts) if config.record_prompts else None
        """A tune allocation's: the chat completion bodies forwarded (never a header), for its calibration sweep."""
        self._expected = f"Bearer {config.token}".encode() if config.token else None
        # Per-request constants: headers never forwarded, the token header added, whether to log each request.
        self._drop = _DROP_REQUEST | {"authorization"} if config.token else _DROP_REQUEST
        self._auth = list(auth_headers(config.token).items())
        enabled = getattr(logger, "is_enabled_for", None)
        self._debug = bool(enabled(logging.DEBUG)) if callable(enabled) else True
        self.port: int | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> int:
        """Probe every upstream once, start listening and the probe loops; returns the bound port."""
        cfg = self.config
        self._upstreams.open()
        try:
            await self._upstreams.probe()
            server = web.Server(self._handle, handler_cancellation=True, access_log=None)
            self._runner = web.ServerRunner(server, shutdown_timeout=cfg.shutdown_timeout)
            await self._runner.setup()
            await web.TCPSite(self._runner, cfg.listen_host, cfg.listen_port, reuse_port=cfg.reuse_port or None).start()
        except BaseException:
            await self._close()
            raise
        self.port = int(self._runner.addresses[0][1])
        self._upstreams.watch()
        self._log.info(
            "proxy.started",
            listen=f"{cfg.listen_host}:{self.port}",
            upstreams=list(cfg.upstreams),
            healthy=self._upstreams.healthy(),
            max_waiting=cfg.max_waiting,
            loop=type(asyncio.get_running_loop()).__module__,
        )
        return self.port

    async def stop(self) -> dict[str, int]:
        """Stop listening, let in-flight requests finish (up to shutdown_timeout), close; returns served counts."""
        await self._close()
        served = self.served()
        self._log.info("proxy.stopped", served=served, failed=self._upstreams.failed())
        return served

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # the probe loops keep running meanwhile: retries still work
            self._runner = None
        await self._upstreams.close()
        for busy in self._busy.values():
            busy.close()
        if self._recorder is not None:
            self._recorder.close()

    def served(self) -> dict[str, int]:
        return self._upstreams.served()

    def describe(self) -> dict[str, Any]:
        return self._upstreams.describe()

    # -- request handling -------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/health":
            healthy = len(self._upstreams.healthy())
            if healthy:
                return web.Response(text=json.dumps({"healthy_upstreams": healthy}), content_type=_JSON)
            return _error(503, "ServiceUnavailable", "no healthy upstream")
        if not self._authorized(request):
            return _error(401, "Unauthorized", "this endpoint requires the attempt's token (Authorization: Bearer)")
        if path == "/ddslurm/upstreams":
            return web.Response(text=json.dumps(self.describe()), content_type=_JSON)
        return await self._forward(request)

    def _authorized(self, request: web.BaseRequest) -> bool:
        if self._expected is None:
            return True
        given = request.headers.get("Authorization", "").encode("utf-8", "replace")
        return hmac.compare_digest(given, self._expected)

    async def _forward(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.content.read()  # kept for a retry; no size cap (unlike request.read())
        if self._recorder is not None and request.method == "POST":
            self._recorder.record(request.path, body)
        drop = self._drop
        connection = request.headers.get("Connection")
        if connection:
            drop = drop | {token.strip().lower() for token in connection.split(",")}
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in drop]
        headers += self._auth
        method = request.method
        raw_path = request.raw_path
        deadline: float | None = None
        attempts = len(self._upstreams) + 1
        last_error = ""
        for _ in range(attempts):
            up, _healthy = self._upstreams.pick()
            if up is None:
                if deadline is None:
                    deadline = asyncio.get_running_loop().time() + self.config.admission_timeout
                admitted = await self._upstreams.admit(deadline)
                if isinstance(admitted, str):
                    return _error(503, "ServiceUnavailable", admitted + last_error)
                up = admitted
            up.in_flight += 1
            busy = self._busy[up.url]
            busy.enter()
            session = up.session
            assert session is not None
            try:
                try:
                    upstream = await session.request(
                        method,
                        _url(up.base, raw_path),
                        data=body or None,
                        headers=headers,
                        allow_redirects=False,
                    )
                except aiohttp.ClientConnectionError as exc:  # refused, reset or closed before the headers
                    self._upstreams.request_failed(up, exc, "before response headers")
                    last_error = f" (last failure: {up.url}: {type(exc).__name__})"
                    continue
                up.served += 1
                if self._debug:
                    self._log.debug(
                        "proxy.forward", upstream=up.url, method=method, path=raw_path, status=upstream.status
                    )
                length = upstream.content_length
                if (
                    length is not None
                    and length <= _WHOLE_MAX
                    and upstream.status not in _NO_BODY
                    and upstream.status >= 200
                    and method != "HEAD"
                ):
                    return await self._relay_whole(upstream, up)
                return await self._relay(request, upstream, up)
            finally:
                up.in_flight -= 1
                busy.leave()
        return _error(503, "ServiceUnavailable", f"{attempts} attempts failed{last_error}")

    @staticmethod
    def _response_headers(upstream: aiohttp.ClientResponse) -> list[tuple[str, str]]:
        return [(k, v) for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE]

    async def _relay_whole(self, upstream: aiohttp.ClientResponse, up: Upstream) -> web.StreamResponse:
        """A body of known, bounded length: read it, then answer headers and body in one write.

        The client then gets one segment instead of two (headers, body), which costs it a wake-up and a read
        less per request. An upstream failure before the body is complete gives 502 (nothing was sent yet)."""
        complete = False
        try:
            body = await upstream.read()
            complete = True
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._upstreams.request_failed(up, exc, "during response body")
            return _error(502, "BadGateway", f"{up.url} failed during the response body: {type(exc).__name__}")
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()  # failed, or cancelled because the client left: the replica may stop early
        return web.Response(
            body=body, status=upstream.status, reason=upstream.reason, headers=self._response_headers(upstream)
        )

    async def _relay(
        self, request: web.BaseRequest, upstream: aiohttp.ClientResponse, up: Upstream
    ) -> web.StreamResponse:
        """Stream ``upstream`` back to the client; on an upstream failure mid-body, abort the client's connection."""
        complete = False
        try:
            response = web.StreamResponse(
                status=upstream.status, reason=upstream.reason, headers=self._response_headers(upstream)
            )
            length = upstream.content_length
            if length is not None:
                response.content_length = length
            try:
                await response.prepare(request)
            except ConnectionError:
                return response  # the client left
            content = upstream.content
            while True:
                try:
                    chunk = await content.readany()
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    self._upstreams.request_failed(up, exc, "during response body")
                    transport = request.transport
                    if transport is not None:
                        transport.abort()  # never let a truncated body look complete
                    return response
                if not chunk:
                    break
                try:
                    await response.write(chunk)
                except ConnectionError:
                    return response  # the client left; closing the upstream connection aborts its request
            complete = True
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()


async def serve(
    config: ProxyConfig,
    logger: Any,
    *,
    started: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, int]:
    """Run the proxy until ``stop`` is set (or the task is cancelled); returns requests served per upstream."""
    proxy = Proxy(config, logger)
    await proxy.start()
    try:
        if started is not None:
            started.set()
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        served = await asyncio.shield(proxy.stop())
    return served


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _upstream(value: str) -> str:
    url = value.rstrip("/")
    return url if socket_path(url) is not None else url.removesuffix("/v1")  # accept an OpenAI base URL too


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddslurm-runtime proxy",
        description="Reverse proxy for the OpenAI API in front of several vLLM replicas (least outstanding).",
    )
    defaults = ProxyConfig("", 0, ("http://x",))
    parser.add_argument("--listen", type=_listen, required=True, metavar="HOST:PORT")
    parser.add_argument(
        "--upstream", type=_upstream, action="append", required=True, metavar="URL", help="base URL without /v1"
    )
    parser.add_argument("--log", type=Path, default=None, help="append JSON log lines here (default: stderr)")
    parser.add_argument("--max-waiting", type=int, default=defaults.max_waiting, metavar="N")
    parser.add_argument("--health-interval", type=float, default=defaults.health_interval, metavar="S")
    parser.add_argument("--unhealthy-interval", type=float, default=defaults.unhealthy_interval, metavar="S")
    parser.add_argument("--metrics-interval", type=float, default=defaults.metrics_interval, metavar="S")
    parser.add_argument("--admission-timeout", type=float, default=defaults.admission_timeout, metavar="S")
    parser.add_argument("--unavailable-grace", type=float, default=defaults.unavailable_grace, metavar="S")
    parser.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout, metavar="S")
    parser.add_argument("--debug", action="store_true", help="log every forwarded request")
    parser.add_argument(
        "--busy-log",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="once per --upstream, in the same order: append the spans with a request in flight to it here",
    )
    parser.add_argument(
        "--record-prompts",
        type=Path,
        default=None,
        metavar="PATH",
        help="a tune allocation's: append the bodies of the chat completion requests forwarded (at most 256) here",
    )
    parser.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        default="vllm",
        help="the replicas' engine: SGLang's are probed on /v1/models with the token (its /health generates)",
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="bind with SO_REUSEPORT, beside the controller's hold on the port (no other user can take it)",
    )
    parser.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="event loop: uvloop where it is installed (auto), or asyncio's own",
    )
    return parser


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop for ``--loop NAME``: uvloop's for ``uvloop`` and, where it imports, ``auto``; else None
    (asyncio's default). ``uvloop`` without uvloop installed raises ImportError."""
    if name == "asyncio":
        return None
    try:
        import uvloop  # optional, and loaded only to serve
    except ImportError:
        if name == "uvloop":
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


@contextlib.contextmanager
def _log_stream(path: Path | None) -> Iterator[IO[bytes]]:
    if path is None:
        yield sys.stderr.buffer
        return
    with path.open("ab") as stream:
        yield stream


async def _run(config: ProxyConfig, logger: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, _on_signal(stop, logger, sig))
            handled.append(sig)
    try:
        await serve(config, logger, stop=stop)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


def _on_signal(stop: asyncio.Event, logger: Any, sig: signal.Signals) -> Callable[[], None]:
    def handler() -> None:
        if not stop.is_set():
            logger.info("proxy.stopping", signal=sig.name)
        stop.set()

    return handler


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """``ddslurm-runtime proxy ...``: serve until SIGTERM/SIGINT; 0 after a graceful stop, 1 if it cannot start.

    The token clients must send is ``VLLM_API_KEY`` of ``environ`` (default: this process's environment)."""
    args = _parser().parse_args(argv)
    token = (os.environ if environ is None else environ).get(TOKEN_ENV) or None
    host, port = args.listen
    try:
        config = ProxyConfig(
            listen_host=host,
            listen_port=port,
            upstreams=tuple(args.upstream),
            health_interval=args.health_interval,
            unhealthy_interval=args.unhealthy_interval,
            metrics_interval=args.metrics_interval,
            max_waiting=args.max_waiting,
            admission_timeout=args.admission_timeout,
            unavailable_grace=args.unavailable_grace,
            shutdown_timeout=args.shutdown_timeout,
            token=token,
            reuse_port=args.reuse_port,
            busy_logs=tuple(args.busy_log),
            record_prompts=args.record_prompts,
            engine=args.engine,
        )
    except ValueError as exc:
        print(f"ddslurm-runtime proxy: {exc}", file=sys.stderr)
        return 2
    try:
        factory = loop_factory(args.loop)
    except ImportError as exc:
        print(f"ddslurm-runtime proxy: --loop uvloop: {exc}", file=sys.stderr)
        return 2
    with _log_stream(args.log) as stream:
        logger = new_logger(stream, level=logging.DEBUG if args.debug else logging.INFO, component="proxy")
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(_run(config, logger))
        except OSError as exc:  # cannot listen
            logger.error("proxy.failed", error=f"{type(exc).__name__}: {exc}")
            return 1
    return 0
