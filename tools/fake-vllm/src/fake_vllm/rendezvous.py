"""The rendezvous of a replica that spans nodes, modelled on the engines' own (torch.distributed's TCP store for
vLLM's ``--master-addr:--master-port`` and SGLang's ``--dist-init-addr``, vLLM's data-parallel RPC port).

Rank 0, the leader, binds ``address:port`` at start-up (a port in use: ``Address already in use``, exit 1) and
is not ready (``/health`` 503) until every follower rank has joined. A follower connects (retrying until
``--fake-join-timeout``), sends one JSON line saying who it is (engine, model, rank, parallel sizes), gets one
back (accepted or refused), and stays connected. A follower whose identity disagrees with the leader's, or a
rank that joins twice, is refused: both exit 1. Afterwards either side's death ends the other: the leader exits
at once when a follower's connection closes (``os._exit(1)``, like an engine whose worker died), and a follower
exits 1 when the leader's closes. Headless ranks serve no API; an SGLang follower with ``--fake-follower-health``
serves a dummy ``/health`` on the leader's ``--host``/``--port`` once it joined, as SGLang's followers do on their
own node (sgl-project/sglang ``engine.py`` ``_launch_subprocesses``: ``launch_dummy_health_check_server``); a
port in use there ends it as uvicorn's bind failure does (status 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

from fake_vllm.log import log
from fake_vllm.settings import Group, Settings

HELLO_TIMEOUT_S = 10.0
RETRY_S = 0.2


def identity(settings: Settings) -> dict[str, Any]:
    """What a rank tells its leader, and what the leader compares (all but ``rank``)."""
    group = settings.group
    assert group is not None
    return {
        "engine": settings.engine,
        "model": settings.model,
        "form": group.form,
        "nodes": group.nodes,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "data_parallel_size": settings.data_parallel_size,
        "rank": group.rank,
    }


def describe_rank(group: Group) -> str:
    return f"node rank {group.rank}" if group.form == "nodes" else f"data-parallel node {group.rank}"


def bind_rendezvous(group: Group) -> socket.socket:
    """The leader's rendezvous socket, bound on every interface at the group's port and listening (followers that
    come early wait in its backlog). Raises ``OSError`` (``Address already in use``)."""
    family = socket.AF_INET6 if ":" in group.address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", group.port))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Leader:
    """Rank 0's side: accepts the followers, gates readiness on them, dies with any of them."""

    def __init__(self, settings: Settings, sock: socket.socket, crash: Callable[[str], NoReturn]) -> None:
        assert settings.group is not None
        self.group = settings.group
        self.me = identity(settings)
        self.sock = sock
        self.crash = crash
        self.joined: set[int] = set()
        self.all_joined = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None
        self.followers = self.group.nodes - 1

    async def start(self) -> None:
        world = self.group.nodes
        log(
            f"Rank 0 of {world} nodes ({self.group.form}); world_size="
            f"{self.me['tensor_parallel_size'] * self.me['pipeline_parallel_size'] * self.me['data_parallel_size']}; "
            f"waiting for {self.followers} followers at {self.group.rendezvous}"
        )
        self.server = await asyncio.start_server(self._handle, sock=self.sock)
        if self.followers == 0:
            self.all_joined.set()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def _problem(self, hello: Any) -> str | None:
        if not isinstance(hello, dict):
            return f"a follower sent {hello!r}, not its identity"
        rank = hello.get("rank")
        if not isinstance(rank, int) or not 0 < rank < self.group.nodes:
            return f"a follower claims rank {rank!r}, outside 1..{self.group.nodes - 1}"
        for key, mine in self.me.items():
            if key != "rank" and hello.get(key) != mine:
                return f"rank {rank} has {key}={hello.get(key)!r} but the leader has {key}={mine!r}"
        if rank in self.joined:
            return f"rank {rank} joined twice"
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
            hello: Any = json.loads(line) if line else None
        except (TimeoutError, ValueError, OSError):
            writer.close()
            return  # not a rank of ours (a port scan, a stray client): ignored, as a store ignores it
        problem = self._problem(hello)
        if problem is not None:
            with contextlib.suppress(OSError):
                writer.write(json.dumps({"ok": False, "error": problem}).encode() + b"\n")
                await writer.drain()
            self.crash(f"rendezvous refused: {problem}")
        rank = hello["rank"]
        self.joined.add(rank)
        writer.write(json.dumps({"ok": True}).encode() + b"\n")
        await writer.drain()
        who = describe_rank(Group(form=self.group.form, nodes=self.group.nodes, rank=rank, address="", port=0))
        log(f"{who} joined ({len(self.joined)}/{self.followers} followers)")
        if len(self.joined) == self.followers:
            log(f"All {self.group.nodes} nodes joined the rendezvous at {self.group.rendezvous}")
            self.all_joined.set()
        with contextlib.suppress(OSError):
            while await reader.read(4096):
                pass
        self.crash(
            f"A worker process on {who} died unexpectedly (its connection to the leader closed), shutting down "
            "executor."
        )


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


