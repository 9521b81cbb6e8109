"""An allocation's model servers and their proxies started: every replica's steps, then each deployment's proxy,
not waiting; then waiting until every replica, then every proxy, answers (serving.json records them).

Every deployment's endpoint is its proxy, on a loopback port held for the whole allocation
(:class:`~ddslurm.runtime._ports.PortHolds`: no other user can bind it, even while the proxy restarts); the
replicas listen on Unix-domain sockets in a scratch directory only this user can enter (``listen: unix``), or on
loopback ports proved to be this user's before the token reaches them (``listen: tcp``; each claimed node-wide
from its choice, :class:`~ddslurm.runtime._ports.PortClaims`, so that no other job chooses it too). Servers and
proxies get the job's environment without any of the run's secrets, and the attempt's token (``VLLM_API_KEY``); a
server also the variables its deployment names in ``server.env_from``. Their output reaches their logs through the
runtime, the token taken out (:mod:`~ddslurm.runtime._redact`: SGLang logs its arguments, the key among them).

A replica that spans nodes (``ReplicaPlan.nodes`` > 1, always the allocation's only replica) is one step per node:
its leader (``server-<alias>-<i>``, node 0, where the proxies and clients run too) serves the API, its headless
followers (``server-<alias>-<i>-rank<k>``, node k) join it at the leader node's address (an IP address of that node,
resolved before any rank is rendered: :func:`~ddslurm.runtime._leader_address.leader_ip`) on a rendezvous port drawn
at random on that node when the job starts. The replica is ready when its leader is; any rank that exits is the
replica's death. The engines' rendezvous has no secret and its port is on the ranks' command lines: from launch to
teardown the controller watches who is connected to it (``check_rendezvous``: another user on this node, or a host
outside the allocation, fails the attempt ``rendezvous_intruder`` and the replica is never, or no longer, served).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from ddslurm.config import DeploymentPlan, Engine, ServingPlan, atomic_write, busy_log, encode_pretty, prompts_file
from ddslurm.runtime._engine_cache import cache_environment, engine_cache_dir, ensure_engine_cache
from ddslurm.runtime._engine_flags import check_serving, refusal_text
from ddslurm.runtime._leader_address import LeaderAddress, leader_ip
from ddslurm.runtime._listeners import MAX_SOCKET_PATH, check_rendezvous, socket_path, unix_url
from ddslurm.runtime._node_discovery import allocation_addresses, check_gpus, check_nodes, leader_address
from ddslurm.runtime._ports import PortClaims, PortHolds, choose_ports, draw_port
from ddslurm.runtime._scratch import create_scratch, own_scratch_owner, scratch_base
from ddslurm.runtime._server_command import (
    TOKEN_ENV,
    RankPlace,
    engine_version,
    rendezvous_span,
    server_command,
    server_step_name,
    token_environment,
)
from ddslurm.runtime._serving import EngineTooOldError, ListenerClients, PortUnavailableError, wait_ready
from ddslurm.runtime._steps import Step, StepLauncher, StepSpec, without
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._vllm_boot import script_python
from ddslurm.runtime.errors import RuntimeFailure, SecretMissingError

HOST = "127.0.0.1"
SOCKET_ROOM = 64
"""Bytes of a socket path left for the scratch directory's name and the socket's own (``<alias>-<i>.sock``)."""
PROXY_READY_S = 60.0
"""How long a proxy may take to answer, once started (it answers as soon as one of its replicas does)."""


def proxy_argv(
    runtime_exe: Path | str,
    port: int,
    upstreams: Sequence[tuple[str, Path]],
    log: Path,
    record_prompts: Path | None = None,
    engine: str = "vllm",
) -> list[str]:
    """How a deployment's proxy step is started: ``ddslurm-runtime proxy`` on ``HOST:port`` with
    ``--reuse-port`` (beside the controller's hold on the port), each upstream (its URL and its busy log), the
    prompts file of a tune allocation, ``--engine sglang`` for SGLang's replicas (whose probe must not generate:
    ``_upstreams``) and its structured log. Its token is ``VLLM_API_KEY`` in its environment,
    never here. (``tools/gpu_smoke`` starts the proxy in front of a real vLLM the same way.)"""
    argv = [str(runtime_exe), "proxy", "--listen", f"{HOST}:{port}", "--reuse-port"]
    for url, busy in upstreams:
        argv += ["--upstream", url, "--busy-log", str(busy)]
    if record_prompts is not None:
        argv += ["--record-prompts", str(record_prompts)]
    if engine == "sglang":
        argv += ["--engine", "sglang"]
    return [*argv, "--log", str(log)]


@dataclass(slots=True)
class Replica:
    alias: str
    index: int
    url: str
    """``http://127.0.0.1:PORT`` or ``unix:/path.sock``."""
    step: Step
    """Its leader's step (the only one of a replica on one node): the API, health, readiness."""
    followers: list[Step] = field(default_factory=list)
    """The headless steps of a replica that spans nodes, node rank 1 on."""
    rendezvous: tuple[int, ...] = ()
    """The ports its ranks meet at on this node (its leader's), watched from launch to teardown."""

    @property
    def port(self) -> int | None:
        return None if socket_path(self.url) is not None else int(self.url.rpartition(":")[2])

    @property
    def steps(self) -> list[Step]:
        return [self.step, *self.followers]

    def dead(self) -> list[Step]:
        """Its steps that have exited: any one is the replica's death (a rank lost, the engine cannot go on)."""
        return [s for s in self.steps if s.poll() is not None]


