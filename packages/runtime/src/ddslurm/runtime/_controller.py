"""The allocation controller: everything an array task does around the Data Designer client.

    hosted-only:  begin attempt ─► client step ─► teardown
    with models:  begin attempt ─► GPU check ─► server steps ─► ready? ─► proxy steps ─► client step
                  ─► watch (a replica that dies leaves rotation; no replica left fails the attempt; a proxy
                     that dies or stops answering fails the client run with proxy_died) ─► teardown

Every process is a step started by the injected launcher (``srun`` in a job). Secrets reach only the client
step's environment: the hosted providers' API keys and the attempt's own random token, which every server and
proxy of the attempt requires (they get it in their environment, never on a command line; nothing writes it to
a file). Variables the run file names in ``server.env_from`` reach only the server steps of that deployment.

A retryable failure of the client run (``client_retries``) reruns the client with the servers kept; a proxy
that died is started again first. Teardown always runs: on success, failure, cancellation (SIGTERM) or the
time-limit warning (SIGUSR1 from ``#SBATCH --signal``), and the attempt record
says why it ended.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ddslurm.config import (
    AttemptRecord,
    RunLayout,
    ServingPlan,
    atomic_write,
    encode_pretty,
    read_json,
    read_tail,
)
from ddslurm.runtime._attempt import EXIT_OK, AttemptRunner, Began, Inputs, exit_code_for
from ddslurm.runtime._engine import local_token_names
from ddslurm.runtime._serving import (
    TOKEN_ENV,
    ProxyDiedError,
    ServerDiedError,
    answers,
    check_gpus,
    choose_ports,
    is_healthy,
    port_is_free,
    server_command,
    token_environment,
    vllm_version,
    wait_ready,
)
from ddslurm.runtime._steps import Step, StepLauncher, StepSpec, without
from ddslurm.runtime.errors import RuntimeFailure, SecretMissingError

HOST = "127.0.0.1"
STOP_RACE_S = 2.0
"""How long a client step's failure waits for the signal that may have ended it (scancel, time limit)."""


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


