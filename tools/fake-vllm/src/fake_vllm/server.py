"""Run the app under uvicorn after printing vLLM-like start-up lines (or fail at start-up on request).

The listening socket is bound here, before the (modelled) engine start-up, and handed to uvicorn, as vLLM's
``setup_server`` does: a TCP socket with ``SO_REUSEADDR`` bound to ``(host, port)``, or with ``--uds`` a
``AF_UNIX`` socket bound to the path. Binding a path that exists fails (``Address already in use``): vLLM removes
no stale file first, and none at exit either, so the socket file outlives the server.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import time

import uvicorn

from fake_vllm.app import create_app
from fake_vllm.cli import FAKE_OPTIONS
from fake_vllm.log import log
from fake_vllm.settings import Settings
from fake_vllm.version import version_string

GRACEFUL_SHUTDOWN_S = 2


def describe(settings: Settings) -> list[str]:
    """The start-up lines (never the API key itself)."""
    seqs = "" if settings.max_num_seqs is None else f"max_num_seqs={settings.max_num_seqs} "
    lines = [
        f"vLLM API server version {version_string()}",
        f"model={settings.model!r} served_model_name={list(settings.served_model_names)!r} "
        f"tensor_parallel_size={settings.tensor_parallel_size} {seqs}"
        f"api_key_required={'yes' if settings.requires_key else 'no'}",
    ]
    if settings.ignored_args:
        lines.append("ignoring vLLM arguments the stand-in does not model: " + shlex.join(settings.ignored_args))
    fakes = [
        f"{option.dest}={getattr(settings, option.dest)!r}"
        for option in FAKE_OPTIONS
        if getattr(settings, option.dest) != option.default
    ]
    if fakes:
        lines.append("stand-in behaviours: " + " ".join(fakes))
    return lines


def bind_socket(settings: Settings) -> socket.socket:
    """The server's socket, bound but not listening yet (vLLM's ``create_server_socket`` and
    ``create_server_unix_socket``). Raises ``OSError``."""
    if settings.uds is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: str | tuple[str, int] = os.fspath(settings.uds)
    else:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        address = (settings.host, settings.port)
    try:
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(settings: Settings) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit status."""
    for line in describe(settings):
        log(line)
    try:
        sock = bind_socket(settings)
    except OSError as exc:
        in_use = settings.uds is not None and exc.errno == errno.EADDRINUSE
        hint = " (the path exists: like vLLM, the server does not remove an existing file)" if in_use else ""
        log(f"Cannot listen on {settings.listen_address}: OSError: {exc}{hint}", level="ERROR")
        return 1
    try:
        if settings.fail_start:
            if settings.startup_delay > 0:
                time.sleep(settings.startup_delay)
            log("RuntimeError: Engine core initialization failed (injected by --fake-fail-start)", level="ERROR")
            return 1
        log(f"Starting vLLM API server on {settings.listen_address} (pid {os.getpid()})")
        config = uvicorn.Config(
            create_app(settings),
            log_level="info",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        server = uvicorn.Server(config)
        server.run(sockets=[sock])
        return 0 if server.started else 1
    finally:
        sock.close()
