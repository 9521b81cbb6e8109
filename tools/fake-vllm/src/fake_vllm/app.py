"""The Starlette application: the routes of vLLM (or SGLang) on the handlers, and readiness in its lifespan
(after ``startup_delay``, and for the leader of a multi-node replica once every follower joined). The endpoints'
behaviour, capacity model included, is :mod:`fake_vllm.handlers`'."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import NoReturn

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from fake_vllm.engine_process import engine_process
from fake_vllm.extras import BUILDERS, V1_BUILDERS
from fake_vllm.handlers import Handlers
from fake_vllm.log import log
from fake_vllm.rendezvous import Leader
from fake_vllm.settings import Settings
from fake_vllm.state import ServerState
from fake_vllm.wire import http_error


def crash_process(reason: str) -> NoReturn:
    """Die abruptly, like an engine failure: no graceful shutdown, no response, exit status 1."""
    log(f"EngineCore encountered a fatal error: {reason}", level="ERROR")
    sys.stderr.flush()
    os._exit(1)


def create_app(
    settings: Settings,
    *,
    crash: Callable[[str], NoReturn] = crash_process,
    rendezvous: socket.socket | None = None,
) -> Starlette:
    """The ASGI app for ``settings``; readiness flips after ``startup_delay`` once the lifespan starts and, for the
    leader of a multi-node replica (``rendezvous``: its bound, listening socket), once every follower joined."""
    state = ServerState(settings, crash)
    handlers = Handlers(state)

    async def become_ready(leader: Leader | None) -> None:
        if state.ready:
            log("Model loaded; ready (GET /health -> 200)")
            return
        started = time.monotonic()
        if settings.startup_delay > 0:
            await asyncio.sleep(settings.startup_delay)
        if leader is not None:
            await leader.all_joined.wait()
        if settings.never_healthy:
            log("--fake-never-healthy: the model will never finish loading; /health stays 503", "WARNING")
            return
        state.ready = not state.engine_dead
        log(f"Model loading took {time.monotonic() - started:.2f} seconds; ready (GET /health -> 200)")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        leader = None
        if rendezvous is not None:
            leader = Leader(settings, rendezvous, crash)
            await leader.start()
        elif settings.startup_delay <= 0 and not settings.never_healthy:
            state.ready = True
        task = asyncio.create_task(become_ready(leader))
        engine = engine_process(state, crash) if settings.engine_process else contextlib.nullcontext()
        try:
            async with engine:
                yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if leader is not None:
                await leader.close()

    if settings.engine == "sglang":
        routes = [
            Route("/health", handlers.sglang_health, methods=["GET"]),
            Route("/health_generate", handlers.sglang_health, methods=["GET"]),
            Route("/get_model_info", handlers.get_model_info, methods=["GET"]),
            Route("/model_info", handlers.get_model_info, methods=["GET"]),
            Route("/v1/models", handlers.models, methods=["GET"]),
            Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
            # SGLang mounts its Prometheus app only with --enable-metrics.
            *([Route("/metrics", handlers.metrics, methods=["GET"])] if settings.enable_metrics else []),
        ]
        app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
        app.state.fake_vllm = state
        return app
    routes = [
        Route("/health", handlers.health, methods=["GET"]),
        Route("/version", handlers.version, methods=["GET"]),
        Route("/metrics", handlers.metrics, methods=["GET"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        *(Route(path, handlers.extra(builder, v1=True), methods=["POST"]) for path, builder in V1_BUILDERS.items()),
        # vLLM's routes outside /v1: its API key does not guard them (only /v1 paths need it).
        Route("/ping", handlers.health, methods=["GET", "POST"]),
        Route("/invocations", handlers.invocations, methods=["POST"]),
        *(Route(path, handlers.extra(builder), methods=["POST"]) for path, builder in BUILDERS.items()),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.fake_vllm = state
    return app
