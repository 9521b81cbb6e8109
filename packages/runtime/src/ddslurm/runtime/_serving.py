"""Model servers: vLLM and SGLang command lines (bare, Pyxis, Apptainer; one node, or one node rank of a replica
that spans nodes), ports and the ports held for proxies, GPU and node discovery, the leader's address, readiness.

Replicas listen on Unix-domain sockets (``--uds``) in an owner-only directory, or on loopback ports; the one TCP
listener of a deployment is its proxy, on a port :class:`PortHolds` keeps from every other user. Every attempt's
servers and proxies require the attempt's own random token (``Authorization: Bearer TOKEN``: vLLM on ``/v1/*``,
the proxy on every route but ``/health``), so another user's job on a shared node cannot use them. The token
reaches a server through its environment (:data:`TOKEN_ENV`, which vLLM reads like ``--api-key``), never through
its command line, where ``ps`` would show it to every user of the node; SGLang, which reads no variable, gets it
from a one-line boot program (:data:`SGLANG_BOOT`).
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ddslurm.config import DeploymentPlan, Engine, ServingPlan, read_tail
from ddslurm.runtime._listeners import check_own_listener, http_base, listeners, socket_path
from ddslurm.runtime._steps import Step
from ddslurm.runtime.errors import RuntimeFailure

if TYPE_CHECKING:  # the launcher renders server command lines from here and never probes: httpx is the probes'
    import httpx

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


class NodeMismatchError(RuntimeFailure):
    """The allocation has another number of nodes than the plan's serving spans (``SLURM_JOB_NUM_NODES``)."""

    reason = "node_mismatch"


class PortUnavailableError(RuntimeFailure):
    reason = "port_unavailable"