@dataclass(slots=True)
class ProxyStep:
    """The balancing endpoint of one alias: the client's only way to its replicas, so it is watched too."""

    alias: str
    port: int
    step: Step
    log: Path
    """The proxy's structured log (``proxy-<alias>.log``); the step's own output is ``step.spec.log``."""
    hung: bool = False
    """Stopped by the controller because it no longer answered."""

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


class FleetStart:
    """The servers and proxies of one allocation. ``directory`` holds their logs and ``serving.json``; ``secrets``
    names the variables of ``env`` they never see; ``server_mb`` and ``proxy_mb`` are each step's memory share;
    ``locate_leader`` says where the followers of a replica that spans nodes reach this node (its leaders'),
    ``locate_nodes`` the addresses of the allocation's nodes, whence they come; ``place_leader`` turns the
    leader's address and the nodes' into the IP address the ranks meet at (:func:`leader_ip`)."""

    def __init__(
        self,
        *,
        launcher: StepLauncher,
        env: Mapping[str, str],
        secrets: Sequence[str],
        runtime_exe: Path,
        directory: Path,
        job_id: str,
        token: str,
        server_mb: int | None,
        proxy_mb: int | None,
        http: httpx.Client,
        stop: StopSignal,
        log: Any,
        grace: float,
        unhealthy_limit: int,
        locate_leader: Callable[[Mapping[str, str]], str] = leader_address,
        locate_nodes: Callable[[Mapping[str, str]], frozenset[str]] = allocation_addresses,
        place_leader: Callable[[str, frozenset[str]], LeaderAddress] = leader_ip,
        record_prompts: bool = False,
    ) -> None:
        self._launcher = launcher
        self._record_prompts = record_prompts
        """A tune allocation's: each proxy records the request bodies it forwards (``prompts_file``)."""
        self._env = env
        self._plain_env = without(env, secrets)
        """The job's environment without any secret: the API keys (the client's) and ``server.env_from``."""
        self._runtime_exe = runtime_exe
        self._dir = directory
        self._job = job_id
        self._token = token
        self._server_mb, self._proxy_mb = server_mb, proxy_mb
        self._clients = ListenerClients(http)
        self._holds = PortHolds(HOST)
        self._claims = PortClaims(HOST)
        self._stop = stop
        self._log = log
        self._grace = grace
        self._unhealthy_limit = unhealthy_limit
        self._locate_leader = locate_leader
        """Where the followers of a replica that spans nodes reach this node (:func:`leader_address` of ``env``)."""
        self._node: int | None = None
        """The node of every step but the followers (``StepSpec.node``): 0 in an allocation of several nodes."""
        self._locate_nodes = locate_nodes
        self._place_leader = place_leader
        self._rendezvous: set[int] = set()
        """The rendezvous ports of the replicas that span nodes (on this node, the leaders')."""
        self._nodes: frozenset[str] = frozenset()
        """The allocation's nodes' addresses, where a replica's followers may connect to its rendezvous from."""
        self._here: frozenset[str] = frozenset()
        """This node's addresses: the one the followers reach it at (the leader's) and its interfaces'."""
        self._sockets: Path | None = None
        """The scratch directory (owner-only) of the replicas' Unix-domain sockets, made when one is needed."""
        self._replicas: dict[str, list[Replica]] = {}
        self._proxies: dict[str, ProxyStep] = {}
        self._servers: list[Step] = []
        """Every server step started, in order."""
        self._failures: dict[str, int] = {}
        """Failed health checks in a row, by step name."""
        self._answered: dict[str, int | None] = {}
        """Answers each replica (by URL) had given through its proxy at the last health check."""
        self._reported: set[int] = set()
        """The replica lives (their leader step's ``id``) whose death was logged."""
        self._deployments: dict[str, DeploymentPlan] = {}
        self._restarts: dict[tuple[str, int], int] = {}
        """Restarts used, by (alias, replica index)."""
        self._restarting: dict[tuple[str, int], float] = {}
        """Replicas started again that have not answered /health yet: when (monotonic) their restart began."""
        self._launched_at: float | None = None
        """When the first server step started (monotonic)."""
        self._ready_at: dict[str, float] = {}
        """When every replica of each alias answered (monotonic)."""

    def launch(self, serving: ServingPlan) -> Callable[[], dict[str, str]]:
        """Start every replica's steps, then every deployment's proxy (it answers once one replica does), not
        waiting for them; returns each engine's version (asked, and the command lines checked against it, before
        the first server starts)."""
        version = self._launch_servers(serving)
        self._launch_proxies(serving)
        return version

    def wait_ready(self, serving: ServingPlan, version: Callable[[], dict[str, str]]) -> dict[str, str]:
        """Every replica answers (its model loaded: its leader, while none of its followers exits), then every
        proxy; serving.json records them. Returns each alias's endpoint: its proxy, or its one replica."""
        for dep in serving.deployments:
            for replica in self._replicas[dep.alias]:
                watch = partial(self._check_rendezvous, replica, "before it served") if replica.rendezvous else None
                took = self._wait_ready(
                    replica.step,
                    replica.url,
                    dep.served_model_name,
                    dep.startup_timeout,
                    replica.followers,
                    watch,
                    dep.engine,
                )
                self._log.info("server.ready", step=replica.step.name, seconds=round(took, 2))
            self._ready_at[dep.alias] = time.monotonic()
        for proxy in self._proxies.values():
            self._wait_ready(proxy.step, proxy.url, None, PROXY_READY_S)
            self._log.info("proxy.ready", alias=proxy.alias, port=proxy.port)
        self._record(serving, version())
        return {
            d.alias: (self._proxies[d.alias].url if d.proxy else self._replicas[d.alias][0].url)
            for d in serving.deployments
        }

    def _launch_servers(self, serving: ServingPlan) -> Callable[[], dict[str, str]]:
        check_nodes(serving, self._env)
        gpus = check_gpus(serving, self._env)
        missing = sorted({n for d in serving.deployments for n in d.env_from if not self._env.get(n)})
        if missing:
            raise SecretMissingError(
                f"variable(s) {', '.join(missing)} named by server.env_from are unset in the job's environment"
            )
        versions = self._check_versions(serving)
        self._log.info("serving.start", gpus=len(gpus), nodes=serving.nodes)
        for dep in serving.deployments:
            if dep.listen == "unix" and not dep.proxy:
                raise RuntimeFailure(f"the plan puts {dep.alias!r} on Unix-domain sockets without its proxy")
        self._node = serving.home_node
        spanning = [(d, r) for d in serving.deployments for r in d.replicas if r.nodes > 1]
        # The listeners' ports, then the rendezvous ports of the replicas that span nodes (drawn at random, each
        # with the engine's next ones), all distinct, all claimed and free here.
        wanted = [r.port for d in serving.deployments if d.listen == "tcp" for r in d.replicas]
        ports = iter(choose_ports(wanted, self._job, self._claims.take))
        rendezvous: dict[tuple[str, int], int] = {}
        blocks: dict[tuple[str, int], tuple[int, ...]] = {}
        for d, r in spanning:
            span = rendezvous_span(d)
            first = draw_port(partial(self._claim_block, span=span), span=span)
            rendezvous[(d.alias, r.index)] = first
            blocks[(d.alias, r.index)] = tuple(range(first, first + span))
            self._rendezvous.update(blocks[(d.alias, r.index)])
        address: str | None = None
        if spanning:
            # The leader's address as an IP address of this host, before any rank is rendered with it.
            self._nodes = self._locate_nodes(self._env)
            name = self._locate_leader(self._env)
            try:
                leader = self._place_leader(name, self._nodes)
            except RuntimeFailure as exc:
                self._log.error("serving.leader_address", name=name, why=exc.message)
                raise
            address, self._here = leader.ip, leader.local | {leader.ip}
            self._log.info("serving.leader_address", name=name, address=address)
        vllm_python = script_python(serving.vllm_executable, self._plain_env)  # its key by VLLM_BOOT
        cache = engine_cache_dir(serving, self._env)
        if cache is not None:
            ensure_engine_cache(cache)
            self._log.info("serving.engine_cache", directory=str(cache))
        for dep in serving.deployments:
            self._deployments[dep.alias] = dep
            env = {
                **self._plain_env,
                **({} if cache is None else cache_environment(cache, {**self._plain_env, **dep.env})),
                **dep.env,
                **{name: self._env[name] for name in dep.env_from},
                **token_environment(serving, self._token),
            }
            for rep in dep.replicas:
                name = server_step_name(dep.alias, rep.index)
                url = self._socket_url(name) if dep.listen == "unix" else f"http://{HOST}:{next(ports)}"
                meet = rendezvous.get((dep.alias, rep.index))
                steps: list[Step] = []
                for rank in range(rep.nodes):
                    place = None if meet is None else RankPlace(rank, rep.nodes, str(address), str(meet))
                    step_name = server_step_name(dep.alias, rep.index, rank)
                    try:
                        cmd = server_command(serving, dep, url, place, cache, vllm_python)
                    except ValueError as exc:  # a shape the planner refuses: never retried into the same wall
                        raise RuntimeFailure(f"{step_name} cannot be started: {exc}") from exc
                    spec = StepSpec(
                        name=step_name,
                        argv=cmd.argv,
                        env=env,
                        log=self._dir / f"{step_name}.log",
                        cpus=rep.cpus,
                        mem_mb=self._server_mb,
                        gpus=rep.gpus,
                        gpu_request=serving.gpu_request,
                        srun_extra=cmd.srun_extra,
                        node=self._node if rank == 0 else rank,
                        redact=(self._token,),
                    )
                    step = self._launcher.start(spec)
                    if self._launched_at is None:
                        self._launched_at = step.started
                    self._servers.append(step)
                    steps.append(step)
                    extra = {} if place is None else {"node_rank": rank, "rendezvous": f"{address}:{meet}"}
                    self._log.info("server.started", step=spec.name, listen=url, argv=list(cmd.argv), **extra)
                replica = Replica(
                    dep.alias, rep.index, url, steps[0], steps[1:], blocks.get((dep.alias, rep.index), ())
                )
                self._replicas.setdefault(dep.alias, []).append(replica)

        return lambda: dict(versions)

    def _check_versions(self, serving: ServingPlan) -> dict[str, str]:
        """Each engine's version, asked before any server starts, and every flag of the servers' command lines
        checked against it (:func:`check_serving`): a too-old engine fails the attempt ``engine_too_old`` here,
        naming each flag and the version it needs; a version that cannot be read is logged, not refused."""
        engines: list[Engine] = list(dict.fromkeys(d.engine for d in serving.deployments))
        versions: dict[Engine, str] = {e: engine_version(serving, e, self._plain_env) for e in engines}
        for check in check_serving(serving, versions):
            if check.refusals:
                exe = serving.sglang_executable if check.engine == "sglang" else serving.vllm_executable
                self._log.error("serving.engine_too_old", engine=check.engine, version=check.version)
                raise EngineTooOldError(refusal_text(check, exe))
            if check.note:
                self._log.warning("serving.engine_version", engine=check.engine, note=check.note)
        return {str(engine): version for engine, version in versions.items()}

    def _claim_block(self, first: int, span: int) -> bool:
        """Claim the ``span`` ports from ``first`` on (:class:`PortClaims`), all or none."""
        taken: list[int] = []
        for port in range(first, first + span):
            if not self._claims.take(port):
                for held in taken:
                    self._claims.let_go(held)
                return False
            taken.append(port)
        return True

    def _check_rendezvous(self, replica: Replica, when: str) -> None:
        """Nobody but this user's ranks is connected to ``replica``'s rendezvous (:func:`check_rendezvous`); else the
        attempt fails, logged, with the replica named (its steps are stopped by the teardown)."""
        try:
            check_rendezvous(replica.rendezvous, self._nodes, here=self._here)
        except RuntimeFailure as exc:
            self._log.error("server.intruder", step=replica.step.name, ports=list(replica.rendezvous), why=exc.message)
            raise type(exc)(
                f"{replica.step.name} (replica {replica.index} of {replica.alias!r}) was stopped {when}: {exc.message}"
                "; tell the cluster's administrators"
            ) from None

    def _socket_url(self, name: str) -> str:
        """Where the replica ``name`` listens: a socket in this allocation's owner-only scratch directory (made
        on first use, in the job's temporary directory or /tmp, short enough for a socket path; a directory left
        by a killed controller is swept like any scratch directory)."""
        if self._sockets is None:
            # The job's temporary directory, unless its path leaves too little room for a socket name: /tmp then.
            base = scratch_base(self._env)
            if len(os.fsencode(base)) > MAX_SOCKET_PATH - SOCKET_ROOM:
                base = Path("/tmp")
            self._sockets = create_scratch(base, own_scratch_owner(self._env, f"serving-{self._job}"))
        path = self._sockets / f"{name.removeprefix('server-')}.sock"
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise PortUnavailableError(
                f"the socket path {path} is longer than the {MAX_SOCKET_PATH} bytes a Unix-domain socket allows; "
                "use shorter model aliases, or pin server.port to serve on loopback ports"
            )
        return unix_url(path)

    def _launch_proxies(self, serving: ServingPlan) -> None:
        """The proxy of every deployment, each on a port held until teardown (:class:`PortHolds`)."""
        proxied = [d for d in serving.deployments if d.proxy]
        used = {r.port for reps in self._replicas.values() for r in reps} | self._rendezvous
        ports = iter(
            choose_ports([None] * len(proxied), f"{self._job}7", lambda p: p not in used and self._holds.take(p))
        )
        for dep in proxied:
            upstreams = self._replicas[dep.alias]
            proxy = self._start_proxy(dep.alias, next(ports), upstreams, serving.proxy_cpus)
            self._log.info("proxy.started", alias=dep.alias, port=proxy.port, upstreams=[r.url for r in upstreams])

    def _start_proxy(self, alias: str, port: int, upstreams: list[Replica], cpus: int) -> ProxyStep:
        log_path = self._dir / f"proxy-{alias}.log"
        argv = proxy_argv(
            self._runtime_exe,
            port,
            # each replica's busy log named by its index, whichever replicas are left
            [(r.url, busy_log(self._dir, alias, r.index)) for r in upstreams],
            log_path,
            prompts_file(self._dir, alias) if self._record_prompts else None,
            self._deployments[alias].engine,
        )
        spec = StepSpec(
            name=f"proxy-{alias}",
            argv=tuple(argv),
            env={**self._plain_env, TOKEN_ENV: self._token},
            log=self._dir / f"proxy-{alias}.out",
            cpus=cpus,
            mem_mb=self._proxy_mb,
            node=self._node,
            redact=(self._token,),
        )
        proxy = ProxyStep(alias, port, self._launcher.start(spec), log_path)
        self._proxies[alias] = proxy
        return proxy

    def _wait_ready(
        self,
        step: Step,
        url: str,
        served: str | None,
        timeout: float,
        ranks: Sequence[Step] = (),
        watch: Callable[[], None] | None = None,
        engine: Engine = "vllm",
    ) -> float:
        deadline = time.monotonic() + timeout
        return wait_ready(
            step,
            url,
            served,
            max(0.0, deadline - time.monotonic()),
            client=self._clients.get(url),
            sleep=self._stop.sleep,
            token=self._token,
            interval=0.2,
            ranks=ranks,
            watch=watch,
            engine=engine,
        )

    def _record(self, serving: ServingPlan, versions: Mapping[str, str]) -> None:
        """serving.json: each deployment's engine and its version (``vllm_version`` too while a deployment is
        vLLM's, as before SGLang), and every replica's steps with their command lines (a follower's under its
        replica's ``ranks``)."""
        doc: dict[str, Any] = {}
        if "vllm" in versions:
            doc["vllm_version"] = versions["vllm"]
        doc |= {
            "container_runtime": serving.container_runtime,
            "nodes": serving.nodes,
            "deployments": [
                {"alias": d.alias, "engine": d.engine, "version": versions.get(d.engine, "unknown")}
                for d in serving.deployments
            ],
            "replicas": [
                {
                    "alias": r.alias,
                    "index": r.index,
                    "port": r.port,
                    "socket": None if (path := socket_path(r.url)) is None else str(path),
                    "step": r.step.name,
                    "argv": list(r.step.spec.argv),
                    "ranks": [
                        {"node_rank": k, "step": s.name, "argv": list(s.spec.argv)}
                        for k, s in enumerate(r.followers, start=1)
                    ],
                }
                for reps in self._replicas.values()
                for r in reps
            ],
        }
        atomic_write(self._dir / "serving.json", encode_pretty(doc))

    def load_seconds(self) -> dict[str, float]:
        """Per alias, seconds from the first server step's start to every replica of the alias answering."""
        start = self._launched_at
        return {} if start is None else {alias: at - start for alias, at in self._ready_at.items()}

    def first_replicas(self) -> dict[str, str]:
        """Per alias, its replica 0's own listener (``http://HOST:PORT`` or ``unix:/path``), bypassing the proxy."""
        return {alias: reps[0].url for alias, reps in self._replicas.items() if reps}
