"""Model servers' command lines: vLLM and SGLang (bare, Pyxis, Apptainer; one node, or one node rank of a replica
that spans nodes), the token in their environment, their rendezvous ports, and each engine's version.

The token reaches a server through its environment (:data:`TOKEN_ENV`, which vLLM reads like ``--api-key``), never
through its command line, where ``ps`` would show it to every user of the node; SGLang, which reads no variable,
gets it from a one-line boot program (:data:`SGLANG_BOOT`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ddslurm.config import DeploymentPlan, Engine, ServingPlan
from ddslurm.runtime._follower_port import SGLANG_FOLLOWER_CHECK
from ddslurm.runtime._listeners import socket_path
from ddslurm.runtime._vllm_boot import VLLM_BOOT, script_python

TOKEN_ENV = "VLLM_API_KEY"
"""The variable vLLM (and the proxy) read the required API key from: ``--api-key`` without a command line."""


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
    job starts (:func:`~ddslurm.runtime._ports.draw_port`): no one can know it before the leader's step is on the
    node's command lines."""

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
    --dist-init-addr ADDRESS:PORT`` (every rank the same arguments, SGLang's followers serve no API but a dummy
    ``/health`` on the leader's ``--host --port``, which a follower's program checks first:
    :data:`~ddslurm.runtime._follower_port.SGLANG_FOLLOWER_CHECK`); then the user's extra args."""
    if socket_path(listen) is not None:
        raise ValueError(f"SGLang listens on a TCP port, not on a Unix-domain socket ({listen!r}): listen: tcp")
    follower = place is not None and place.node_rank > 0
    boot = SGLANG_FOLLOWER_CHECK + SGLANG_BOOT if follower else SGLANG_BOOT
    args = ["-c", boot, "--model-path", dep.model, *_where(listen)]
    args += ["--served-model-name", dep.served_model_name, "--tp-size", str(dep.tensor_parallel)]
    if dep.pipeline_parallel > 1:
        args += ["--pp-size", str(dep.pipeline_parallel)]
    if dep.data_parallel > 1:
        args += ["--dp-size", str(dep.data_parallel)]
    if dep.expert_parallel:
        args += ["--ep-size", str(dep.tensor_parallel)]
    args.append("--enable-metrics")
    if place is not None:
        host = f"[{place.address}]" if ":" in place.address else place.address  # SGLang's [IPv6]:PORT
        args += ["--nnodes", str(place.nodes), "--node-rank", str(place.node_rank), "--dist-init-addr"]
        args.append(f"{host}:{place.port}")
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
    serving: ServingPlan,
    dep: DeploymentPlan,
    listen: str,
    place: RankPlace | None = None,
    cache: Path | None = None,
    vllm_python: str | None = None,
) -> ServerCommand:
    """How one step of a replica is started: ``vllm serve`` or SGLang (:func:`sglang_args`, by the deployment's
    ``engine``), as a bare executable, in a Pyxis container (srun options) or with Apptainer, in the engine's own
    image. ``place``: the step's node rank of a replica that spans nodes (None: a replica on one node). A
    replica on a Unix-domain socket gets the socket's directory mounted at the same path inside a container
    (not a headless follower's: it serves no API, and the directory is on the leader's node). ``cache``: the
    engine cache (:mod:`~ddslurm.runtime._engine_cache`), mounted at the same path inside a container.
    ``vllm_python``: the Python of a bare ``vllm`` script (:func:`~ddslurm.runtime._vllm_boot.script_python`); with
    it, or in a container, vLLM starts through :data:`~ddslurm.runtime._vllm_boot.VLLM_BOOT` (its key in its
    arguments, never in its environment); None for a bare ``vllm`` that is no Python script: as before."""
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
        if serving.container_runtime != "none":
            args, inner = ["-c", VLLM_BOOT, "vllm", *args], "python3"
        elif vllm_python is not None:
            args, exe = ["-c", VLLM_BOOT, exe, *args], vllm_python
    path = None if headless else socket_path(listen)
    mounts = [*serving.container_mounts, *([f"{path.parent}:{path.parent}"] if path is not None else [])]
    mounts += [f"{cache}:{cache}"] if cache is not None else []
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


_METADATA_VERSION = (
    "import importlib.metadata as m, sys\n"
    "try: print(m.version(sys.argv[1]))\n"
    "except m.PackageNotFoundError: sys.exit(3)"
)
"""Prints an installed distribution's version from its metadata (``dist-info``) without importing it; exit 3:
not installed as a distribution (a source checkout on ``PYTHONPATH``)."""


def engine_version(serving: ServingPlan, engine: Engine, env: Mapping[str, str]) -> str:
    """The version of ``engine``, asked before any server starts (and by ``doctor`` on the submit host): the
    installed distribution's metadata, read by the engine's own Python (``sglang_executable``; the Python on
    ``vllm``'s ``#!`` line), which imports neither the engine nor torch (``vllm --version`` and ``import sglang``
    import both: seconds to tens of seconds on a cluster's shared filesystem, with the GPUs idle); where there is
    none (a ``vllm`` that is no Python script, an engine run from a source checkout), ``vllm --version`` or
    SGLang's ``sglang.__version__``. Only a bare executable can be asked cheaply; in a container, the image is
    named."""
    if engine == "sglang":
        exe, image = serving.sglang_executable, serving.sglang_image
        python: str | None = exe
        asked = [exe, "-c", "import sglang; print(sglang.__version__)"]
    else:
        exe, image = serving.vllm_executable, serving.vllm_image
        python = script_python(exe, env) if serving.container_runtime == "none" else None
        asked = [exe, "--version"]
    if serving.container_runtime != "none":
        return f"unknown ({serving.container_runtime} image {image})"
    if python is not None:
        found = _printed([python, "-c", _METADATA_VERSION, engine], env)
        if not found.startswith("unknown"):
            return found
    return _printed(asked, env)


def _printed(argv: list[str], env: Mapping[str, str]) -> str:
    """The last line ``argv`` printed (stdout, else stderr), or ``unknown`` (with why, where it could not run)."""
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
