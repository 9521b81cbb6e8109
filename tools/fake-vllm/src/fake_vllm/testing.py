"""Start a fake-vllm server as a subprocess on a free loopback port, for tests.

    with start_server("m", args=["--fake-latency", "0.01"], api_key="k") as server:
        httpx.post(f"{server.base_url}/chat/completions", headers=server.headers, json=...)

The child gets the parent's environment without any ``FAKE_VLLM_*`` or ``VLLM_API_KEY`` variables, plus
``env``. Its stdout and stderr go to ``server.log_path``. The server is terminated (then killed) on exit.
With ``uds=PATH`` it listens on that Unix-domain socket instead (``--uds``): talk to it through
``httpx.HTTPTransport(uds=str(server.uds))`` at ``server.root_url``. ``engine="sglang"`` starts it the way ddslurm
starts SGLang (``fake-sglang-python -c BOOT`` with a key, ``-m sglang.launch_server`` without).

A replica over several nodes, on loopback: ``start_replica(nodes=3, form="nodes")`` (or ``"data-parallel"``)
starts the leader (node rank 0, which serves the API) and each follower (``start_follower``: headless, no HTTP)
as separate processes with the flags ddslurm passes (``rank_args``), and waits until the leader is healthy.

Another process joining a leader's rendezvous, as any user of the node can (the engines' rendezvous has no
secret: the port, the sizes and the model are on the leader's command line, which ``ps`` shows):
``impersonation(leader_argv)`` is the hello of rank 1 read off that command line, and ``start_joiner(host, port,
hello)`` connects, sends it, and holds the connection until the context ends (``user=65534`` runs it as
``nobody``, with a Python that user can read).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

WaitFor = Literal["healthy", "listening", "none"]
EngineName = Literal["vllm", "sglang"]
Form = Literal["nodes", "data-parallel"]
SGLANG_BOOT = (
    'import os, runpy, sys; sys.argv += ["--api-key", os.environ["VLLM_API_KEY"]]; '
    'runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)'
)
"""The one-line program ddslurm runs SGLang's Python with: the key comes from the environment, never argv."""
_PORT_ATTEMPTS = 3
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_FROM = 20000
"""Where :func:`free_port` draws from, up to the start of the kernel's ephemeral range."""
_POLL_S = 0.05


class ServerStartError(RuntimeError):
    """The server exited or did not become ready before the deadline; the message ends with its log."""


@dataclass(frozen=True)
class RunningServer:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    api_key: str | None
    log_path: Path
    uds: Path | None = None
    """The Unix-domain socket it listens on (``--uds``), else None."""

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT`` (for /health and /metrics); ``http://localhost`` on a Unix-domain socket."""
        return "http://localhost" if self.uds is not None else f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        return f"{self.root_url}/v1"

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header for the configured key (empty without one)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, drawn at random below the kernel's ephemeral range (from 20000, where
    ddslurm's servers listen too): a port of that range (a bind to port 0's choice) can become the source port of
    any outgoing connection on the host before the server binds it, and the suite's runs open thousands. The
    kernel's choice where the range leaves no room below it; the caller retries if it is taken before use."""
    try:
        low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    below = range(LISTEN_FROM, low)
    for port in random.sample(below, k=min(len(below), 64)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def child_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """The parent's environment minus ``FAKE_VLLM_*`` and ``VLLM_API_KEY``, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_VLLM_") and k != "VLLM_API_KEY"}
    base["PYTHONUNBUFFERED"] = "1"
    return {**base, **(env or {})}


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(os.fspath(self._path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _unix_health_status(path: Path) -> int | None:
    connection = _UnixHTTPConnection(path, timeout=1.0)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def _health_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def _engine_command(engine: EngineName, model: str, *, with_key: bool) -> list[str]:
    """The engine's command line up to the model (``vllm serve MODEL`` / SGLang's ``--model-path MODEL``)."""
    if engine == "vllm":
        return [sys.executable, "-m", "fake_vllm", "serve", model]
    boot = ["-c", SGLANG_BOOT] if with_key else ["-m", "sglang.launch_server"]
    return [sys.executable, "-m", "fake_vllm.sglang_python", *boot, "--model-path", model]


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_BOUND = re.compile(r"Starting (?:vLLM API|SGLang) server on ")
"""What the server logs once its socket is bound: only then is an answer on its address its own."""


def _wait(server: RunningServer, wait: WaitFor, deadline: float) -> bool:
    """True when ready; False when the process exited (the caller inspects the log). An answer counts only once the
    process has bound its address (its log says so): another process already listening on a pinned port answers
    too, while this one fails to bind and exits."""
    if wait == "none":
        return True
    url = f"{server.root_url}/health"
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            return False
        status = _unix_health_status(server.uds) if server.uds is not None else _health_status(url)
        answered = status == 200 or (wait == "listening" and status is not None)
        if answered and _BOUND.search(server.log_text()):
            return True
        time.sleep(_POLL_S)
    raise ServerStartError(f"fake-vllm not {wait} after the deadline:\n{server.log_text()[-4000:]}")


def set_gate(path: Path, value: str | int) -> None:
    """Say what the server's gate (``--fake-gate PATH``, :mod:`fake_vllm.gate`) lets through: ``""`` (open), a number
    of requests, or ``"hold"``. Written whole and renamed into place: the server reads the file while a request
    waits, and a file being rewritten in place reads empty for a moment, which opens the gate."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staged.write_text(str(value))
    staged.replace(path)


