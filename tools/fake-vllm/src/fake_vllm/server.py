"""Run the app under uvicorn after printing vLLM-like start-up lines (or fail at start-up on request).

The listening socket is bound here, before the (modelled) engine start-up, and handed to uvicorn, as vLLM's
``setup_server`` does: a TCP socket with ``SO_REUSEADDR`` bound to ``(host, port)``, or with ``--uds`` a
``AF_UNIX`` socket bound to the path. Binding a path that exists fails (``Address already in use``): vLLM removes
no stale file first, and none at exit either, so the socket file outlives the server.

A replica that spans nodes (``Settings.group``): rank 0 also binds the rendezvous port and serves the API once
every follower joined; a follower (headless) only joins and waits (``fake_vllm.rendezvous``), no HTTP.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import time
from collections.abc import Mapping

import uvicorn

from fake_vllm.app import create_app
from fake_vllm.cli import FAKE_OPTIONS
from fake_vllm.compile_cache import compile_model
from fake_vllm.log import log
from fake_vllm.rendezvous import bind_rendezvous, run_follower
from fake_vllm.settings import Settings
from fake_vllm.sglang_args import server_args_line
from fake_vllm.version import version_string

GRACEFUL_SHUTDOWN_S = 2


def _sizes(settings: Settings) -> str:
    sizes = (
        f"tensor_parallel_size={settings.tensor_parallel_size} pipeline_parallel_size="
        f"{settings.pipeline_parallel_size} data_parallel_size={settings.data_parallel_size}"
    )
    if settings.expert_parallel_size > 1:
        sizes += f" expert_parallel_size={settings.expert_parallel_size}"
    return sizes


def describe(settings: Settings) -> list[str]:
    """The start-up lines (never the API key itself)."""
    seqs = "" if settings.max_num_seqs is None else f"max_num_seqs={settings.max_num_seqs} (per data-parallel rank) "
    engine = "vLLM API server" if settings.engine == "vllm" else "SGLang server (launch_server)"
    lines = [
        f"{engine} version {version_string()}",
        f"model={settings.model!r} served_model_name={list(settings.served_model_names)!r} {_sizes(settings)} "
        f"{seqs}capacity={settings.capacity or 'unlimited'} "
        f"api_key_required={'yes' if settings.requires_key else 'no'}",
    ]
    if settings.group is not None:
        group = settings.group
        role = "leader" if group.leader else "headless follower"
        lines.append(
            f"multi-node replica ({group.form}): rank {group.rank} of {group.nodes} nodes, {role}, "
            f"rendezvous {group.rendezvous}"
        )
    if settings.expert_parallel:
        note = " (TP x DP = 1: no expert is sharded)" if settings.expert_parallel_size == 1 else ""
        lines.append(f"expert parallel enabled: EP size {settings.expert_parallel_size}{note} (accepted, not modelled)")
    if settings.ignored_args:
        what = "vLLM" if settings.engine == "vllm" else "SGLang"
        lines.append(f"ignoring {what} arguments the stand-in does not model: " + shlex.join(settings.ignored_args))
    fakes = [
        f"{option.dest}={getattr(settings, option.dest)!r}"
        for option in FAKE_OPTIONS
        if getattr(settings, option.dest) != option.default
    ]
    if fakes:
        lines.append("stand-in behaviours: " + " ".join(fakes))
    return lines


def gpu_problem(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """With ``CUDA_VISIBLE_DEVICES`` set, this node must see the GPUs its ranks need (unset: not checked, as in tests
    outside Slurm); the error reads like the engine's."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    count = len([device for device in visible.split(",") if device.strip()])
    needed = settings.gpus_per_node
    if count >= needed:
        return None
    detail = f"this node's ranks need {needed} GPU(s) ({_sizes(settings)}"
    if settings.group is not None:
        detail += f", over {settings.group.nodes} nodes"
    detail += f") but CUDA_VISIBLE_DEVICES={visible!r} shows {count}"
    if settings.engine == "sglang":
        return f"RuntimeError: CUDA error: invalid device ordinal: {detail}"
    return f"AssertionError: please ensure that world_size is less than max local gpu count: {detail}"


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
    """Serve until SIGINT/SIGTERM; returns the process exit status. SGLang's first line is its arguments, the key
    among them (:mod:`fake_vllm.sglang_args`), as the real one logs them."""
    if settings.engine == "sglang":
        log(server_args_line(settings))
    for line in describe(settings):
        log(line)
    problem = gpu_problem(settings, os.environ)
    if problem is not None:
        log(problem, level="ERROR")
        return 1
    if settings.engine == "vllm":
        compile_model(settings, os.environ)  # every rank's workers compile (or load) the model
    group = settings.group
    if group is not None and not group.leader:
        return run_follower(settings)  # headless: no HTTP
    try:
        sock = bind_socket(settings)
    except OSError as exc:
        in_use = settings.uds is not None and exc.errno == errno.EADDRINUSE
        hint = " (the path exists: like vLLM, the server does not remove an existing file)" if in_use else ""
        log(f"Cannot listen on {settings.listen_address}: OSError: {exc}{hint}", level="ERROR")
        return 1
    try:
        rendezvous = None
        if group is not None:
            try:
                rendezvous = bind_rendezvous(group)
            except OSError as exc:
                log(f"RuntimeError: cannot bind the rendezvous address {group.rendezvous}: OSError: {exc}", "ERROR")
                return 1
        try:
            return _serve_http(settings, sock, rendezvous)
        finally:
            if rendezvous is not None:
                rendezvous.close()
    finally:
        sock.close()


def _serve_http(settings: Settings, sock: socket.socket, rendezvous: socket.socket | None) -> int:
    if settings.fail_start:
        if settings.startup_delay > 0:
            time.sleep(settings.startup_delay)
        log("RuntimeError: Engine core initialization failed (injected by --fake-fail-start)", level="ERROR")
        return 1
    engine = "vLLM API server" if settings.engine == "vllm" else "SGLang server"
    log(f"Starting {engine} on {settings.listen_address} (pid {os.getpid()})")
    config = uvicorn.Config(
        create_app(settings, rendezvous=rendezvous),
        log_level="info",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0 if server.started else 1
