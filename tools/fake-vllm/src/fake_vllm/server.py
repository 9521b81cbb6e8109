"""Run the app under uvicorn after printing vLLM-like start-up lines (or fail at start-up on request)."""

from __future__ import annotations

import os
import shlex
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


def serve(settings: Settings) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit status."""
    for line in describe(settings):
        log(line)
    if settings.fail_start:
        if settings.startup_delay > 0:
            time.sleep(settings.startup_delay)
        log("RuntimeError: Engine core initialization failed (injected by --fake-fail-start)", level="ERROR")
        return 1
    log(f"Starting vLLM API server on http://{settings.host}:{settings.port} (pid {os.getpid()})")
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