class _Health(BaseHTTPRequestHandler):
    """SGLang's dummy health server: ``/health`` and ``/health_generate`` answer 200, nothing else exists."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path in ("/health", "/health_generate") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def dummy_health(host: str, port: int) -> ThreadingHTTPServer:
    """A follower's dummy ``/health`` server on ``host:port``, serving in a thread of its own (bound as uvicorn
    binds, ``SO_REUSEADDR``). Raises ``OSError`` (``Address already in use``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("HealthServer", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server: ThreadingHTTPServer = server_class((host, port), _Health)
    threading.Thread(target=server.serve_forever, name="dummy-health", daemon=True).start()
    log(f"Dummy health server of a follower on http://{host}:{port}")
    return server


def run_follower(settings: Settings) -> int:
    """A follower rank's whole life: join the leader, then wait until its connection closes. Returns the exit
    status (1: never joined, refused, or the leader went away)."""
    group = settings.group
    assert group is not None
    who = describe_rank(group)
    log(
        f"Headless {who} of {group.nodes} ({group.form}); connecting to the leader at {group.rendezvous} "
        f"(join timeout {settings.join_timeout:g} s)"
    )
    deadline = time.monotonic() + settings.join_timeout
    while True:
        try:
            sock = socket.create_connection((group.address, group.port), timeout=2.0)
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                log(
                    f"RuntimeError: {who} could not reach the leader at {group.rendezvous} within the join timeout "
                    f"({settings.join_timeout:g} s, --fake-join-timeout / FAKE_VLLM_JOIN_TIMEOUT): {exc}",
                    level="ERROR",
                )
                return 1
            time.sleep(RETRY_S)
    with sock:
        try:
            sock.sendall(json.dumps(identity(settings)).encode() + b"\n")
            reply_line = _read_line(sock, time.monotonic() + HELLO_TIMEOUT_S)
            reply: Any = json.loads(reply_line) if reply_line else None
        except (OSError, ValueError) as exc:
            log(f"RuntimeError: {who}: the leader at {group.rendezvous} did not answer its join: {exc}", "ERROR")
            return 1
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else "no answer"
            log(f"RuntimeError: the leader at {group.rendezvous} refused {who}: {error}", level="ERROR")
            return 1
        log(f"{who} joined the leader at {group.rendezvous}")
        health = None
        if settings.engine == "sglang" and settings.follower_health:
            try:
                health = dummy_health(settings.host, settings.port)
            except OSError as exc:
                log(
                    f"[Errno {exc.errno}] error while attempting to bind on address ({settings.host!r}, "
                    f"{settings.port}): {(exc.strerror or str(exc)).lower()}",
                    level="ERROR",
                )
                return 1
        sock.settimeout(None)
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass
        if health is not None:
            health.shutdown()
    log(f"RuntimeError: the leader at {group.rendezvous} closed the connection (it exited); {who} shuts down", "ERROR")
    return 1