@contextlib.contextmanager
def start_server(
    model: str = "m",
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    api_key: str | None = None,
    wait: WaitFor = "healthy",
    timeout: float = 20.0,
    host: str = "127.0.0.1",
    log_path: Path | None = None,
    port: int | None = None,
    uds: Path | None = None,
    engine: EngineName = "vllm",
) -> Iterator[RunningServer]:
    """Run ``fake-vllm serve MODEL --host HOST --port <free> *args``, with ``VLLM_API_KEY=api_key`` in its
    environment when a key is given (never ``--api-key`` on the command line, where ``ps`` shows it).
    ``engine="sglang"``: ``fake-sglang-python -c SGLANG_BOOT --model-path MODEL --host HOST --port <free> *args``
    with a key (BOOT appends ``--api-key`` from ``VLLM_API_KEY``), ``... -m sglang.launch_server ...`` without.

    ``wait``: ``"healthy"`` until /health is 200, ``"listening"`` until /health answers at all,
    ``"none"`` not at all. ``timeout`` bounds the wait; ``ServerStartError`` if it runs out or the server
    exits first. ``log_path`` defaults to a temporary file removed on exit. ``port`` pins the port (no retry on
    another one), e.g. to restart a server where its clients expect it. ``uds`` serves on that Unix-domain
    socket instead (``--uds``, no ``--host``/``--port``); the path must not exist, and the socket file is left
    behind on exit, as with vLLM.
    """
    if engine == "sglang" and uds is not None:
        raise ValueError("SGLang serves TCP only: no uds")
    scratch = None if log_path is not None else Path(tempfile.mkdtemp(prefix="fake-vllm-"))
    path = log_path if log_path is not None else Path(scratch or ".") / "server.log"
    deadline = time.monotonic() + timeout
    try:
        attempts = _PORT_ATTEMPTS if port is None and uds is None else 1
        for attempt in range(attempts):
            chosen = 0 if uds is not None else port if port is not None else free_port(host)
            where = ["--uds", os.fspath(uds)] if uds is not None else ["--host", host, "--port", str(chosen)]
            command = [*_engine_command(engine, model, with_key=api_key is not None), *where, *args]
            child_env = child_environment(env)
            if api_key is not None:  # by environment: a command line is visible to every user of the machine
                child_env["VLLM_API_KEY"] = api_key
            with path.open("wb") as log_file:
                proc = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=child_env
                )
            server = RunningServer(proc=proc, host=host, port=chosen, api_key=api_key, log_path=path, uds=uds)
            try:
                ready = _wait(server, wait, deadline)
            except BaseException:
                _stop(proc)
                raise
            if ready:
                try:
                    yield server
                finally:
                    _stop(proc)
                return
            text = server.log_text()
            if "address already in use" not in text.lower() or attempt == attempts - 1:
                raise ServerStartError(f"fake-vllm exited with status {proc.returncode}:\n{text[-4000:]}")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def rank_args(
    engine: EngineName,
    *,
    form: Form,
    nodes: int,
    rank: int,
    port: int,
    address: str = "127.0.0.1",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    data_parallel: int = 1,
) -> list[str]:
    """The parallel and rendezvous flags of node ``rank`` of a replica over ``nodes`` nodes, as ddslurm passes
    them (vLLM: ``--nnodes/--node-rank/--master-addr/--master-port``, or for ``form="data-parallel"``
    ``--data-parallel-size-local/--data-parallel-address/--data-parallel-rpc-port``, ``--headless
    --data-parallel-start-rank`` on ranks > 0; SGLang: ``--nnodes/--node-rank/--dist-init-addr``)."""
    if engine == "sglang":
        args = ["--tp-size", str(tensor_parallel), "--pp-size", str(pipeline_parallel)]
        if data_parallel > 1:
            args += ["--dp-size", str(data_parallel), "--enable-dp-attention"]
        return [*args, "--nnodes", str(nodes), "--node-rank", str(rank), "--dist-init-addr", f"{address}:{port}"]
    args = ["--tensor-parallel-size", str(tensor_parallel)]
    if form == "nodes":
        args += ["--pipeline-parallel-size", str(pipeline_parallel), "--nnodes", str(nodes), "--node-rank", str(rank)]
        args += ["--master-addr", address, "--master-port", str(port)]
        return [*args, "--headless"] if rank > 0 else args
    local = data_parallel // nodes
    args += ["--data-parallel-size", str(data_parallel), "--data-parallel-size-local", str(local)]
    args += ["--data-parallel-address", address, "--data-parallel-rpc-port", str(port)]
    return [*args, "--headless", "--data-parallel-start-rank", str(rank * local)] if rank > 0 else args


