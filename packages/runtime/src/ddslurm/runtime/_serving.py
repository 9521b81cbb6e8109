"""Model servers and proxies: the serving errors, the token every request to them carries, their health and
readiness.

Replicas listen on Unix-domain sockets (``--uds``) in an owner-only directory, or on loopback ports; the one TCP
listener of a deployment is its proxy, on a port :class:`~ddslurm.runtime._ports.PortHolds` keeps from every other
user. Every attempt's servers and proxies require the attempt's own random token (``Authorization: Bearer TOKEN``:
vLLM on ``/v1/*``, the proxy on every route but ``/health``), so another user's job on a shared node cannot use
them. Command lines are :mod:`~ddslurm.runtime._server_command`'s, ports :mod:`~ddslurm.runtime._ports`'s, GPUs
and nodes :mod:`~ddslurm.runtime._node_discovery`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ddslurm.config import Engine, read_tail
from ddslurm.runtime._follower_port import FOLLOWER_PORT_TAKEN
from ddslurm.runtime._listeners import (
    ListenerNotOursError,
    NothingListensError,
    check_own_listener,
    http_base,
    socket_path,
)
from ddslurm.runtime._steps import Step
from ddslurm.runtime.errors import RuntimeFailure

if TYPE_CHECKING:  # httpx is imported by the probes when they run: a step that never probes never loads it
    import httpx

HEALTH_TIMEOUT_S = 5.0


class ServerError(RuntimeFailure):
    reason = "server_failed"


class ServerStartError(ServerError):
    """A server (or a rank of one) exited by itself before it was ready: its command line, image or model, which
    the plan freezes, is the first suspect (``ddslurm retry`` says so)."""

    reason = "server_start_failed"


class ServerKilledError(ServerStartError):
    """A server (or a rank of one) was killed by a signal before it was ready (``kill``, the kernel's OOM killer, a
    node being drained): something outside its command line ended it, and a new attempt may well start it."""

    reason = "server_killed"


class EngineTooOldError(ServerError):
    """The engine's version (``vllm --version``, SGLang's ``__version__``) is older than a flag of the servers'
    command lines needs (:mod:`~ddslurm.runtime._engine_flags`): no server was started, and none would start (it
    would exit with ``unrecognized arguments``) until a newer engine is installed. Never retried automatically."""

    reason = "engine_too_old"


def start_failure(name: str, code: int, before: str) -> ServerStartError:
    """The error of a step ``name`` that exited with ``code`` before ``before`` was ready: killed by a signal (a
    negative code, or 128 + the signal as srun reports it) or exited by itself."""
    if code < 0 or code > 128:
        signal = -code if code < 0 else code - 128
        return ServerKilledError(f"{name} was killed (status {code}, signal {signal}) before {before} was ready")
    return ServerStartError(f"{name} exited with status {code} before {before} was ready")


class ServerNotReadyError(ServerError):
    reason = "server_not_ready"


class ServerDiedError(ServerError):
    reason = "server_died"


class ProxyDiedError(ServerError):
    """The balancing proxy of an alias exited (or stopped answering) while the client depended on it.

    Retryable: the controller restarts the proxy before it reruns the client (``client_retries``), and a new
    attempt starts one of its own."""

    reason = "proxy_died"
    retryable = True


class GpuMismatchError(RuntimeFailure):
    reason = "gpu_mismatch"


class NodeMismatchError(RuntimeFailure):
    """The allocation has another number of nodes than the plan's serving spans (``SLURM_JOB_NUM_NODES``)."""

    reason = "node_mismatch"


class PortUnavailableError(RuntimeFailure):
    reason = "port_unavailable"


class FollowerPortTakenError(PortUnavailableError):
    """An SGLang follower found the port of its dummy ``/health`` (the leader's ``--port``) taken on its own node,
    and exited before SGLang started (:mod:`~ddslurm.runtime._follower_port`)."""


def auth_headers(token: str | None) -> dict[str, str]:
    """The Authorization header that the attempt's servers and proxies require (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


class ListenerClients:
    """The HTTP client for each listener URL: ``tcp`` for ``http://`` ones, and one of its own for each
    Unix-domain socket (``unix:/path``; httpx carries a socket in its transport). ``close`` closes those."""

    def __init__(self, tcp: httpx.Client) -> None:
        self._tcp = tcp
        self._unix: dict[Path, httpx.Client] = {}

    def get(self, url: str) -> httpx.Client:
        path = socket_path(url)
        if path is None:
            return self._tcp
        client = self._unix.get(path)
        if client is None:
            import httpx

            transport = httpx.HTTPTransport(uds=str(path))
            client = self._unix[path] = httpx.Client(transport=transport, timeout=self._tcp.timeout)
        return client

    def close(self) -> None:
        for client in self._unix.values():
            client.close()
        self._unix.clear()


def is_healthy(client: httpx.Client, url: str) -> bool:
    """``GET /health`` answers 200. Never with the token: vLLM's ``/health`` and the proxy's need none, and
    whatever answers on a port may be another user's (:mod:`ddslurm.runtime._listeners`). ``client``: the one
    for ``url`` (:class:`ListenerClients`); the controller's proves each new connection this user's
    (:func:`~ddslurm.runtime._peer_transport.own_peer_transport`), and one that is not raises
    ListenerNotOursError from here, before anything is sent on it."""
    import httpx

    try:
        return client.get(f"{http_base(url)}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


def answers(client: httpx.Client, url: str) -> bool:
    """Whether anything answers ``GET /health`` at all (any status): the process is alive and serving, even
    if it reports itself unhealthy (a proxy says 503 while none of its replicas is healthy). Without the token,
    as :func:`is_healthy`; another user's listener (a connection the client proved not ours) answers nothing."""
    import httpx

    try:
        client.get(f"{http_base(url)}/health", timeout=HEALTH_TIMEOUT_S)
    except (httpx.HTTPError, ListenerNotOursError):
        return False
    return True


