"""The allocation controller: everything an array task does around the Data Designer client.

    hosted-only:  begin attempt ─► client step ─► teardown
    with models:  begin attempt ─► GPU check ─► server steps ─► ready? ─► proxy steps ─► client step
                  ─► watch (a replica that dies leaves rotation; no replica left fails the attempt; a proxy
                     that dies or stops answering fails the client run with proxy_died) ─► teardown

Every process is a step started by the injected launcher (``srun`` in a job). Secrets reach only the client
step's environment: the hosted providers' API keys and the attempt's own random token, which every server and
proxy of the attempt requires (they get it in their environment, never on a command line; nothing writes it to
a file). Variables the run file names in ``server.env_from`` reach only the server steps of that deployment.

Where servers listen (docs/architecture.md, "Threat model"): every deployment's endpoint is its proxy, on a
loopback port this controller holds for the whole allocation (:class:`~ddslurm.runtime._serving.PortHolds`: no
other user can bind it, even while the proxy restarts); the replicas listen on Unix-domain sockets in a scratch
directory only this user can enter (``listen: unix``), or on loopback ports proved to be this user's before the
token reaches them (``listen: tcp``).

A retryable failure of the client run (``client_retries``) reruns the client with the servers kept; a proxy
that died is started again first. Teardown always runs: on success, failure, cancellation (SIGTERM) or the
time-limit warning (SIGUSR1 from ``#SBATCH --signal``), and the attempt record
says why it ended.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from ddslurm.config import (
    SERVING_READY,
    AttemptRecord,
    ClaimRecord,
    RunLayout,
    ServingPlan,
    atomic_write,
    encode,
    encode_pretty,
    make_private_dir,
    publish_once,
    read_json,
    read_tail,
)
from ddslurm.runtime._attempt import EXIT_FAILED, EXIT_OK, AttemptRunner, Began, Inputs, exit_code_for
from ddslurm.runtime._engine import local_token_names
from ddslurm.runtime._listeners import MAX_SOCKET_PATH, socket_path, unix_url
from ddslurm.runtime._scratch import (
    create_scratch,
    own_scratch_owner,
    pid_alive,
    process_start_time,
    remove_scratch,
    scratch_base,
)
from ddslurm.runtime._serving import (
    TOKEN_ENV,
    ListenerClients,
    PortHolds,
    PortUnavailableError,
    ProxyDiedError,
    ServerDiedError,
    answers,
    check_gpus,
    choose_ports,
    is_healthy,
    server_command,
    token_environment,
    vllm_version,
    wait_ready,
)
from ddslurm.runtime._steps import Step, StepLauncher, StepSpec, without
from ddslurm.runtime.errors import RuntimeFailure, SecretMissingError

HOST = "127.0.0.1"
SOCKET_ROOM = 64
"""Bytes of a socket path left for the scratch directory's name and the socket's own (``<alias>-<i>.sock``)."""
STOP_RACE_S = 2.0
"""How long a client step's failure waits for the signal that may have ended it (scancel, time limit)."""


def controller_identity(pid: int | None = None) -> str:
    """Who a waiting client waits for: ``PID:START:PIDNS`` of this process (its start time in clock ticks and its
    PID namespace, each empty when unknown), what ``--wait-endpoints`` takes (see :func:`controller_alive`)."""
    pid = os.getpid() if pid is None else pid
    start = process_start_time(pid)
    return f"{pid}:{'' if start is None else start}:{_pid_namespace(pid)}"


def controller_alive(identity: str) -> Callable[[], bool]:
    """Whether the controller ``identity`` names (:func:`controller_identity`) still runs: one read of its
    ``/proc/PID/stat``. A client in another PID namespace cannot see it and waits as long as it lives itself:
    it is a step of the same job, which Slurm ends with the controller, and the controller stops it when serving
    fails. ValueError for a malformed identity."""
    pid_text, _, rest = identity.partition(":")
    start_text, _, namespace = rest.partition(":")
    if not pid_text.isdigit() or (start_text and not start_text.isdigit()):
        raise ValueError(f"expected PID:START:PIDNS, got {identity!r}")
    pid, start = int(pid_text), int(start_text) if start_text else None
    if namespace and namespace != _pid_namespace(os.getpid()):
        return lambda: True
    return lambda: pid_alive(pid, start)


def _pid_namespace(pid: int) -> str:
    try:
        return str(Path(f"/proc/{pid}/ns/pid").readlink()).removeprefix("pid:[").removesuffix("]")
    except OSError:
        return ""


class InterruptedFailure(RuntimeFailure):
    reason = "cancelled"


class TimeLimitFailure(RuntimeFailure):
    reason = "time_limit"


class ClientFailure(RuntimeFailure):
    reason = "client_failed"
    retryable = True


