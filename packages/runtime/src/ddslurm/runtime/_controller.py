"""The allocation controller: everything an array task does around the Data Designer client.

    hosted-only:  begin attempt ─► client step ─► teardown
    with models:  begin attempt ─► GPU and node check ─► server steps ─► proxy steps ─► client steps ─► ready?
                  ─► watch (a replica that dies leaves rotation; no replica left fails the attempt; a proxy
                     that dies or stops answering fails the client run with proxy_died) ─► teardown

It composes the allocation's two jobs: its servers and proxies from launch to teardown
(:class:`~ddslurm.runtime._fleet.Fleet`), and the shards its client workers take
(:class:`~ddslurm.runtime._workers.Workers`). Every process is a step started by the injected launcher (``srun``
in a job). Secrets reach only the client step's environment: the hosted providers' API keys and the attempt's
own random token, which every server and proxy of the attempt requires (they get it in their environment, never
on a command line; nothing writes it to a file). Variables the run file names in ``server.env_from`` reach only
the server steps of that deployment.

Where servers listen (docs/architecture.md, "Threat model"): every deployment's endpoint is its proxy, on a
loopback port this controller holds for the whole allocation; the replicas on Unix-domain sockets in an
owner-only scratch directory, or on loopback ports proved to be this user's (see ``_fleet_start``).

A retryable failure of the client run (``client_retries``) reruns the client with the servers kept; a proxy
that died is started again first. Teardown always runs: on success, failure, cancellation (SIGTERM) or the
time-limit warning (SIGUSR1 from ``#SBATCH --signal``), and the attempt record
says why it ended.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ddslurm.config import SERVING_READY, RunLayout, encode_pretty, make_private_dir, parse_array_task
from ddslurm.runtime._attempt import AttemptRunner
from ddslurm.runtime._attempt_record import EXIT_OK
from ddslurm.runtime._calibrate import CalibrationError, calibrate
from ddslurm.runtime._dd_version import check_data_designer
from ddslurm.runtime._engine import local_token_names
from ddslurm.runtime._fleet import Fleet
from ddslurm.runtime._inputs import Inputs
from ddslurm.runtime._leader_address import LeaderAddress, leader_ip
from ddslurm.runtime._node_discovery import leader_address
from ddslurm.runtime._requeue import mark_requeued
from ddslurm.runtime._scratch import pid_alive, process_start_time, scratch_base, sweep_stale
from ddslurm.runtime._steps import StepLauncher, without
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._workers import OneShard, ShardSource, Workers
from ddslurm.runtime.errors import RuntimeFailure


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


def allocation_memory(env: Mapping[str, str], inputs: Inputs, pulling: bool) -> MemorySplit:
    """Each step's share of the allocation's memory: its servers, proxies and clients (``client_workers`` of a
    pulling allocation, and the spare client it keeps ready)."""
    plan, serving = inputs.plan, inputs.plan.serving
    servers = sum(len(d.replicas) for d in serving.deployments) if serving else 0
    proxies = sum(1 for d in serving.deployments if d.proxy) if serving else 0
    clients = plan.client_workers + 1 if pulling else 1
    return split_memory(env, servers, proxies, clients)


class Controller:
    """Runs one allocation: :meth:`run` begins its shards, serves and generates them, and tears down."""

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
        locate_leader: Callable[[Mapping[str, str]], str] = leader_address,
        place_leader: Callable[[str, frozenset[str]], LeaderAddress] = leader_ip,
    ) -> None:
        self._runner = runner
        self._launcher = launcher
        self._env = env
        self._runtime_exe = runtime_exe
        self._run_dir = run_dir
        self._log = logger
        self._http = http
        self._stop = stop
        self._grace = grace
        self._poll = poll
        self._sleep = sleep
        self._health_interval = health_interval
        self._unhealthy_limit = unhealthy_limit
        self._locate_leader = locate_leader
        self._place_leader = place_leader
        self._identity = controller_identity()
        """What a client waiting for its endpoints waits for: as long as this process lives (no deadline)."""

    def run(self, inputs: Inputs, source: ShardSource | int, job_id: str, node: str, restart: int = 0) -> int:
        """Run the allocation: begin the first shard's attempt (nothing starts when there is none), start the
        servers and proxies once, then generate shards (``client_workers`` at a time when pulling) until the
        source has none left; tear everything down. The exit status is 0 only if every shard it ran succeeded."""
        source = OneShard(source) if isinstance(source, int) else source
        for record in mark_requeued(RunLayout(self._run_dir), job_id, restart):
            self._log.info("attempt.requeued", record=str(record), restart=restart)
        memory = allocation_memory(self._env, inputs, source.pulling)
        token = secrets.token_urlsafe(32)  # this allocation's own; kept in memory and step environments only
        workers = self._workers(inputs, source, job_id, node, restart, token=token, client_mb=memory.client)
        first = workers.begin_next()
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
        log = self._log.bind(job_id=job_id)
        # A one-shard task serves from its attempt's directory, a pulling allocation from its own (see _workers).
        endpoints = workers.endpoints_file(first)
        plan = inputs.plan
        fleet = Fleet(
            launcher=self._launcher,
            env=self._env,
            secrets=(*plan.secret_env, *plan.server_secret_env),
            runtime_exe=self._runtime_exe,
            directory=endpoints.parent,
            job_id=job_id,
            token=token,
            server_mb=memory.server,
            proxy_mb=memory.proxy,
            http=self._http,
            stop=self._stop,
            log=log,
            grace=self._grace,
            unhealthy_limit=self._unhealthy_limit,
            locate_leader=self._locate_leader,
            place_leader=self._place_leader,
            record_prompts=bool(plan.calibrate),
        )
        try:
            check_data_designer(plan.data_designer_version)  # before any server starts: the clients would refuse
            self._serve(inputs, workers, fleet, endpoints, log)
            if plan.calibrate and plan.serving is not None and workers.exit_code() == EXIT_OK:
                self._calibrate(inputs, workers, fleet, endpoints.parent, token, log)
        except RuntimeFailure as exc:
            workers.fail_all(exc)
        finally:
            self._teardown(workers, fleet)
            # a client SIGKILLed (its own cleanup never ran) leaves its scratch directory: its job's own, swept now
            sweep_stale(scratch_base(self._env), self._env, uid=os.getuid(), host=socket.gethostname(), log=log)
        return workers.exit_code()

    def _calibrate(self, inputs: Inputs, workers: Workers, fleet: Fleet, directory: Path, token: str, log: Any) -> None:
        """A tune allocation's sweep (``_calibrate``), its generation done and its servers still up; a failure fails
        the attempts it ran (``calibration_failed``). The job's stop signal (cancellation, the time limit's
        warning) ends it at its next request."""
        plan = inputs.plan
        assert plan.serving is not None
        log.info("calibration.started", levels=list(plan.calibrate))
        try:
            calibration = calibrate(
                plan.serving,
                plan.calibrate,
                directory,
                fleet.first_replicas(),
                fleet.load_seconds(),
                token,
                log,
                check=self._stop.check,
            )
        except CalibrationError as exc:
            log.error("calibration.failed", message=exc.message)
            workers.fail_ended(exc)
            return
        log.info("calibration.written", aliases=[e.alias for e in calibration.entries])

    @staticmethod
    def _teardown(workers: Workers, fleet: Fleet) -> None:
        """Clients first, then proxies, then servers: each TERM, a grace period, then KILL. The steps of one group
        stop together (:func:`~ddslurm.runtime._steps.stop_together`)."""
        workers.stop()
        fleet.stop()

    def _workers(
        self,
        inputs: Inputs,
        source: ShardSource,
        job_id: str,
        node: str,
        restart: int,
        *,
        token: str,
        client_mb: int | None,
    ) -> Workers:
        """The allocation's client workers: their steps get the job's environment without the servers' own secrets,
        and the token in the variables of the local providers."""
        plan = inputs.plan
        array, task = self._env.get("SLURM_ARRAY_JOB_ID"), self._env.get("SLURM_ARRAY_TASK_ID")
        array_task = parse_array_task(f"{array}_{task}") if array and task else None  # None: not a Slurm array task
        # The serving state (logs, serving.json, endpoints.json) of a pulling allocation belongs to this incarnation
        # of the job: one that Slurm requeued (same job id, SLURM_RESTART_COUNT + 1) serves from a new directory, as
        # a one-shard task does from its new attempt directory.
        allocation = RunLayout(self._run_dir).allocation(job_id, restart) if source.pulling else None
        server_only = [n for n in plan.server_secret_env if n not in plan.secret_env]
        return Workers(
            self._runner,
            source,
            inputs,
            launcher=self._launcher,
            env={**without(self._env, server_only), **dict.fromkeys(local_token_names(inputs.snapshot), token)},
            runtime_exe=self._runtime_exe,
            run_dir=self._run_dir,
            allocation=allocation,
            job_id=job_id,
            node=node,
            restart=restart,
            slurm_log=str(RunLayout(self._run_dir).batch_output(array_task)) if array_task is not None else None,
            client_mb=client_mb,
            identity=self._identity,
            logger=self._log,
            stop=self._stop,
            grace=self._grace,
        )

    def _serve(self, inputs: Inputs, workers: Workers, fleet: Fleet, endpoints: Path, log: Any) -> None:
        """Serve, and generate the attempts begun (the first) and those the source still has. The servers, proxies
        and first clients (Data Designer's import) start at once, overlapping the model load; the clients wait for
        the endpoints file, written when every replica and proxy is ready."""
        make_private_dir(endpoints.parent, exist_ok=True)
        if endpoints.exists():  # not this incarnation's: its servers are not even started yet
            log.warning("serving.stale_endpoints", path=str(endpoints), why="left by an earlier run; removed")
            endpoints.unlink()
        serving = inputs.plan.serving
        if serving is None:
            workers.publish_endpoints(endpoints, encode_pretty(_provider_endpoints(inputs, {})))
            workers.start_first()
        else:
            version = fleet.launch(serving)
            workers.start_first()
            urls = fleet.wait_ready(serving, version)
            workers.publish_endpoints(endpoints, encode_pretty(_provider_endpoints(inputs, urls)))
            log.info(SERVING_READY, endpoints=urls)
        next_check = time.monotonic() + self._health_interval
        while True:
            workers.top_up(fleet)
            if workers.idle():
                break
            self._stop.check()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self._health_interval
                fleet.check_health()
            fleet.check_replicas()
            if (failure := fleet.proxy_failure()) is not None:
                workers.fail_running(failure)
            self._sleep(self._poll)
            workers.collect(fleet)  # just before top_up: a worker slot freed is filled in the same round
        fleet.settle_restarts()


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