@dataclass(frozen=True)
class RunningRank:
    """A follower rank's process (headless: no HTTP)."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def start_follower(
    model: str = "m",
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    engine: EngineName = "vllm",
    log_path: Path | None = None,
) -> Iterator[RunningRank]:
    """Start a follower rank (``args`` holds its ``rank_args``); it is terminated (then killed) on exit."""
    scratch = None if log_path is not None else Path(tempfile.mkdtemp(prefix="fake-vllm-rank-"))
    path = log_path if log_path is not None else Path(scratch or ".") / "rank.log"
    command = [*_engine_command(engine, model, with_key=False), *args]
    try:
        with path.open("wb") as log_file:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=child_environment(env)
            )
        try:
            yield RunningRank(proc=proc, log_path=path)
        finally:
            _stop(proc)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@dataclass(frozen=True)
class Replica:
    """A multi-node replica on loopback: the leader (serving the API) and its followers."""

    leader: RunningServer
    followers: tuple[RunningRank, ...]
    rendezvous_port: int


@contextlib.contextmanager
def start_replica(
    model: str = "m",
    *,
    nodes: int,
    form: Form = "nodes",
    engine: EngineName = "vllm",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    data_parallel: int = 1,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    api_key: str | None = None,
    timeout: float = 30.0,
) -> Iterator[Replica]:
    """Start node rank 0 (``start_server``, with ``args``) and ranks 1..nodes-1 (``start_follower``) of one
    replica, meeting on a free loopback port, and wait until the leader is healthy (it is not before every
    follower joined)."""
    port = free_port()
    deadline = time.monotonic() + timeout

    def flags(rank: int) -> list[str]:
        sizes = rank_args(
            engine, form=form, nodes=nodes, rank=rank, port=port, tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel, data_parallel=data_parallel,
        )  # fmt: skip
        return [*sizes, *args]

    with contextlib.ExitStack() as stack:
        leader = stack.enter_context(
            start_server(
                model, args=flags(0), env=env, api_key=api_key, wait="listening", timeout=timeout, engine=engine
            )
        )
        followers = tuple(
            stack.enter_context(start_follower(model, args=flags(k), env=env, engine=engine)) for k in range(1, nodes)
        )
        if not _wait(leader, "healthy", deadline):
            status = leader.proc.returncode
            raise ServerStartError(f"the leader exited with status {status}:\n{leader.log_text()[-4000:]}")
        yield Replica(leader=leader, followers=followers, rendezvous_port=port)


JOINER = r"""
import json, socket, sys, time
host, port, hello = sys.argv[1], int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 30
while True:
    try:
        sock = socket.create_connection((host, port), timeout=2)
        break
    except OSError as exc:
        if time.monotonic() > deadline:
            print(json.dumps({"error": str(exc)}), flush=True)
            sys.exit(1)
        time.sleep(0.1)
