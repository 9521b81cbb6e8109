"""Model servers: vLLM command lines (bare, Pyxis, Apptainer), ports, GPU discovery, readiness.

Every attempt's servers and proxies require the attempt's own random token (``Authorization: Bearer TOKEN`` on
``/v1/*``), so another user's job on a shared node cannot use them. The token reaches a server through its
environment (:data:`TOKEN_ENV`, which vLLM reads like ``--api-key``), never through its command line, where
``ps`` would show it to every user of the node.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from ddslurm.config import DeploymentPlan, ServingPlan, read_tail
from ddslurm.runtime._listeners import check_own_listener
from ddslurm.runtime._steps import Step
from ddslurm.runtime.errors import RuntimeFailure

PORT_BASE = 20000
HEALTH_TIMEOUT_S = 5.0
PORT_SPAN = 30000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
MIN_LISTEN_SPAN = 4096
TOKEN_ENV = "VLLM_API_KEY"
"""The variable vLLM (and the proxy) read the required API key from: ``--api-key`` without a command line."""


class ServerError(RuntimeFailure):
    reason = "server_failed"


class ServerStartError(ServerError):
    reason = "server_start_failed"


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


class PortUnavailableError(RuntimeFailure):
    reason = "port_unavailable"


def vllm_serve_args(dep: DeploymentPlan, host: str, port: int) -> list[str]:
    """``serve MODEL --host --port --served-model-name --tensor-parallel-size`` plus the user's extra args."""
    return [
        "serve",
        dep.model,
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        dep.served_model_name,
        "--tensor-parallel-size",
        str(dep.tensor_parallel),
        *dep.extra_args,
    ]


@dataclass(frozen=True, slots=True)
class ServerCommand:
    argv: tuple[str, ...]
    srun_extra: tuple[str, ...] = ()


def server_command(serving: ServingPlan, dep: DeploymentPlan, host: str, port: int) -> ServerCommand:
    """How a replica is started: a bare executable, a Pyxis container (srun options) or Apptainer."""
    args = vllm_serve_args(dep, host, port)
    if serving.container_runtime == "pyxis":
        extra = [f"--container-image={serving.vllm_image}", "--no-container-mount-home"]
        if serving.container_mounts:
            extra.append(f"--container-mounts={','.join(serving.container_mounts)}")
        return ServerCommand(argv=("vllm", *args), srun_extra=tuple(extra))
    if serving.container_runtime == "apptainer":
        binds = [f"--bind={m}" for m in serving.container_mounts]
        return ServerCommand(argv=("apptainer", "exec", "--nv", *binds, str(serving.vllm_image), "vllm", *args))
    return ServerCommand(argv=(serving.vllm_executable, *args))


def token_environment(serving: ServingPlan, token: str) -> dict[str, str]:
    """What a server step's environment needs so that vLLM requires ``token``. Pyxis passes the step's
    environment into the container; Apptainer does too, and ``APPTAINERENV_`` holds even with ``--cleanenv``."""
    env = {TOKEN_ENV: token}
    if serving.container_runtime == "apptainer":
        env[f"APPTAINERENV_{TOKEN_ENV}"] = token
    return env


def auth_headers(token: str | None) -> dict[str, str]:
    """The Authorization header that the attempt's servers and proxies require (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def vllm_version(serving: ServingPlan, env: Mapping[str, str]) -> str:
    """The vLLM version (recorded, never gated). Only a bare executable can be asked cheaply."""
    if serving.container_runtime != "none":
        return f"unknown ({serving.container_runtime} image {serving.vllm_image})"
    try:
        out = subprocess.run(
            [serving.vllm_executable, "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(env),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return (out.stdout.strip() or out.stderr.strip()).splitlines()[-1] if out.returncode == 0 else "unknown"


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """GPUs Slurm gave this step: CUDA_VISIBLE_DEVICES, else SLURM_JOB_GPUS."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS"):
        value = env.get(name, "").strip()
        if value:
            return [v for v in value.split(",") if v]
    return []


def check_gpus(serving: ServingPlan, env: Mapping[str, str]) -> list[str]:
    gpus = visible_gpus(env)
    if len(gpus) != serving.gpus:
        raise GpuMismatchError(
            f"the plan places {serving.gpus} GPU(s) but this allocation sees {len(gpus)} "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r}, "
            f"SLURM_JOB_GPUS={env.get('SLURM_JOB_GPUS', '')!r})"
        )
    return gpus