def split_memory(env: Mapping[str, str], servers: int, proxies: int) -> MemorySplit:
    """Shares of the node's memory for each step (MB), from what Slurm actually granted; None if unknown."""
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
        return MemorySplit(max(64, rest), None, proxy)
    client = max(256, rest // 4)
    server = max(64, (rest - client) // servers)
    return MemorySplit(client, server, proxy)


@dataclass(slots=True)
class Replica:
    alias: str
    index: int
    port: int
    step: Step

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


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

    def run(self, inputs: Inputs, shard: int, job_id: str, node: str, restart: int = 0) -> int:
        array, task = self._env.get("SLURM_ARRAY_JOB_ID"), self._env.get("SLURM_ARRAY_TASK_ID")
        slurm_log = str(self._run_dir / "logs" / f"slurm-{array}_{task}.out") if array and task else None
        began = self._runner.begin(inputs, shard, job_id, node, restart, slurm_log)
        if began is None:
            if RunLayout(self._run_dir).cancelled.exists():
                self._log.info("attempt.cancelled", shard=shard, why="the run was cancelled (ddslurm cancel)")
            else:
                self._log.info(
                    "attempt.not_started",
                    shard=shard,
                    why="the shard has a winner, or its last attempt "
                    "failed in a way every attempt would repeat (see the attempt record)",
                )
            return EXIT_OK
        log = self._log.bind(shard=shard, attempt=began.record.attempt)
        log.info("attempt.started", records=began.num_records, node=node, job_id=job_id)
        try:
            return self._run(inputs, began, job_id, log)
        except RuntimeFailure as exc:
            log.error("attempt.failed", reason=exc.reason, message=exc.message)
            return self._runner.fail(began, exc)
        finally:
            self._teardown(log)

    def _run(self, inputs: Inputs, began: Began, job_id: str, log: Any) -> int:
        self._secrets = inputs.plan.secret_env
        self._server_secrets = inputs.plan.server_secret_env
        self._token = secrets.token_urlsafe(32)  # this attempt's own; kept in memory and step environments only
        serving = inputs.plan.serving
        replicas: dict[str, list[Replica]] = {}
        endpoints: dict[str, str] = {}
        servers = sum(len(d.replicas) for d in serving.deployments) if serving else 0
        proxies = sum(1 for d in serving.deployments if d.proxy) if serving else 0
        memory = split_memory(self._env, servers, proxies)
        if serving is not None:
            replicas = self._start_servers(serving, began, job_id, memory, log)
            endpoints = self._endpoints(serving, replicas, began, job_id, memory, log)
        client = self._start_client(inputs, began, endpoints, memory, resume=False)
        runs = 1
        while True:
            record = self._watch(client, began, replicas, log)
            if record.state == "failed" and record.retryable and runs <= inputs.plan.client_retries:
                log.warning("client.rerun", run=runs + 1, reason=record.reason, why="servers kept; resuming batches")
                self._runner.rerun(began)
                self._steps.remove(client)
                endpoints.update(self._restart_dead_proxies(replicas, began, memory, log))
                client = self._start_client(inputs, began, endpoints, memory, resume=True)
                runs += 1
                continue
            log.info("attempt.ended", state=record.state, rows=record.rows, client_runs=runs)
            return exit_code_for(record)

    # --- servers ---------------------------------------------------------------------------------------

    def _start_servers(
        self, serving: ServingPlan, began: Began, job_id: str, memory: MemorySplit, log: Any
    ) -> dict[str, list[Replica]]:
        gpus = check_gpus(serving, self._env)
        server_env = self._without_secrets()
        missing = sorted({n for d in serving.deployments for n in d.env_from if not self._env.get(n)})
        if missing:
            raise SecretMissingError(
                f"variable(s) {', '.join(missing)} named by server.env_from are unset in the job's environment"
            )
        version = vllm_version(serving, server_env)
        log.info("serving.start", gpus=len(gpus), vllm=version)
        wanted = [r.port for d in serving.deployments for r in d.replicas]
        ports = iter(choose_ports(wanted, job_id))
        replicas: dict[str, list[Replica]] = {}
        for dep in serving.deployments:
            for rep in dep.replicas:
                port = next(ports)
                cmd = server_command(serving, dep, HOST, port)
                spec = StepSpec(
                    name=f"server-{dep.alias}-{rep.index}",
                    argv=cmd.argv,
                    env={
                        **server_env,
                        **dep.env,
                        **{name: self._env[name] for name in dep.env_from},
                        **token_environment(serving, self._token),
                    },
                    log=began.layout.dir / f"server-{dep.alias}-{rep.index}.log",
                    cpus=rep.cpus,
                    mem_mb=memory.server,
                    gpus=rep.gpus,
                    gpu_request=serving.gpu_request,
                    srun_extra=cmd.srun_extra,
                )
                replicas.setdefault(dep.alias, []).append(Replica(dep.alias, rep.index, port, self._start(spec)))
                log.info("server.started", step=spec.name, port=port, argv=list(cmd.argv))
        for dep in serving.deployments:
            for replica in replicas[dep.alias]:
                took = self._wait_ready(replica.step, replica.url, dep.served_model_name, dep.startup_timeout)
                log.info("server.ready", step=replica.step.name, seconds=round(took, 2))
        self._record_serving(began, serving, replicas, version)
        return replicas

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
            client=self._http,
            sleep=sleep,
            token=self._token,
        )

    def _endpoints(
        self,
        serving: ServingPlan,
        replicas: dict[str, list[Replica]],
        began: Began,
        job_id: str,
        memory: MemorySplit,
        log: Any,
    ) -> dict[str, str]:
        """One endpoint per local alias: the replica itself, or a balancing proxy in front of several."""
        urls: dict[str, str] = {}
        proxied = [d for d in serving.deployments if d.proxy]
        used = {r.port for reps in replicas.values() for r in reps}
        ports = iter(choose_ports([None] * len(proxied), f"{job_id}7", lambda p: p not in used and port_is_free(p)))
        for dep in serving.deployments:
            if not dep.proxy:
                urls[dep.alias] = replicas[dep.alias][0].url
                continue
            proxy = self._start_proxy(dep.alias, next(ports), replicas[dep.alias], began, serving.proxy_cpus, memory)
            log.info("proxy.ready", alias=dep.alias, port=proxy.port, upstreams=[r.url for r in replicas[dep.alias]])
            urls[dep.alias] = proxy.url
        return urls

    def _start_proxy(
        self, alias: str, port: int, upstreams: list[Replica], began: Began, cpus: int, memory: MemorySplit
    ) -> ProxyStep:
        argv = [str(self._runtime_exe), "proxy", "--listen", f"{HOST}:{port}"]
        for replica in upstreams:
            argv += ["--upstream", replica.url]
        log_path = began.layout.dir / f"proxy-{alias}.log"
        spec = StepSpec(
            name=f"proxy-{alias}",
            argv=(*argv, "--log", str(log_path)),
            env={**self._without_secrets(), TOKEN_ENV: self._token},
            log=began.layout.dir / f"proxy-{alias}.out",
            cpus=cpus,
            mem_mb=memory.proxy,
        )
        proxy = ProxyStep(alias, port, self._start(spec), log_path)
        self._proxies[alias] = proxy
        self._wait_ready(proxy.step, proxy.url, None, 60.0)
        return proxy

    def _free_port(self, replicas: dict[str, list[Replica]], began: Began) -> int:
        used = {r.port for reps in replicas.values() for r in reps} | {p.port for p in self._proxies.values()}
        [port] = choose_ports([None], f"{began.record.job_id}8", lambda p: p not in used and port_is_free(p))
        return port

    def _restart_dead_proxies(
        self, replicas: dict[str, list[Replica]], began: Began, memory: MemorySplit, log: Any
    ) -> dict[str, str]:
        """Start every proxy that has exited again, in front of the replicas still running, before the client
        runs again (on its old port when that is free); the new endpoint of each alias restarted."""
        urls: dict[str, str] = {}
        for alias, old in list(self._proxies.items()):
            if old.step.poll() is None:
                continue
            self._steps.remove(old.step)
            alive = [r for r in replicas[alias] if r.step.poll() is None]
            if not alive:
                raise ServerDiedError(f"no replica of {alias!r} is left to restart its proxy in front of")
            port = old.port if port_is_free(old.port) else self._free_port(replicas, began)
            proxy = self._start_proxy(alias, port, alive, began, old.step.spec.cpus, memory)
            log.warning("proxy.restarted", alias=alias, port=port, upstreams=[r.url for r in alive])
            urls[alias] = proxy.url
        return urls

    def _record_serving(
        self, began: Began, serving: ServingPlan, replicas: dict[str, list[Replica]], version: str
    ) -> None:
        doc = {
            "vllm_version": version,
            "container_runtime": serving.container_runtime,
            "replicas": [
                {
                    "alias": r.alias,
                    "index": r.index,
                    "port": r.port,
                    "step": r.step.name,
                    "argv": list(r.step.spec.argv),
                }
                for reps in replicas.values()
                for r in reps
            ],
        }
        atomic_write(began.layout.dir / "serving.json", encode_pretty(doc))

    # --- client ----------------------------------------------------------------------------------------

    def _start_client(
        self, inputs: Inputs, began: Began, endpoints: dict[str, str], memory: MemorySplit, *, resume: bool
    ) -> Step:
        by_provider = _provider_endpoints(inputs, endpoints)
        endpoints_file = began.layout.dir / "endpoints.json"
        atomic_write(endpoints_file, encode_pretty(by_provider))
        argv: tuple[str, ...] = (
            str(self._runtime_exe),
            "client",
            "--run-dir",
            str(self._run_dir),
            "--shard",
            str(began.shard),
            "--attempt",
            began.record.attempt,
            "--endpoints",
            str(endpoints_file),
        )
        if resume:
            argv = (*argv, "--resume")
        spec = StepSpec(
            name="client",
            argv=argv,
            env={
                **without(self._env, [n for n in self._server_secrets if n not in self._secrets]),
                **dict.fromkeys(local_token_names(inputs.snapshot), self._token),
            },
            log=began.layout.dir / "client.out",
            cpus=inputs.plan.client_cpus,
            mem_mb=memory.client,
        )
        return self._start(spec)

    def _watch(self, client: Step, began: Began, replicas: dict[str, list[Replica]], log: Any) -> AttemptRecord:
        """Wait for the client step while watching the servers; the attempt's record once the client ended."""
        reported: set[str] = set()
        failures: dict[str, int] = {}
        next_check = time.monotonic() + self._health_interval
        while True:
            code = client.poll()
            if code is not None:
                break
            if self._stop.event.is_set():
                raise self._interrupted()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self._health_interval
                self._check_health(replicas, failures, log)
            for alias, reps in replicas.items():
                alive = [r for r in reps if r.step.poll() is None]
                for r in reps:
                    if r.step.poll() is not None and r.step.name not in reported:
                        reported.add(r.step.name)
                        log.warning("server.died", step=r.step.name, status=r.step.poll(), left=len(alive))
                if not alive:
                    tails = "\n".join(f"--- {r.step.spec.log}:\n{read_tail(r.step.spec.log)}" for r in reps)
                    raise ServerDiedError(f"every replica of {alias!r} exited during generation\n{tails}")
            dead = next((p for p in self._proxies.values() if p.step.poll() is not None), None)
            if dead is not None:
                return self._proxy_died(dead, client, began, log)
            self._sleep(self._poll)
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

    def _proxy_died(self, proxy: ProxyStep, client: Step, began: Began, log: Any) -> AttemptRecord:
        """The client's endpoint is gone: stop the client at once (it would only retry against nothing and drop
        rows) and fail its run with ``proxy_died`` (retryable: a rerun starts the proxy again)."""
        status = proxy.step.poll()
        why = (
            f"stopped after {self._unhealthy_limit} health checks in a row without an answer"
            if proxy.hung
            else f"exited with status {status}"
        )
        log.error("proxy.died", step=proxy.step.name, status=status, hung=proxy.hung, why="stopping the client")
        client_status = client.stop(self._grace) if client.poll() is None else client.poll()
        log.info("step.stopped", step=client.name, status=client_status)
        tails = "".join(
            f"\n--- {path}:\n{tail}" for path in (proxy.step.spec.log, proxy.log) if (tail := read_tail(path).strip())
        )
        self._runner.fail(
            began,
            ProxyDiedError(
                f"{proxy.step.name}, the endpoint of {proxy.alias!r} at {proxy.url}, {why} during generation; "
                f"the client was stopped{tails}"
            ),
        )
        return read_json(began.layout.record, AttemptRecord)

    def _check_health(self, replicas: dict[str, list[Replica]], failures: dict[str, int], log: Any) -> None:
        """A live replica that stops answering /health (hung, holding its port) is stopped after
        ``unhealthy_limit`` checks in a row, so it leaves the proxy's rotation and counts as dead. A proxy that
        stops answering at all is stopped the same way (and then counts as a dead proxy)."""
        for proxy in self._proxies.values():
            if proxy.step.poll() is not None:
                continue
            answered = answers(self._http, proxy.url, self._token)
            if self._strike(proxy.step, answered, failures, log, "proxy.unresponsive", "proxy.hung", "no answer"):
                proxy.hung = True
        for reps in replicas.values():
            for r in reps:
                if r.step.poll() is None:
                    healthy = is_healthy(self._http, r.url, self._token)
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
        """Client first, then proxies, then servers: each TERM, a grace period, then KILL."""
        for step in reversed(self._steps):
            if step.poll() is None:
                status = step.stop(self._grace)
                log.info("step.stopped", step=step.name, status=status)
        self._steps.clear()


def _provider_endpoints(inputs: Inputs, alias_urls: Mapping[str, str]) -> dict[str, str]:
    """Local providers' OpenAI base URLs (``.../v1``), keyed by provider name as the snapshot names them."""
    local = {p.name for p in inputs.snapshot.providers if p.local}
    out: dict[str, str] = {}
    for model in inputs.snapshot.models:
        if model.provider in local and model.alias in alias_urls:
            out[model.provider] = f"{alias_urls[model.alias]}/v1"
    missing = local - set(out)
    if missing:
        raise RuntimeFailure(f"no endpoint was started for local provider(s) {sorted(missing)}")
    return out