line = b""
if sys.argv[4:] != ["silent"]:
    sock.sendall(hello.encode() + b"\n")
    sock.settimeout(10)
    try:
        while not line.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            line += chunk
    except OSError:
        pass
print(json.dumps({"reply": json.loads(line) if line.strip() else None, "port": sock.getsockname()[1]}), flush=True)
sys.stdin.read()  # hold the connection (even once the leader closed it) until the test closes stdin
"""
"""A process that joins a leader's rendezvous: ``JOINER HOST PORT HELLO [silent]`` connects (retrying for 30 s),
sends the one-line ``HELLO`` (``silent``: sends nothing and waits for no reply), prints ``{"reply": ..., "port": its
own port}`` and keeps its socket until stdin closes. Only the standard library: another user's Python runs it."""


def impersonation(argv: Sequence[str], *, rank: int = 1) -> dict[str, Any]:
    """The hello a follower of node rank ``rank`` sends, read off a leader's command line as ``ps`` shows it
    (``vllm serve MODEL ...``, or SGLang's ``... --model-path MODEL ...``): everything the engine's rendezvous
    compares is there."""
    from fake_vllm.cli import parse_serve_args, parse_sglang_args
    from fake_vllm.rendezvous import identity

    args = list(argv)
    if args and not args[-1]:
        args.pop()  # /proc/PID/cmdline ends with a NUL
    if "serve" in args:
        settings = parse_serve_args(args[args.index("serve") + 1 :], {})
    else:
        settings = parse_sglang_args(args[args.index("--model-path") :], {})
    return {**identity(settings), "rank": rank}


@dataclass
class Joiner:
    proc: subprocess.Popen[str]
    said: dict[str, Any]
    """What it printed once it sent its hello: ``reply`` (the leader's answer, None if it closed the connection
    without one) and ``port`` (its own end's), or ``error``."""


@contextlib.contextmanager
def start_joiner(
    host: str,
    port: int,
    hello: Mapping[str, Any],
    *,
    user: int | None = None,
    python: str | None = None,
    silent: bool = False,
) -> Iterator[Joiner]:
    """Run :data:`JOINER` against ``host:port`` with ``hello`` (as ``user`` if given: the caller must be root, and
    ``python`` one that user can run; ``silent``: it connects and says nothing, as a store client that has not
    spoken yet); its connection is held until the context ends."""
    argv = [
        python or sys.executable,
        "-c",
        JOINER,
        host,
        str(port),
        json.dumps(dict(hello)),
        *(["silent"] if silent else []),
    ]
    extra: dict[str, Any] = {"user": user, "group": user, "cwd": "/"} if user is not None else {}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **extra)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = proc.stdout.readline()
        yield Joiner(proc, json.loads(line) if line else {"error": f"exited with status {proc.wait()}"})
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