def _where(listen: str) -> list[str]:
    """Where the API listens: ``--uds PATH`` for a ``unix:`` URL, else ``--host H --port N``."""
    path = socket_path(listen)
    if path is not None:
        return ["--uds", str(path)]
    parts = urlsplit(listen)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"expected http://HOST:PORT or unix:PATH, got {listen!r}")
    return ["--host", parts.hostname, "--port", str(parts.port)]


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one node's step of a replica that spans nodes stands: its node rank (0: the leader, which serves
    the API; the others headless) and where the ranks meet, the leader node's ``address`` and a ``port`` there
    (strings, so that the dry-run bill can show ``<leader>`` and ``<port>``). The port is drawn at random when the
    job starts (:func:`draw_port`): no one can know it before the leader's step is on the node's command lines."""

    node_rank: int
    nodes: int
    address: str
    port: str


def vllm_serve_args(dep: DeploymentPlan, listen: str, place: RankPlace | None = None) -> list[str]:
    """``serve MODEL`` where it listens (``--uds PATH`` for a ``unix:`` URL, else ``--host --port``),
    ``--served-model-name --tensor-parallel-size``, the pipeline and data parallel sizes above 1 and
    ``--enable-expert-parallel``, then the user's extra args.

    ``place``: this step's node rank of a replica that spans ``place.nodes`` nodes, with vLLM's own rendezvous
    (docs/serving/parallelism_scaling.md, data_parallel_deployment.md). Without data parallel the stages meet at
    ``--master-addr``/``--master-port`` (``--nnodes``, ``--node-rank``); with it each node runs ``DP / nodes``
    data-parallel ranks (``--data-parallel-size-local``) that meet at ``--data-parallel-address``/
    ``--data-parallel-rpc-port``, a follower's first rank at ``--data-parallel-start-rank``. Followers (rank > 0)
    are ``--headless``: no API, so no ``--uds``/``--host``/``--port``."""
    follower = place is not None and place.node_rank > 0
    spanning_pp = place is not None and dep.data_parallel == 1
    args = ["serve", dep.model, *([] if follower else _where(listen))]
    args += ["--served-model-name", dep.served_model_name, "--tensor-parallel-size", str(dep.tensor_parallel)]
    if dep.pipeline_parallel > 1 or spanning_pp:
        args += ["--pipeline-parallel-size", str(dep.pipeline_parallel)]
    if dep.data_parallel > 1:
        args += ["--data-parallel-size", str(dep.data_parallel)]
        if place is not None:
            if place.nodes < 1 or dep.data_parallel % place.nodes:
                raise ValueError(
                    f"data_parallel {dep.data_parallel} of {dep.alias!r} does not divide over {place.nodes} node(s)"
                )
            local = dep.data_parallel // place.nodes
            args += [
                "--data-parallel-size-local",
                str(local),
                "--data-parallel-address",
                place.address,
                "--data-parallel-rpc-port",
                place.port,
            ]
            if follower:
                args += ["--headless", "--data-parallel-start-rank", str(place.node_rank * local)]
    if dep.expert_parallel:
        args.append("--enable-expert-parallel")
    if place is not None and spanning_pp:
        args += [
            "--nnodes",
            str(place.nodes),
            "--node-rank",
            str(place.node_rank),
            "--master-addr",
            place.address,
            "--master-port",
            place.port,
        ]
        if follower:
            args.append("--headless")
    return [*args, *dep.extra_args]


SGLANG_BOOT = (
    "import os,runpy,sys;"
    f"k=os.environ.get({TOKEN_ENV!r});"
    f"k or sys.exit('{TOKEN_ENV} is unset: SGLang is never started without its API key');"
    "sys.argv.append('--api-key='+k);"
    "runpy.run_module('sglang.launch_server',run_name='__main__',alter_sys=True)"
)
"""The one-line program (``python3 -c``) that starts SGLang with the attempt's token: SGLang takes its API key only
as ``--api-key``, so the program appends ``--api-key=TOKEN`` (one item: a token may start with ``-``, which
argparse would not take as the option's value) from :data:`TOKEN_ENV` to its own ``sys.argv``, which no other process
sees (``ps`` shows the command line the process was started with), and runs ``sglang.launch_server`` as
``python -m`` would. Without the variable it exits: an SGLang server never runs without a key."""


def sglang_args(dep: DeploymentPlan, listen: str, place: RankPlace | None = None) -> list[str]:
    """``-c BOOT`` (:data:`SGLANG_BOOT`) and SGLang's arguments: the model, where the API listens (``--host
    --port``: SGLang has no Unix-domain socket), the served name, ``--tp-size`` and the pipeline and data parallel
    sizes above 1, ``--ep-size`` (the tensor-parallel size) with expert parallel, ``--enable-metrics`` (the
    proxy's backpressure reads ``sglang:num_queue_reqs``); for a replica that spans nodes ``--nnodes --node-rank
    --dist-init-addr ADDRESS:PORT`` (every rank the same command, SGLang's followers serve no API); then the
    user's extra args."""
    if socket_path(listen) is not None:
        raise ValueError(f"SGLang listens on a TCP port, not on a Unix-domain socket ({listen!r}): listen: tcp")
    args = ["-c", SGLANG_BOOT, "--model-path", dep.model, *_where(listen)]
    args += ["--served-model-name", dep.served_model_name, "--tp-size", str(dep.tensor_parallel)]
    if dep.pipeline_parallel > 1:
        args += ["--pp-size", str(dep.pipeline_parallel)]
    if dep.data_parallel > 1:
        args += ["--dp-size", str(dep.data_parallel)]
    if dep.expert_parallel:
        args += ["--ep-size", str(dep.tensor_parallel)]
    args.append("--enable-metrics")
    if place is not None:
        args += [
            "--nnodes",
            str(place.nodes),
            "--node-rank",
            str(place.node_rank),
            "--dist-init-addr",
            f"{place.address}:{place.port}",
        ]
    return [*args, *dep.extra_args]


SGLANG_RENDEZVOUS_PORTS = 7
"""The ports SGLang's ranks meet at on the leader's node, from ``--dist-init-addr``'s on (torch's store there, its
ZeroMQ sockets at the next ones: ``PortArgs.init_new``, whose numbering varies between versions), before one more
per data-parallel rank."""


def rendezvous_span(dep: DeploymentPlan) -> int:
    """How many ports from the rendezvous port on are the ranks' meeting point on the leader's node: vLLM's one
    (``--master-port``, ``--data-parallel-rpc-port``), SGLang's :data:`SGLANG_RENDEZVOUS_PORTS` and one per
    data-parallel rank."""
    if dep.engine == "sglang":
        return SGLANG_RENDEZVOUS_PORTS + dep.data_parallel
    return 1


def server_step_name(alias: str, replica: int, node_rank: int = 0) -> str:
    """The step (and log) name of one node's step of a replica: ``server-<alias>-<i>`` for its leader (a replica on
    one node is its own leader), ``server-<alias>-<i>-rank<k>`` for the follower on its k-th node."""
    name = f"server-{alias}-{replica}"
    return name if node_rank == 0 else f"{name}-rank{node_rank}"


@dataclass(frozen=True, slots=True)
class ServerCommand:
    argv: tuple[str, ...]
    srun_extra: tuple[str, ...] = ()


def server_command(
    serving: ServingPlan, dep: DeploymentPlan, listen: str, place: RankPlace | None = None
) -> ServerCommand:
    """How one step of a replica is started: ``vllm serve`` or SGLang (:func:`sglang_args`, by the deployment's
    ``engine``), as a bare executable, in a Pyxis container (srun options) or with Apptainer, in the engine's own
    image. ``place``: the step's node rank of a replica that spans nodes (None: a replica on one node). A
    replica on a Unix-domain socket gets the socket's directory mounted at the same path inside a container
    (not a headless follower's: it serves no API, and the directory is on the leader's node)."""
    headless = place is not None and place.node_rank > 0
    if dep.engine == "sglang":
        args, exe, image, inner = (
            sglang_args(dep, listen, place),
            serving.sglang_executable,
            serving.sglang_image,
            "python3",
        )
    else:
        args, exe, image, inner = (
            vllm_serve_args(dep, listen, place),
            serving.vllm_executable,
            serving.vllm_image,
            "vllm",
        )
    path = None if headless else socket_path(listen)
    mounts = [*serving.container_mounts, *([f"{path.parent}:{path.parent}"] if path is not None else [])]
    if serving.container_runtime == "pyxis":
        extra = [f"--container-image={image}", "--no-container-mount-home"]
        if mounts:
            extra.append(f"--container-mounts={','.join(mounts)}")
        return ServerCommand(argv=(inner, *args), srun_extra=tuple(extra))
    if serving.container_runtime == "apptainer":
        binds = [f"--bind={m}" for m in mounts]
        return ServerCommand(argv=("apptainer", "exec", "--nv", *binds, str(image), inner, *args))
    return ServerCommand(argv=(exe, *args))


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


def engine_version(serving: ServingPlan, engine: Engine, env: Mapping[str, str]) -> str:
    """The version of ``engine`` (recorded, never gated): ``vllm --version``, or SGLang's ``sglang.__version__``
    asked of its Python. Only a bare executable can be asked cheaply; in a container, the image is named."""
    if engine == "sglang":
        exe, image = serving.sglang_executable, serving.sglang_image
        argv = [exe, "-c", "import sglang; print(sglang.__version__)"]
    else:
        exe, image = serving.vllm_executable, serving.vllm_image
        argv = [exe, "--version"]
    if serving.container_runtime != "none":
        return f"unknown ({serving.container_runtime} image {image})"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=dict(env), check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    if out.returncode != 0:
        return "unknown"
    lines = (out.stdout.strip() or out.stderr.strip()).splitlines()
    return lines[-1] if lines else "unknown"


def vllm_version(serving: ServingPlan, env: Mapping[str, str]) -> str:
    """The vLLM version (:func:`engine_version` of ``vllm``)."""
    return engine_version(serving, "vllm", env)


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


def check_nodes(serving: ServingPlan, env: Mapping[str, str]) -> None:
    """The allocation has the plan's ``serving.nodes`` nodes, as Slurm says (``SLURM_JOB_NUM_NODES``, else
    ``SLURM_NNODES``; outside Slurm, neither set, nothing to check): a replica's follower placed on a node the
    allocation lacks would never start."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = env.get(name, "").strip()
        if value:
            if value != str(serving.nodes):
                raise NodeMismatchError(
                    f"the plan places its servers on {serving.nodes} node(s) but this allocation has {value} "
                    f"({name}={value!r})"
                )
            return


LOOPBACK = "127.0.0.1"


def leader_address(
    env: Mapping[str, str], run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> str:
    """Where the followers of a replica that spans nodes reach its leader: the address Slurm knows this node by
    (``NodeAddr`` of ``scontrol show node $SLURMD_NODENAME -o``; the controller runs on the allocation's first
    node, the leaders' node), else the node's name; outside Slurm (no ``SLURMD_NODENAME``) loopback."""
    node = env.get("SLURMD_NODENAME", "").strip()
    if not node:
        return LOOPBACK
    try:
        out = run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return node
    if out.returncode == 0:
        for field in out.stdout.split():
            key, _, value = field.partition("=")
            if key == "NodeAddr" and value and value != "(null)":
                return value
    return node


def _node_addresses(name: str) -> set[str]:
    """The IP addresses ``name`` (an address, or a host name the resolver knows) stands for; none if unknown."""
    try:
        return {str(info[4][0]).partition("%")[0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return set()


def allocation_addresses(
    env: Mapping[str, str], run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> frozenset[str]:
    """The IP addresses of the allocation's nodes (``SLURM_JOB_NODELIST``): each node's ``NodeAddr`` and
    ``NodeHostName`` as ``scontrol show node`` says, resolved; outside Slurm, loopback. A replica's followers reach
    its leader's rendezvous from these (:func:`~ddslurm.runtime._listeners.check_rendezvous`)."""
    nodelist = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "").strip()
    if not nodelist:
        return frozenset({LOOPBACK})
    names: set[str] = set()
    try:
        out = run(["scontrol", "show", "node", nodelist, "-o"], capture_output=True, text=True, timeout=30, check=False)
        if out.returncode == 0:
            for field in out.stdout.split():
                key, _, value = field.partition("=")
                if key in ("NodeAddr", "NodeHostName") and value and value != "(null)":
                    names.add(value)
        if not names:
            out = run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=False
            )
            names.update(out.stdout.split() if out.returncode == 0 else ())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return frozenset(address for name in names for address in _node_addresses(name))


def resolved(address: str) -> frozenset[str]:
    """``address`` (the leader's, :func:`leader_address`) as IP addresses: itself if it is one, else resolved."""
    return frozenset(_node_addresses(address))


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
    for ``url`` (:class:`ListenerClients`)."""
    import httpx

    try:
        return client.get(f"{http_base(url)}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


def answers(client: httpx.Client, url: str) -> bool:
    """Whether anything answers ``GET /health`` at all (any status): the process is alive and serving, even
    if it reports itself unhealthy (a proxy says 503 while none of its replicas is healthy). Without the token,
    as :func:`is_healthy`."""
    import httpx

    try:
        client.get(f"{http_base(url)}/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return True


def _serves(client: httpx.Client, url: str, served_name: str, token: str | None) -> bool:
    """Whether ``/v1/models`` lists the served model name (it needs the token, unlike ``/health``)."""
    import httpx

    try:
        models = client.get(f"{http_base(url)}/v1/models", headers=auth_headers(token), timeout=HEALTH_TIMEOUT_S)
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


class _PortSockets:
    """Sockets this process keeps bound, one a port, until it lets them go (or dies, and the kernel does)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._held: dict[int, socket.socket] = {}

    def holds(self, port: int) -> bool:
        return port in self._held

    def let_go(self, port: int) -> None:
        """Release ``port`` alone (held or not)."""
        sock = self._held.pop(port, None)
        if sock is not None:
            sock.close()

    def release(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()


class PortHolds(_PortSockets):
    """Loopback ports this process holds for the proxies it starts, so that no other user can ever bind them.

    A held port is bound with ``SO_REUSEPORT`` and never listened on: the kernel lets another socket bind the
    same address only if it sets ``SO_REUSEPORT`` too *and* belongs to the same uid. The proxy (started with
    ``--reuse-port``) binds and listens beside the hold; when it dies, the hold keeps the port: a connection is
    refused (nothing listens) instead of reaching whoever bound it next, and the restarted proxy binds it again.
    Another user's bind fails with "address already in use" before, during and after the proxy's life."""

    def take(self, port: int) -> bool:
        """Hold ``port`` (True), or False when it is not free: bound by anyone without ``SO_REUSEPORT`` or by
        another uid, listened on by anyone (this uid's stale proxy too), or held already."""
        if port in self._held:
            return False
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self._host, port))
        except OSError:
            sock.close()
            return False
        if any(listener.port == port for listener in listeners()):
            # This uid's own listener with SO_REUSEPORT (a proxy left by an earlier job): the kernel would share
            # the port's connections between it and the new proxy.
            sock.close()
            return False
        self._held[port] = sock
        return True