def serves(client: httpx.Client, url: str, served_name: str, token: str | None) -> bool:
    """Whether ``/v1/models`` lists the served model name (it needs the token, unlike ``/health``)."""
    import httpx

    try:
        models = client.get(f"{http_base(url)}/v1/models", headers=auth_headers(token), timeout=HEALTH_TIMEOUT_S)
        return models.status_code == 200 and served_name in {m.get("id") for m in models.json().get("data", [])}
    except (httpx.HTTPError, ValueError):
        return False


def ready(client: httpx.Client, url: str, engine: Engine, served_name: str | None, token: str | None) -> bool:
    """Whether a replica (``served_name``; None: a proxy) is ready, asked without generating anything.

    vLLM's ``/health`` does not generate (it asks the engine client whether it has errored,
    ``vllm/entrypoints/openai/api_server.py``), so it is asked first, without the token. SGLang's ``/health`` is a
    one-token generation (``health_generate`` answers both ``/health`` and ``/health_generate``,
    ``python/sglang/srt/entrypoints/http_server.py``, sgl-project/sglang; ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``
    defaults to true): at least a second a probe, and 503 when the engine produces no output for
    ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s), which a busy healthy engine may not. Every route of SGLang's that
    answers without generating (``/v1/models``, ``/model_info``) wants the key, so an SGLang replica is asked
    ``/v1/models`` with the token, once its listener is proved this user's (nothing listening yet: not ready).
    Then, for either, ``/v1/models`` must list the served name. Raises ListenerNotOursError when another user
    listens there: found by the look, or by the connection itself when the port changed hands after the look
    (``client``'s transport, :func:`~ddslurm.runtime._peer_transport.own_peer_transport`)."""
    if engine == "sglang" and served_name is not None:
        try:
            check_own_listener(url)
        except NothingListensError:
            return False
        return serves(client, url, served_name, token)
    if not is_healthy(client, url):
        return False
    check_own_listener(url)
    return served_name is None or serves(client, url, served_name, token)


def alive(client: httpx.Client, url: str, engine: Engine, served_name: str, token: str | None) -> bool:
    """The liveness probe of a running replica, which never generates: :func:`ready`'s question for SGLang, whose
    ``/health`` generates; ``GET /health`` without the token for vLLM. A listener that is not this user's any
    more is not alive (and gets no token)."""
    if engine != "sglang":
        try:
            return is_healthy(client, url)
        except ListenerNotOursError:
            return False
    try:
        return ready(client, url, engine, served_name, token)
    except ListenerNotOursError:
        return False


def wait_ready(
    step: Step,
    url: str,
    served_name: str | None,
    timeout: float,
    *,
    client: httpx.Client,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval: float = 0.5,
    token: str | None = None,
    ranks: Sequence[Step] = (),
    watch: Callable[[], None] | None = None,
    engine: Engine = "vllm",
) -> float:
    """Poll until ready (:func:`ready`, by ``engine``: never a probe that generates); fail fast if the process
    exits, or any of ``ranks`` (the headless followers of a replica that spans nodes: its leader may wait for them
    for ever).
    ``watch`` (a replica that spans nodes: its rendezvous, :func:`~ddslurm.runtime._listeners.check_rendezvous`)
    is called before each poll, and again when a step exited, so that an intruder, not the death it caused, is
    what the start fails with.

    ``url``: ``http://HOST:PORT`` or ``unix:/path`` (``client`` the one for it, :class:`ListenerClients`).
    ``/health`` is asked without the token (vLLM's needs none); before ``/v1/models``, which needs it, the
    listener on the port must be this user's (:func:`~ddslurm.runtime._listeners.check_own_listener`): another
    user who took the port first, and answers like vLLM, gets no token and is never called ready.
    Returns the seconds it took. Raises ServerStartError (process died), ServerNotReadyError (deadline),
    FollowerPortTakenError (an SGLang follower's health port taken on its node), each with the tail of the step's
    log, or ListenerNotOursError (the port is another user's).
    """
    start = clock()
    deadline = start + timeout
    while True:
        if watch is not None:
            watch()
        code = step.poll()
        if code is not None:
            if watch is not None:
                watch()
            died = start_failure(step.name, code, "it")
            raise type(died)(f"{died}; last lines of {step.spec.log}:\n{read_tail(step.spec.log)}")
        for rank in ranks:
            if (code := rank.poll()) is not None:
                if watch is not None:
                    watch()
                failure: RuntimeFailure = start_failure(rank.name, code, step.name)
                if engine == "sglang" and code == FOLLOWER_PORT_TAKEN:  # its dummy /health's port, on its node
                    failure = FollowerPortTakenError(
                        f"{rank.name} found the port of its /health taken on its node before SGLang started"
                    )
                raise type(failure)(f"{failure}; last lines of {rank.spec.log}:\n{read_tail(rank.spec.log)}")
        if ready(client, url, engine, served_name, token):
            return clock() - start
        if clock() >= deadline:
            raise ServerNotReadyError(
                f"{step.name} was not ready after {timeout:.0f} s (server.startup_timeout); last lines of "
                f"{step.spec.log}:\n{read_tail(step.spec.log)}"
            )
        sleep(interval)