def is_healthy(client: httpx.Client, base_url: str) -> bool:
    """``GET /health`` answers 200. Never with the token: vLLM's ``/health`` and the proxy's need none, and
    whatever answers on a port may be another user's (:mod:`ddslurm.runtime._listeners`)."""
    try:
        return client.get(f"{base_url}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


def answers(client: httpx.Client, base_url: str) -> bool:
    """Whether anything answers ``GET /health`` at all (any status): the process is alive and serving, even
    if it reports itself unhealthy (a proxy says 503 while none of its replicas is healthy). Without the token,
    as :func:`is_healthy`."""
    try:
        client.get(f"{base_url}/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return True


def _serves(client: httpx.Client, base_url: str, served_name: str, token: str | None) -> bool:
    """Whether ``/v1/models`` lists the served model name (it needs the token, unlike ``/health``)."""
    try:
        models = client.get(f"{base_url}/v1/models", headers=auth_headers(token), timeout=HEALTH_TIMEOUT_S)
        return models.status_code == 200 and served_name in {m.get("id") for m in models.json().get("data", [])}
    except (httpx.HTTPError, ValueError):
        return False


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def listening_ports(ephemeral_file: Path = EPHEMERAL_RANGE_FILE) -> range:
    """Where servers and proxies listen: outside the kernel's ephemeral range, from which every outgoing
    connection on the node (the clients' own, thousands a run) takes its source port. A port in that range can be
    held by a connection between the check and the server's bind, and the server then dies with "address already
    in use". Below the range when it leaves room there (Linux's default 32768-60999 leaves 20000-32767), else
    above it, else the whole of the old span."""
    try:
        low, high = (int(v) for v in ephemeral_file.read_text().split()[:2])
    except (OSError, ValueError):
        return range(PORT_BASE, PORT_BASE + PORT_SPAN)
    if low - PORT_BASE >= MIN_LISTEN_SPAN:
        return range(PORT_BASE, low)
    if 65536 - (high + 1) >= MIN_LISTEN_SPAN:
        return range(high + 1, 65536)
    return range(PORT_BASE, PORT_BASE + PORT_SPAN)


def choose_ports(
    wanted: list[int | None],
    job_id: str,
    is_free: Callable[[int], bool] = port_is_free,
    ports: range | None = None,
) -> list[int]:
    """Concrete ports: fixed ones are checked, the rest come from ``ports`` (:func:`listening_ports` unless
    given), starting at an offset derived from the job id (so two jobs sharing a node start far apart), and are
    checked before use."""
    ports = ports if ports is not None else listening_ports()
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    offset = (int(digits) * 64) % len(ports)
    taken: set[int] = {p for p in wanted if p is not None}
    out: list[int] = []
    for port in wanted:
        if port is not None:
            if not is_free(port):
                raise PortUnavailableError(f"port {port} (server.port) is already in use on this node")
            out.append(port)
            continue
        for _ in range(len(ports)):
            candidate = ports[offset]
            offset = (offset + 1) % len(ports)
            if candidate not in taken and is_free(candidate):
                break
        else:
            raise PortUnavailableError("no free port found on this node")
        taken.add(candidate)
        out.append(candidate)
    return out


def wait_ready(
    step: Step,
    base_url: str,
    served_name: str | None,
    timeout: float,
    *,
    client: httpx.Client,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval: float = 0.5,
    token: str | None = None,
) -> float:
    """Poll /health (then /v1/models for the served name) until ready; fail fast if the process exits.

    ``/health`` is asked without the token (vLLM's needs none); before ``/v1/models``, which needs it, the
    listener on the port must be this user's (:func:`~ddslurm.runtime._listeners.check_own_listener`): another
    user who took the port first, and answers like vLLM, gets no token and is never called ready.
    Returns the seconds it took. Raises ServerStartError (process died), ServerNotReadyError (deadline), each
    with the tail of the step's log, or ListenerNotOursError (the port is another user's).
    """
    start = clock()
    deadline = start + timeout
    while True:
        code = step.poll()
        if code is not None:
            raise ServerStartError(
                f"{step.name} exited with status {code} before it was ready; last lines of {step.spec.log}:\n"
                f"{read_tail(step.spec.log)}"
            )
        if is_healthy(client, base_url):
            check_own_listener(base_url)
            if served_name is None or _serves(client, base_url, served_name, token):
                return clock() - start
        if clock() >= deadline:
            raise ServerNotReadyError(
                f"{step.name} was not ready after {timeout:.0f} s (server.startup_timeout); last lines of "
                f"{step.spec.log}:\n{read_tail(step.spec.log)}"
            )
        sleep(interval)