@dataclass(slots=True)
class StopSignal:
    """Set from a signal handler; the controller's loops look at it."""

    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.event.set()


@dataclass(frozen=True, slots=True)
class MemorySplit:
    client: int | None
    server: int | None
    proxy: int | None


def split_memory(env: Mapping[str, str], servers: int, proxies: int, clients: int = 1) -> MemorySplit:
    """Shares of the node's memory for each step (MB), from what Slurm actually granted; None if unknown. The
    clients' share is divided among ``clients`` client steps running at once."""
    total: int | None = None
    if env.get("SLURM_MEM_PER_NODE", "").isdigit():
        total = int(env["SLURM_MEM_PER_NODE"])
    elif env.get("SLURM_MEM_PER_CPU", "").isdigit() and env.get("SLURM_CPUS_ON_NODE", "").isdigit():
        total = int(env["SLURM_MEM_PER_CPU"]) * int(env["SLURM_CPUS_ON_NODE"])
    if total is None:
        return MemorySplit(None, None, None)
    proxy = 256 if proxies else None
    rest = total - (proxy or 0) * proxies
    if servers == 0:
        return MemorySplit(max(64, rest // clients), None, proxy)
    client = max(256 * clients, rest // 4)
    server = max(64, (rest - client) // servers)
    return MemorySplit(client // clients, server, proxy)


@dataclass(slots=True)
class Replica:
    alias: str
    index: int
    url: str
    """``http://127.0.0.1:PORT`` or ``unix:/path.sock``."""
    step: Step

    @property
    def port(self) -> int | None:
        return None if socket_path(self.url) is not None else int(self.url.rpartition(":")[2])


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


class ShardSource(Protocol):
    """Where an allocation's shards come from: its one shard (a task of a one-task-per-shard array), or claims
    on a pool (a pulling allocation)."""

    pulling: bool

    def next(self) -> int | None:
        """The next shard to run, or None when there is none left for this allocation."""
        ...


class OneShard:
    """Array task i of a one-task-per-shard array: shard ``shards[i]``, once."""

    pulling = False

    def __init__(self, shard: int) -> None:
        self._shard: int | None = shard

    def next(self) -> int | None:
        shard, self._shard = self._shard, None
        return shard


class ClaimPool:
    """A pulling allocation's shards: each shard of ``pool`` without a winner, claimed without replacing
    (``shards/shard-N/claims/<array>.json``), so every shard is run by exactly one allocation of the array
    whatever the races and kills. A requeued allocation (same job id) takes its own claims again. Shards whose
    cancel record exists (``ddslurm cancel --shards``) are not claimed; a cancelled run stops the pulling.

    In a two-stage run ``stage`` 0 (the GPU stage) claims in the shard's ``stage-0/`` and skips shards with a
    GPU-stage or a final winner; ``stage`` 1 (the CPU stage) claims only shards that have a GPU-stage winner and
    no final winner."""

    pulling = True

    def __init__(
        self,
        layout: RunLayout,
        pool: Sequence[int],
        *,
        array_job_id: str,
        task: int,
        job_id: str,
        node: str,
        clock: Callable[[], str],
        stage: int | None = None,
    ) -> None:
        self._layout = layout
        self._stage = stage
        self._pool = list(pool)
        self._array, self._task, self._job, self._node = array_job_id, task, job_id, node
        self._clock = clock

    def next(self) -> int | None:
        while self._pool:
            top = self._layout.shard(self._pool.pop(0))
            if os.path.lexists(self._layout.cancelled):
                return None
            if top.winner.exists() or os.path.lexists(top.cancelled):
                continue
            if self._stage == 1 and not top.stage(0).winner.exists():
                continue  # its GPU stage has no result (yet): nothing to run here
            shard = self._layout.stage_shard(top.index, self._stage)
            if shard.winner.exists():
                continue
            claim = ClaimRecord(
                shard=shard.index,
                array_job_id=self._array,
                task=self._task,
                job_id=self._job,
                node=self._node,
                claimed_at=self._clock(),
            )
            make_private_dir(shard.claims, exist_ok=True)
            if publish_once(shard.claim(self._array), encode(claim)):
                return shard.index
            try:
                if read_json(shard.claim(self._array), ClaimRecord).job_id == self._job:
                    return shard.index  # this allocation's own claim, from before Slurm requeued it
            except Exception:
                continue
        return None


@dataclass(slots=True)
class Work:
    """A shard this allocation is generating: its attempt, its client step, how many client runs so far."""

    began: Began
    client: Step
    log: Any
    runs: int = 1


class Controller:
    def __init__(
        self,
        runner: AttemptRunner,
        *,
        launcher: StepLauncher,
        env: Mapping[str, str],
        runtime_exe: Path,
        run_dir: Path,
        logger: Any,
        http: httpx.Client,
        stop: StopSignal,
        grace: float = 15.0,
        poll: float = 0.5,
        health_interval: float = 5.0,
        unhealthy_limit: int = 6,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._runner = runner
        self._launcher = launcher
        self._env = env
        self._runtime_exe = runtime_exe
        self._run_dir = run_dir
        self._log = logger
        self._http = http
        self._clients = ListenerClients(http)
        self._holds = PortHolds(HOST)
        self._sockets: Path | None = None
        """The scratch directory (owner-only) of the replicas' Unix-domain sockets, made when one is needed."""
        self._stop = stop
        self._grace = grace
        self._poll = poll
        self._sleep = sleep
        self._health_interval = health_interval
        self._unhealthy_limit = unhealthy_limit
        self._steps: list[Step] = []
        self._proxies: dict[str, ProxyStep] = {}
        self._secrets: tuple[str, ...] = ()
        self._server_secrets: tuple[str, ...] = ()
        self._token = ""
        self._works: list[Work] = []
        self._waiting: list[Began] = []
        """Attempts begun whose client step has not started yet."""
        self._spare: Work | None = None
        """A pulling allocation's next shard: its client started, waiting for its own endpoints file."""
        self._serving_dir = run_dir
        self._endpoints_written: set[Path] = set()
        self._identity = controller_identity()
        """What a client waiting for its endpoints waits for: as long as this process lives (no deadline)."""
        """The endpoints files this controller wrote: a client waits for any other (see :meth:`_start_client`)."""

    def run(self, inputs: Inputs, source: ShardSource | int, job_id: str, node: str, restart: int = 0) -> int:
        """Run the allocation: begin the first shard's attempt (nothing starts when there is none), start the
        servers and proxies once, then generate shards (``client_workers`` at a time when pulling) until the
        source has none left; tear everything down. The exit status is 0 only if every shard it ran succeeded."""
        source = OneShard(source) if isinstance(source, int) else source
        array, task = self._env.get("SLURM_ARRAY_JOB_ID"), self._env.get("SLURM_ARRAY_TASK_ID")
        self._slurm_log = str(self._run_dir / "logs" / f"slurm-{array}_{task}.out") if array and task else None
        # The serving state (logs, serving.json, endpoints.json) belongs to this incarnation of the job: a pulling
        # allocation that Slurm requeued (same job id, SLURM_RESTART_COUNT + 1) serves from a new directory, as a
        # one-shard task does from its new attempt directory.
        self._serving_dir = RunLayout(self._run_dir).allocation(job_id, restart) if source.pulling else self._run_dir
        self._job, self._node, self._restart = job_id, node, restart
        first = self._begin_next(inputs, source)
        if first is None:
            if RunLayout(self._run_dir).cancelled.exists():
                self._log.info("attempt.cancelled", why="the run was cancelled (ddslurm cancel)")
            elif source.pulling:
                self._log.info("allocation.idle", why="no shard of its pool is left to run; nothing started")
            else:
                self._log.info(
                    "attempt.not_started",
                    why="the shard has a winner, or its last attempt "
                    "failed in a way every attempt would repeat (see the attempt record)",
                )
            return EXIT_OK
        if not source.pulling:
            self._serving_dir = first.layout.dir
        log = self._log.bind(job_id=job_id)
        outcomes: list[AttemptRecord] = []
        try:
            self._run(inputs, source, outcomes, log)
        except RuntimeFailure as exc:
            spare = [self._spare.began] if self._spare is not None else []
            for began in [*self._waiting, *(w.began for w in self._works), *spare]:
                log.error("attempt.failed", shard=began.shard, attempt=began.record.attempt, reason=exc.reason,
                          message=exc.message)  # fmt: skip
                self._runner.fail(began, exc)
                outcomes.append(read_json(began.layout.record, AttemptRecord))
            self._works.clear()
            self._waiting.clear()
            self._spare = None
            if source.pulling:
                log.error("allocation.failed", reason=exc.reason, message=exc.message)
        finally:
            self._teardown(log)
        # A shard cancelled on its own (cancel --shards) is what the user asked for: it fails no allocation.
        codes = {exit_code_for(r) for r in outcomes if r.reason != "shard_cancelled"} or {
            EXIT_OK if outcomes else EXIT_FAILED
        }
        return EXIT_FAILED if EXIT_FAILED in codes else max(codes)

    def _begin_next(self, inputs: Inputs, source: ShardSource) -> Began | None:
        """Begin the attempt of the source's next shard that may generate (None when no shard is left)."""
        while (shard := source.next()) is not None:
            allocation = str(self._serving_dir) if source.pulling else None
            began = self._runner.begin(inputs, shard, self._job, self._node, self._restart, self._slurm_log, allocation)
            if began is not None:
                self._log.info(
                    "attempt.started",
                    shard=shard,
                    attempt=began.record.attempt,
                    records=began.num_records,
                    node=self._node,
                    job_id=self._job,
                )
                self._waiting.append(began)  # failed with the allocation until its client has started
                return began
            if source.pulling:
                self._log.info("attempt.not_started", shard=shard, why="see the attempt record")
        return None

    def _run(self, inputs: Inputs, source: ShardSource, outcomes: list[AttemptRecord], log: Any) -> None:
        """Serve, and generate the attempts begun (the first, in ``_waiting``) and those the source still has."""
        self._secrets = inputs.plan.secret_env
        self._server_secrets = inputs.plan.server_secret_env
        self._token = secrets.token_urlsafe(32)  # this allocation's own; kept in memory and step environments only
        serving = inputs.plan.serving
        workers = inputs.plan.client_workers if source.pulling else 1
        servers = sum(len(d.replicas) for d in serving.deployments) if serving else 0
        proxies = sum(1 for d in serving.deployments if d.proxy) if serving else 0
        # A pulling allocation keeps one spare client ready (below): its memory share counts too.
        memory = split_memory(self._env, servers, proxies, workers + (1 if source.pulling else 0))
        endpoints_file = self._serving_dir / "endpoints.json"
        make_private_dir(self._serving_dir, exist_ok=True)
        if endpoints_file.exists():  # not this incarnation's: its servers are not even started yet
            log.warning("serving.stale_endpoints", path=str(endpoints_file), why="left by an earlier run; removed")
            endpoints_file.unlink()
        replicas: dict[str, list[Replica]] = {}
        # Overlap the model load: servers, proxies and the first clients (Data Designer's import) start at once;
        # the clients wait for the endpoints file, written when every replica and proxy is ready.
        if serving is None:
            self._write_endpoints(endpoints_file, encode_pretty(_provider_endpoints(inputs, {})))
        else:
            replicas, version = self._launch_servers(serving, memory, log)
            self._launch_proxies(serving, replicas, memory, log)
        while len(self._waiting) < workers and self._begin_next(inputs, source) is not None:
            pass
        for begun in list(self._waiting):
            self._works.append(self._work(inputs, begun, endpoints_file, memory, resume=False))
        if serving is not None:
            self._wait_serving(serving, replicas, version, log)
            urls = {
                d.alias: (self._proxies[d.alias].url if d.proxy else replicas[d.alias][0].url)
                for d in serving.deployments
            }
            self._write_endpoints(endpoints_file, encode_pretty(_provider_endpoints(inputs, urls)))
            log.info(SERVING_READY, endpoints=urls)
        exhausted = False
        failures: dict[str, int] = {}
        reported: set[str] = set()
        next_check = time.monotonic() + self._health_interval
        while self._works or not exhausted:
            # A proxy that dies under running clients is handled below (their runs fail, reruns start it again);
            # one that is dead when a new shard's client starts (reruns used up) is started again first.
            while len(self._works) < workers and not (self._works and self._dead_proxy() is not None):
                if self._spare is not None:  # ready: Data Designer imported, waiting for its endpoints
                    self._restart_dead_proxies(replicas, memory, log)
                    if self._promote(inputs, endpoints_file, memory, outcomes):
                        continue
                if exhausted:
                    break
                began = self._begin_next(inputs, source)
                if began is None:
                    exhausted = True
                    break
                self._restart_dead_proxies(replicas, memory, log)
                self._works.append(self._work(inputs, began, endpoints_file, memory, resume=False))
            if source.pulling and not exhausted and self._spare is None and len(self._works) == workers:
                # The next shard's client starts now and waits, so a finished shard's successor generates at once
                # instead of after a process start and Data Designer's import (seconds of idle GPUs per shard).
                began = self._begin_next(inputs, source)
                if began is None:
                    exhausted = True
                else:
                    own = began.layout.dir / "endpoints.json"
                    self._spare = self._work(inputs, began, own, memory, resume=False, spare=True)
            if not self._works and self._spare is None:
                break
            if self._stop.event.is_set():
                raise self._interrupted()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self._health_interval
                self._check_health(replicas, failures, log)
            self._check_replicas(replicas, reported, log)
            if (dead := self._dead_proxy()) is not None:
                self._proxy_died(dead, log)
            for work in list(self._works):
                record = self._ended(work, source)
                if record is None:
                    continue
                if record.state == "failed" and record.retryable and work.runs <= inputs.plan.client_retries:
                    work.log.warning(
                        "client.rerun", run=work.runs + 1, reason=record.reason, why="servers kept; resuming batches"
                    )
                    self._runner.rerun(work.began)
                    self._steps.remove(work.client)
                    self._restart_dead_proxies(replicas, memory, log)
                    work.client = self._start_client(inputs, work.began, endpoints_file, memory, resume=True)
                    work.runs += 1
                    continue
                work.log.info("attempt.ended", state=record.state, rows=record.rows, client_runs=work.runs)
                self._works.remove(work)
                self._steps.remove(work.client)
                outcomes.append(record)
            self._sleep(self._poll)

    # --- servers ---------------------------------------------------------------------------------------

    def _launch_servers(
        self, serving: ServingPlan, memory: MemorySplit, log: Any
    ) -> tuple[dict[str, list[Replica]], Callable[[], str]]:
        """Start every replica's step (not waiting for them); and the vLLM version, asked meanwhile."""
        gpus = check_gpus(serving, self._env)
        server_env = self._without_secrets()
        missing = sorted({n for d in serving.deployments for n in d.env_from if not self._env.get(n)})
        if missing:
            raise SecretMissingError(
                f"variable(s) {', '.join(missing)} named by server.env_from are unset in the job's environment"
            )
        version: list[str] = []
        asking = threading.Thread(target=lambda: version.append(vllm_version(serving, server_env)), daemon=True)
        asking.start()
        log.info("serving.start", gpus=len(gpus))
        for dep in serving.deployments:
            if dep.listen == "unix" and not dep.proxy:
                raise RuntimeFailure(f"the plan puts {dep.alias!r} on Unix-domain sockets without its proxy")
        wanted = [r.port for d in serving.deployments if d.listen == "tcp" for r in d.replicas]
        ports = iter(choose_ports(wanted, self._job))
        replicas: dict[str, list[Replica]] = {}
        for dep in serving.deployments:
            for rep in dep.replicas:
                name = f"server-{dep.alias}-{rep.index}"
                url = self._socket_url(name) if dep.listen == "unix" else f"http://{HOST}:{next(ports)}"
                cmd = server_command(serving, dep, url)
                spec = StepSpec(
                    name=name,
                    argv=cmd.argv,
                    env={
                        **server_env,
                        **dep.env,
                        **{name: self._env[name] for name in dep.env_from},
                        **token_environment(serving, self._token),
                    },
                    log=self._serving_dir / f"{name}.log",
                    cpus=rep.cpus,
                    mem_mb=memory.server,
                    gpus=rep.gpus,
                    gpu_request=serving.gpu_request,
                    srun_extra=cmd.srun_extra,
                )
                replicas.setdefault(dep.alias, []).append(Replica(dep.alias, rep.index, url, self._start(spec)))
                log.info("server.started", step=spec.name, listen=url, argv=list(cmd.argv))

        def asked() -> str:
            asking.join(timeout=60)
            return version[0] if version else "unknown (vllm --version did not answer)"

        return replicas, asked

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

    def _launch_proxies(
        self, serving: ServingPlan, replicas: dict[str, list[Replica]], memory: MemorySplit, log: Any
    ) -> None:
        """Start the proxy of every deployment (it answers once one replica does), each on a port this controller
        holds until teardown (:class:`~ddslurm.runtime._serving.PortHolds`)."""
        proxied = [d for d in serving.deployments if d.proxy]
        used = {r.port for reps in replicas.values() for r in reps}
        ports = iter(
            choose_ports([None] * len(proxied), f"{self._job}7", lambda p: p not in used and self._holds.take(p))
        )
        for dep in proxied:
            proxy = self._start_proxy(dep.alias, next(ports), replicas[dep.alias], serving.proxy_cpus, memory)
            log.info("proxy.started", alias=dep.alias, port=proxy.port, upstreams=[r.url for r in replicas[dep.alias]])

    def _wait_serving(
        self, serving: ServingPlan, replicas: dict[str, list[Replica]], version: Callable[[], str], log: Any
    ) -> None:
        """Every replica answers (its model loaded), then every proxy; serving.json records them."""
        for dep in serving.deployments:
            for replica in replicas[dep.alias]:
                took = self._wait_ready(replica.step, replica.url, dep.served_model_name, dep.startup_timeout)
                log.info("server.ready", step=replica.step.name, seconds=round(took, 2))
        for proxy in self._proxies.values():
            self._wait_ready(proxy.step, proxy.url, None, 60.0)
            log.info("proxy.ready", alias=proxy.alias, port=proxy.port)
        self._record_serving(serving, replicas, version())

    def _wait_ready(self, step: Step, url: str, served: str | None, timeout: float) -> float:
        deadline = time.monotonic() + timeout

        def sleep(seconds: float) -> None:
            if self._stop.event.wait(seconds):
                raise self._interrupted()

        return wait_ready(
            step,
            url,
            served,
            max(0.0, deadline - time.monotonic()),
            client=self._clients.get(url),
            sleep=sleep,
            token=self._token,
            interval=0.2,
        )

    def _start_proxy(
        self, alias: str, port: int, upstreams: list[Replica], cpus: int, memory: MemorySplit
    ) -> ProxyStep:
        argv = [str(self._runtime_exe), "proxy", "--listen", f"{HOST}:{port}", "--reuse-port"]
        for replica in upstreams:
            argv += ["--upstream", replica.url]
        log_path = self._serving_dir / f"proxy-{alias}.log"
        spec = StepSpec(
            name=f"proxy-{alias}",
            argv=(*argv, "--log", str(log_path)),
            env={**self._without_secrets(), TOKEN_ENV: self._token},
            log=self._serving_dir / f"proxy-{alias}.out",
            cpus=cpus,
            mem_mb=memory.proxy,
        )
        proxy = ProxyStep(alias, port, self._start(spec), log_path)
        self._proxies[alias] = proxy
        return proxy

    def _restart_dead_proxies(self, replicas: dict[str, list[Replica]], memory: MemorySplit, log: Any) -> None:
        """Start every proxy that has exited again, in front of the replicas still running, before a client runs
        again: on its old port, which this controller still holds (no other user could take it meanwhile), so the
        endpoints file stays true."""
        for alias, old in list(self._proxies.items()):
            if old.step.poll() is None:
                continue
            self._steps.remove(old.step)
            alive = [r for r in replicas[alias] if r.step.poll() is None]
            if not alive:
                raise ServerDiedError(f"no replica of {alias!r} is left to restart its proxy in front of")
            proxy = self._start_proxy(alias, old.port, alive, old.step.spec.cpus, memory)
            self._wait_ready(proxy.step, proxy.url, None, 60.0)
            log.warning("proxy.restarted", alias=alias, port=old.port, upstreams=[r.url for r in alive])

    def _record_serving(self, serving: ServingPlan, replicas: dict[str, list[Replica]], version: str) -> None:
        doc = {
            "vllm_version": version,
            "container_runtime": serving.container_runtime,
            "replicas": [
                {
                    "alias": r.alias,
                    "index": r.index,
                    "port": r.port,
                    "socket": None if (path := socket_path(r.url)) is None else str(path),
                    "step": r.step.name,
                    "argv": list(r.step.spec.argv),
                }
                for reps in replicas.values()
                for r in reps
            ],
        }
        atomic_write(self._serving_dir / "serving.json", encode_pretty(doc))

    def _write_endpoints(self, path: Path, data: bytes) -> None:
        """Write an endpoints file (atomically) and remember it: clients started from now on need not wait."""
        atomic_write(path, data)
        self._endpoints_written.add(path)

    # --- clients ---------------------------------------------------------------------------------------

    def _promote(
        self, inputs: Inputs, endpoints_file: Path, memory: MemorySplit, outcomes: list[AttemptRecord]
    ) -> bool:
        """Give the spare client its endpoints: it becomes a worker. False when its shard was cancelled meanwhile
        (``cancel --shards``): it is stopped and its attempt recorded ``cancelled``. A spare that ended while it
        waited (it had not begun its attempt: the record is still ``running``) is started again with the endpoints,
        as the shard's first client run: it used none of the shard's reruns (``client_retries``)."""
        spare, self._spare = self._spare, None
        assert spare is not None
        if self._shard_cancelled(spare.began.shard):
            spare.client.stop(self._grace)
            self._steps.remove(spare.client)
            outcomes.append(self._runner.cancel(spare.began, "cancelled by ddslurm cancel --shards before it ran"))
            return False
        own = spare.began.layout.dir / "endpoints.json"
        self._write_endpoints(own, endpoints_file.read_bytes())
        status = spare.client.poll()
        if status is not None and read_json(spare.began.layout.record, AttemptRecord).state == "running":
            spare.log.warning(
                "client.spare_restarted", status=status, why="the spare client ended before it was given endpoints"
            )
            self._steps.remove(spare.client)
            spare.client = self._start_client(inputs, spare.began, own, memory, resume=False)
        spare.log.info("client.promoted", why="a worker's shard ended; the spare client generates now")
        self._works.append(spare)
        return True

    def _work(
        self, inputs: Inputs, began: Began, endpoints: Path, memory: MemorySplit, *, resume: bool, spare: bool = False
    ) -> Work:
        """The attempt's client step started: it is no longer only waiting (see :meth:`_begin_next`)."""
        log = self._log.bind(shard=began.shard, attempt=began.record.attempt)
        work = Work(began, self._start_client(inputs, began, endpoints, memory, resume=resume, spare=spare), log)
        self._waiting.remove(began)
        return work

    def _start_client(
        self,
        inputs: Inputs,
        began: Began,
        endpoints_file: Path,
        memory: MemorySplit,
        *,
        resume: bool,
        spare: bool = False,
    ) -> Step:
        """A client step; a ``spare`` one shares the workers' CPUs (``srun --overlap``): it only imports Data
        Designer and waits until a worker's shard has ended, whose CPUs it then takes over."""
        argv: tuple[str, ...] = (
            str(self._runtime_exe),
            "client",
            "--run-dir",
            str(self._run_dir),
            "--plan-sha256",
            inputs.plan_sha256,
            "--shard",
            str(began.shard),
            "--attempt",
            began.record.attempt,
            "--endpoints",
            str(endpoints_file),
        )
        if endpoints_file not in self._endpoints_written:  # whatever is there now was not written for this client
            argv = (*argv, "--wait-endpoints", self._identity)
        if resume:
            argv = (*argv, "--resume")
        if self._runner.stage is not None:
            argv = (*argv, "--stage", str(self._runner.stage))
        spec = StepSpec(
            name="client" if self._serving_dir == began.layout.dir else f"client-{began.shard}",
            argv=argv,
            env={
                **without(self._env, [n for n in self._server_secrets if n not in self._secrets]),
                **dict.fromkeys(local_token_names(inputs.snapshot), self._token),
            },
            log=began.layout.dir / "client.out",
            cpus=inputs.plan.client_cpus,
            mem_mb=memory.client,
            srun_extra=("--overlap",) if spare else (),
        )
        return self._start(spec)

    def _ended(self, work: Work, source: ShardSource) -> AttemptRecord | None:
        """The attempt's record once its client step has ended (None while it runs). A pulling allocation's
        shard whose cancel record appeared is stopped and ends ``cancelled``."""
        client, began = work.client, work.began
        code = client.poll()
        if code is None:
            if source.pulling and self._shard_cancelled(began.shard):
                status = client.stop(self._grace)
                work.log.info("step.stopped", step=client.name, status=status, why="ddslurm cancel --shards")
                return self._runner.cancel(began, "cancelled by ddslurm cancel --shards; the allocation goes on")
            return None
        record = read_json(began.layout.record, AttemptRecord)
        if record.state == "running" and code != 0 and self._stop.event.wait(STOP_RACE_S):
            # scancel and the time limit signal the steps and the batch step together: the client may end first.
            raise self._interrupted()
        if record.state == "running":
            self._runner.fail(
                began,
                ClientFailure(
                    f"the client step exited with status {code} without recording a result; last lines of "
                    f"{client.spec.log}:\n{read_tail(client.spec.log)}"
                ),
            )
            record = read_json(began.layout.record, AttemptRecord)
        return record

    def _dead_proxy(self) -> ProxyStep | None:
        return next((p for p in self._proxies.values() if p.step.poll() is not None), None)

    def _shard_cancelled(self, shard: int) -> bool:
        """``ddslurm cancel --shards`` wrote the shard's cancel record (pulling allocations)."""
        return os.path.lexists(RunLayout(self._run_dir).shard(shard).cancelled)

    def _check_replicas(self, replicas: dict[str, list[Replica]], reported: set[str], log: Any) -> None:
        """A replica that died leaves rotation (reported once); no replica of an alias left fails the attempts."""
        for alias, reps in replicas.items():
            alive = [r for r in reps if r.step.poll() is None]
            for r in reps:
                if r.step.poll() is not None and r.step.name not in reported:
                    reported.add(r.step.name)
                    log.warning("server.died", step=r.step.name, status=r.step.poll(), left=len(alive))
            if not alive:
                tails = "\n".join(f"--- {r.step.spec.log}:\n{read_tail(r.step.spec.log)}" for r in reps)
                raise ServerDiedError(f"every replica of {alias!r} exited during generation\n{tails}")

    def _proxy_died(self, proxy: ProxyStep, log: Any) -> None:
        """The clients' endpoint is gone: stop every client at once (they would only retry against nothing and
        drop rows) and fail their runs with ``proxy_died`` (retryable: a rerun starts the proxy again)."""
        status = proxy.step.poll()
        why = (
            f"stopped after {self._unhealthy_limit} health checks in a row without an answer"
            if proxy.hung
            else f"exited with status {status}"
        )
        log.error("proxy.died", step=proxy.step.name, status=status, hung=proxy.hung, why="stopping the clients")
        tails = "".join(
            f"\n--- {path}:\n{tail}" for path in (proxy.step.spec.log, proxy.log) if (tail := read_tail(path).strip())
        )
        for work in self._works:
            client = work.client
            client_status = client.stop(self._grace) if client.poll() is None else client.poll()
            work.log.info("step.stopped", step=client.name, status=client_status)
            self._runner.fail(
                work.began,
                ProxyDiedError(
                    f"{proxy.step.name}, the endpoint of {proxy.alias!r} at {proxy.url}, {why} during generation; "
                    f"the client was stopped{tails}"
                ),
            )

    def _check_health(self, replicas: dict[str, list[Replica]], failures: dict[str, int], log: Any) -> None:
        """A live replica that stops answering /health (hung, holding its port) is stopped after
        ``unhealthy_limit`` checks in a row, so it leaves the proxy's rotation and counts as dead. A proxy that
        stops answering at all is stopped the same way (and then counts as a dead proxy)."""
        for proxy in self._proxies.values():
            if proxy.step.poll() is not None:
                continue
            answered = answers(self._clients.get(proxy.url), proxy.url)
            if self._strike(proxy.step, answered, failures, log, "proxy.unresponsive", "proxy.hung", "no answer"):
                proxy.hung = True
        for reps in replicas.values():
            for r in reps:
                if r.step.poll() is None:
                    healthy = is_healthy(self._clients.get(r.url), r.url)
                    self._strike(
                        r.step,
                        healthy,
                        failures,
                        log,
                        "server.unhealthy",
                        "server.hung",
                        "no healthy answer",
                    )

    def _strike(
        self, step: Step, healthy: bool, failures: dict[str, int], log: Any, warning: str, hung: str, why: str
    ) -> bool:
        """Count a failed health check of ``step`` (a success clears its count); stop it after
        ``unhealthy_limit`` in a row. Returns whether it was stopped."""
        if healthy:
            failures.pop(step.name, None)
            return False
        failures[step.name] = failures.get(step.name, 0) + 1
        log.warning(warning, step=step.name, checks=failures[step.name])
        if failures[step.name] < self._unhealthy_limit:
            return False
        log.error(hung, step=step.name, why=f"{why}; stopping it")
        step.stop(self._grace)
        return True

    # --- processes -------------------------------------------------------------------------------------

    def _without_secrets(self) -> dict[str, str]:
        """The job's environment without any secret: the API keys (the client's) and ``server.env_from``."""
        return without(self._env, (*self._secrets, *self._server_secrets))

    def _start(self, spec: StepSpec) -> Step:
        step = self._launcher.start(spec)
        self._steps.append(step)
        return step

    def _interrupted(self) -> RuntimeFailure:
        if self._stop.reason == "time_limit":
            return TimeLimitFailure("the job reached its time-limit warning; stopped cleanly before the limit")
        return InterruptedFailure(f"the job was cancelled ({self._stop.reason or 'signal'})")

    def _teardown(self, log: Any) -> None:
        """Clients first, then proxies, then servers: each TERM, a grace period, then KILL. The steps of one group
        stop together: each stop is a Slurm query, a signal and the process's exit (0.2-0.9 s under srun), which
        one after the other kept every GPU of the allocation a second or more (docs/performance.md)."""
        running = [step for step in reversed(self._steps) if step.poll() is None]
        proxies = {proxy.step.name for proxy in self._proxies.values()}
        clients = [s for s in running if s.name == "client" or s.name.startswith("client-")]
        fronts = [s for s in running if s.name in proxies]
        servers = [s for s in running if s not in clients and s not in fronts]
        for group in (clients, fronts, servers):
            for step, status in zip(group, stop_together(group, self._grace), strict=True):
                log.info("step.stopped", step=step.name, status=status)
        self._steps.clear()
        self._holds.release()
        self._clients.close()
        if self._sockets is not None:
            remove_scratch(self._sockets)
            self._sockets = None


def stop_together(steps: Sequence[Step], grace: float) -> list[int]:
    """Stop every step at once (TERM, up to ``grace`` seconds, KILL), one thread each; their exit statuses."""
    if len(steps) < 2:
        return [step.stop(grace) for step in steps]
    with ThreadPoolExecutor(max_workers=len(steps), thread_name_prefix="stop") as pool:
        return list(pool.map(lambda step: step.stop(grace), steps))


def _provider_endpoints(inputs: Inputs, alias_urls: Mapping[str, str]) -> dict[str, str]:
    """Local providers' OpenAI base URLs (``.../v1``), keyed by provider name as the snapshot names them."""
    local = {p.name for p in inputs.snapshot.providers if p.local}
    out: dict[str, str] = {}
    for model in inputs.snapshot.models:
        if model.provider in local and model.alias in alias_urls:
            out[model.provider] = f"{alias_urls[model.alias]}/v1"
    missing = local - set(out)
    if missing and inputs.plan.serving is not None:  # a CPU stage runs no servers and uses no local model
        raise RuntimeFailure(f"no endpoint was started for local provider(s) {sorted(missing)}")
    return out