class PortClaims(_PortSockets):
    """The ports this process chose for its servers, claimed node-wide until it lets them go or dies.

    A port is chosen free and bound by the server a moment later (seconds for a real engine): two controllers on
    one node (two jobs, or the tests' three nodes on one host) that choose in that moment would both find it free,
    and the later server dies with "address already in use". A claim is a Unix-domain socket bound in Linux's
    abstract namespace under a name derived from the port: binding it is atomic across the node, it leaves no file,
    and the kernel lets it go when the process ends however it ends. A name bound by anyone else is not this
    process's to take (any user can bind an abstract name: the port is passed over, never shared)."""

    def take(self, port: int, is_free: Callable[[int], bool] | None = None) -> bool:
        """Claim ``port`` if no other process has and ``is_free`` (else :func:`port_is_free` on this host) says it
        is free (True), else False."""
        if port in self._held:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"\0ddslurm-port-{self._host}-{port}")
        except OSError:
            sock.close()
            return False
        if not (is_free(port) if is_free is not None else port_is_free(port, self._host)):
            sock.close()
            return False
        self._held[port] = sock
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


def draw_port(take: Callable[[int], bool], *, span: int = 1, ports: range | None = None) -> int:
    """A port drawn at random from ``ports`` (:func:`listening_ports` unless given) such that ``take`` accepts it
    (it claims the ``span`` ports from it on, :class:`PortClaims`): the first one ``take`` accepts from a random
    place on, so that no one can tell it before the job starts (unlike :func:`choose_ports`, whose order follows
    the job id). Raises :class:`PortUnavailableError` when ``take`` accepts none."""
    ports = ports if ports is not None else listening_ports()
    starts = range(ports.start, ports.stop - span + 1)
    if len(starts) > 0:
        offset = secrets.randbelow(len(starts))
        for i in range(len(starts)):
            candidate = starts[(offset + i) % len(starts)]
            if take(candidate):
                return candidate
    raise PortUnavailableError(f"no free rendezvous port ({span} in a row) found on this node in {ports}")


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
) -> float:
    """Poll /health (then /v1/models for the served name) until ready; fail fast if the process exits, or any of
    ``ranks`` (the headless followers of a replica that spans nodes: its leader may wait for them for ever).
    ``watch`` (a replica that spans nodes: its rendezvous, :func:`~ddslurm.runtime._listeners.check_rendezvous`)
    is called before each poll, and again when a step exited, so that an intruder, not the death it caused, is
    what the start fails with.

    ``url``: ``http://HOST:PORT`` or ``unix:/path`` (``client`` the one for it, :class:`ListenerClients`).
    ``/health`` is asked without the token (vLLM's needs none); before ``/v1/models``, which needs it, the
    listener on the port must be this user's (:func:`~ddslurm.runtime._listeners.check_own_listener`): another
    user who took the port first, and answers like vLLM, gets no token and is never called ready.
    Returns the seconds it took. Raises ServerStartError (process died), ServerNotReadyError (deadline), each
    with the tail of the step's log, or ListenerNotOursError (the port is another user's).
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
            raise ServerStartError(
                f"{step.name} exited with status {code} before it was ready; last lines of {step.spec.log}:\n"
                f"{read_tail(step.spec.log)}"
            )
        for rank in ranks:
            if (code := rank.poll()) is not None:
                if watch is not None:
                    watch()
                raise ServerStartError(
                    f"{rank.name} exited with status {code} before {step.name} was ready; last lines of "
                    f"{rank.spec.log}:\n{read_tail(rank.spec.log)}"
                )
        if is_healthy(client, url):
            check_own_listener(url)
            if served_name is None or _serves(client, url, served_name, token):
                return clock() - start
        if clock() >= deadline:
            raise ServerNotReadyError(
                f"{step.name} was not ready after {timeout:.0f} s (server.startup_timeout); last lines of "
                f"{step.spec.log}:\n{read_tail(step.spec.log)}"
            )
        sleep(interval)
