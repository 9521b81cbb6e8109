"""The shards an allocation generates and the client steps that generate them.

Where the shards come from (:class:`ShardSource`): the one shard of a one-task-per-shard array (:class:`OneShard`),
or claims on a pool (:class:`ClaimPool`, a pulling allocation). :class:`Workers` begins each shard's attempt, starts
its client step (``client_workers`` at a time when pulling), reruns a client whose run failed retryably
(``client_retries``), and records how each attempt ended. A pulling allocation keeps spare clients ready (one a
worker where the workers share deployed replicas, else one): Data Designer imported and the inputs read, waiting
for its endpoints, a spare takes the next shard when a worker's shard drains (its last requests in flight, or its
last :data:`SPARE_SETUP_S` seconds at its rate) or ends. A spare claims its shard early only while no sibling
allocation of the array waits for one with a free worker slot (``ddslurm.runtime._siblings``); each allocation
publishes its own free slots for its siblings. Shards cancelled on their own (``ddslurm cancel --shards``) are
stopped and recorded ``cancelled``; the allocation goes on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddslurm.config import (
    AttemptRecord,
    ClaimRecord,
    ConfigError,
    Progress,
    RunLayout,
    atomic_write,
    encode,
    make_private_dir,
    publish_once,
    read_json,
    read_tail,
)
from ddslurm.runtime._attempt import AttemptRunner
from ddslurm.runtime._attempt_record import EXIT_FAILED, EXIT_OK, Began, exit_code_for
from ddslurm.runtime._inputs import Inputs
from ddslurm.runtime._siblings import NoSiblings, Siblings, SlotBoard
from ddslurm.runtime._steps import Step, StepLauncher, StepSpec, stop_running
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime.errors import RuntimeFailure

_RESULT_RECORDED = frozenset({"succeeded", "superseded"})
"""Attempt states the client records as its last act: once one is written, its process only exits."""
SPARE_SETUP_S = 5.0
"""About how long a promoted spare takes from its endpoints to its first request (Data Designer's ``create()``:
the config, the seed slice, the model health checks): a shard expected to finish within it drains, so that the
spare's set-up overlaps its last requests (seen 1-3 s on two busy CPUs; too early only overlaps two clients'
requests on the replicas for a moment)."""
STOP_RACE_S = 2.0
"""How long a client step's failure waits for the signal that may have ended it (scancel, time limit)."""


class ClientFailure(RuntimeFailure):
    reason = "client_failed"
    retryable = True


class ShardSource(Protocol):
    """Where an allocation's shards come from: its one shard (a task of a one-task-per-shard array), or claims
    on a pool (a pulling allocation)."""

    pulling: bool
    siblings: Siblings
    """The other allocations of a pulling array, asked before a spare client claims (none for one shard)."""

    def next(self) -> int | None:
        """The next shard to run, or None when there is none left for this allocation."""
        ...


class OneShard:
    """Array task i of a one-task-per-shard array: shard ``shards[i]``, once."""

    pulling = False

    def __init__(self, shard: int) -> None:
        self._shard: int | None = shard
        self.siblings: Siblings = NoSiblings()

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
    no final winner.

    ``siblings``: the array's other allocations, whose free worker slots hold this one's spare client back (by
    default the :class:`~ddslurm.runtime._siblings.SlotBoard` of array task ``task`` in the run directory)."""

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
        siblings: Siblings | None = None,
    ) -> None:
        self._layout = layout
        self._stage = stage
        self._pool = list(pool)
        self._array, self._task, self._job, self._node = array_job_id, task, job_id, node
        self._clock = clock
        self.siblings: Siblings = (
            SlotBoard(layout, array_job_id=array_job_id, task=task, job_id=job_id, node=node)
            if siblings is None
            else siblings
        )

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


class Serving(Protocol):
    """What the clients need of the allocation's servers: their endpoints up before a client starts or reruns."""

    def proxy_down(self) -> bool:
        """An endpoint (a proxy) has exited and was not started again yet."""
        ...

    def restart_dead_proxies(self) -> None:
        """Start every endpoint that has exited again, on its old port."""
        ...


@dataclass(slots=True)
class Work:
    """A shard this allocation is generating: its attempt, its client step, how many client runs so far."""

    began: Began
    client: Step
    log: Any
    runs: int = 1
    draining: bool = False
    """Its last records are in flight (no more than its share of the replicas' capacity left, or no more than
    :data:`SPARE_SETUP_S` of them at its rate): its slot is given to a spare, which sets up while these finish."""
    first_seen: tuple[float, int] | None = None
    """When its progress first showed records done, and how many (its rate is measured from there)."""


def _mark(work: Work, *, draining: bool) -> None:
    """Say on disk whether ``work``'s shard drains (``AttemptLayout.draining``: ``status`` shows it ``draining``,
    its slot a spare's); a file the controller alone writes, so the client's writes of its record never race it.
    Best effort: a marker that cannot be written changes only what ``status`` shows."""
    marker = work.began.layout.draining
    try:
        if draining:
            marker.touch(mode=0o600)
        else:
            marker.unlink(missing_ok=True)
    except OSError as exc:
        work.log.warning("client.draining_marker", error=str(exc))


class Workers:
    """The client workers of one allocation and the shards they take from ``source``.

    ``env`` is the client steps' whole environment (the hosted providers' keys and the attempt's token, none of
    the servers' own secrets); ``allocation`` is a pulling allocation's serving directory (its clients read its
    ``endpoints.json``), None for a one-shard task, whose client reads the one in its attempt's directory.
    ``identity`` is what a client started before its endpoints exist waits for (``--wait-endpoints``).
    """

    def __init__(
        self,
        runner: AttemptRunner,
        source: ShardSource,
        inputs: Inputs,
        *,
        launcher: StepLauncher,
        env: Mapping[str, str],
        runtime_exe: Path,
        run_dir: Path,
        allocation: Path | None,
        job_id: str,
        node: str,
        restart: int,
        slurm_log: str | None,
        client_mb: int | None,
        identity: str,
        logger: Any,
        stop: StopSignal,
        grace: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runner = runner
        self._source = source
        self._inputs = inputs
        self._launcher = launcher
        self._env = env
        self._runtime_exe = runtime_exe
        self._run_dir = run_dir
        self._allocation = allocation
        self._job, self._node, self._restart, self._slurm_log = job_id, node, restart, slurm_log
        self._client_mb = client_mb
        self._identity = identity
        self._log = logger
        self._job_log = logger.bind(job_id=job_id)
        self._stop = stop
        self._grace = grace
        self._clock = clock
        self._count = inputs.plan.client_workers if source.pulling else 1
        shares = [d.max_parallel_requests for d in inputs.plan.serving.deployments] if inputs.plan.serving else []
        self._share = min((n for n in shares if n), default=0)
        """The requests one client keeps in flight to a deployed alias (its share of the replicas' capacity;
        the smallest over the aliases); 0: no deployments, no draining."""
        serving = inputs.plan.serving
        self._node_of_clients = serving.home_node if serving is not None else None
        """The node the client steps run on (``StepSpec.node``): the first, where the endpoints are, in an
        allocation of several nodes."""
        self._works: list[Work] = []
        self._waiting: list[Began] = []
        """Attempts begun whose client step has not started yet."""
        self._spares: list[Work] = []
        """A pulling allocation's next shards: their clients started, each waiting for its own endpoints file (one
        a worker where clients share deployed replicas, whose workers often drain together; one otherwise)."""
        self._spare_count = self._count if self._share else 1
        self._exhausted = False
        """The source has no shard left for this allocation."""
        self._spare_held = False
        """The spare's claim is held back: a sibling allocation has a free worker slot (logged once per hold)."""
        self._endpoints_written: set[Path] = set()
        """The endpoints files this allocation wrote: a client waits for any other (see :meth:`_start_client`)."""
        self._outcomes: list[AttemptRecord] = []
        """The records of the attempts that ended."""
        self._exiting: list[Step] = []
        """Client steps whose attempt recorded its result (``succeeded``) while the process still exits: their
        worker slot is free already (the next shard's client starts), the step is reaped once it has exited."""

    def endpoints_file(self, began: Began) -> Path:
        """The endpoints file a shard's client reads: its pulling allocation's, or a one-shard task's own, in the
        attempt's directory (which is where that task serves from)."""
        return (began.layout.dir if self._allocation is None else self._allocation) / "endpoints.json"

    def publish_endpoints(self, path: Path, data: bytes) -> None:
        """Write an endpoints file (atomically): clients started from now on need not wait for it."""
        atomic_write(path, data)
        self._endpoints_written.add(path)

    def begin_next(self, *, spare: bool = False) -> Began | None:
        """Begin the attempt of the source's next shard that may generate (None when no shard is left); ``spare``:
        for a spare client (its record says so until the client begins generating)."""
        while (shard := self._source.next()) is not None:
            allocation = None if self._allocation is None else str(self._allocation)
            began = self._runner.begin(
                self._inputs, shard, self._job, self._node, self._restart, self._slurm_log, allocation, spare=spare
            )
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
            if self._source.pulling:
                self._log.info("attempt.not_started", shard=shard, why="see the attempt record")
        return None

    def start_first(self) -> None:
        """Begin shards until ``client_workers`` are begun (the first one is), and start their clients: before the
        servers are ready, so that Data Designer's import overlaps the model load."""
        while len(self._waiting) < self._count and self.begin_next() is not None:
            pass
        for began in list(self._waiting):
            self._works.append(self._work(began, self.endpoints_file(began)))

    def top_up(self, serving: Serving) -> None:
        """Keep ``client_workers`` clients generating: the spare one given its endpoints first, else the source's
        next shard begun, each once the endpoints are up again. A proxy that dies under running clients is no
        reason to add one (their runs fail and rerun first); one that is dead when a new shard's client starts
        (reruns used up) is started again first. A pulling allocation then starts the spare clients of its next
        shards (one a worker with deployments: workers that share the replicas finish their shards about together),
        so a finished shard's successor generates at once instead of after a process start and Data Designer's
        import (seconds of idle GPUs per shard), unless a sibling allocation of the array has a free worker slot:
        the next shard is left to it (a worker slot of this one that frees up claims as usual)."""
        self._mark_draining()
        while self._occupied() < self._count and not (self._works and serving.proxy_down()):
            if self._spares:  # ready: Data Designer imported, waiting for its endpoints
                serving.restart_dead_proxies()
                if self._promote():
                    continue
            if self._exhausted:
                break
            began = self.begin_next()
            if began is None:
                self._exhausted = True
                break
            serving.restart_dead_proxies()
            self._works.append(self._work(began, self.endpoints_file(began)))
        while (
            self._source.pulling
            and not self._exhausted
            and len(self._spares) < self._spare_count
            and self._occupied() == self._count
            and self._start_spare()
        ):
            pass
        self._publish_free()

    def _mark_draining(self) -> None:
        """Mark generating clients that drain (:meth:`_drains`), as many as spares are ready to take their slots
        (those marked before and not yet replaced count), so that a spare's set-up (seconds: Data Designer's
        create, the seed) overlaps their last requests instead of following them with the replicas' share idle.
        A pulling allocation with deployments only; once a round."""
        if not (self._source.pulling and self._share):
            return
        free = len(self._spares) - sum(w.draining for w in self._works)
        for work in self._works:
            if free <= 0:
                return
            if not work.draining and self._drains(work):
                work.draining = True
                _mark(work, draining=True)
                free -= 1

    def _occupied(self) -> int:
        """Worker slots taken: every generating client but those draining, whose slot the spare takes."""
        return sum(not w.draining for w in self._works)

    def _drains(self, work: Work) -> bool:
        """Whether the shard's records not yet done fit in its client's share of the replicas (its last requests are
        in flight) or, at the rate its progress file has shown since it first showed records done, take no more
        than :data:`SPARE_SETUP_S`."""
        try:
            progress = read_json(work.began.layout.progress, Progress)
        except (OSError, ValueError, ConfigError):
            return False
        done, now = progress.rows + progress.in_batch, self._clock()
        left = work.began.num_records - done
        if left <= 0 or done <= 0:
            return False
        if left <= self._share:
            return True
        if work.first_seen is None:
            work.first_seen = (now, done)
            return False
        since, done_then = work.first_seen
        rate = (done - done_then) / (now - since) if now > since else 0.0
        return rate > 0 and left / rate <= SPARE_SETUP_S

    def _start_spare(self) -> bool:
        """Claim the next shard for a spare client and start it, unless a sibling waits for a shard. Whether one
        started."""
        if self._source.siblings.sibling_idle():
            if not self._spare_held:
                self._job_log.info("client.spare_held", why="a sibling allocation of the array has a free worker slot")
            self._spare_held = True
            return False
        self._spare_held = False
        began = self.begin_next(spare=True)
        if began is None:
            self._exhausted = True
            return False
        self._spares.append(self._work(began, began.layout.dir / "endpoints.json", spare=True))
        return True

    def _publish_free(self) -> None:
        """Tell the array's other allocations how many worker slots of this one wait for a shard: those with no
        shard and no spare to take one, none once the source has no shard left for it."""
        if not self._source.pulling:
            return
        free = 0 if self._exhausted else max(0, self._count - self._occupied() - len(self._spares))
        self._source.siblings.publish(free)

    def idle(self) -> bool:
        """No client is generating, waiting to, or still exiting: the allocation is done."""
        return not self._works and not self._spares and all(step.poll() is not None for step in self._exiting)

    def collect(self, serving: Serving) -> None:
        """Record every attempt whose client has ended; rerun the client of a retryable failure (``client_retries``:
        servers kept, its batches resumed, its endpoints up again first)."""
        self._exiting = [step for step in self._exiting if step.poll() is None]  # reaped: exited since
        self._cancel_spares()
        for work in list(self._works):
            record = self._ended(work)
            if record is None:
                continue
            if record.state == "failed" and record.retryable and work.runs <= self._inputs.plan.client_retries:
                work.log.warning(
                    "client.rerun", run=work.runs + 1, reason=record.reason, why="servers kept; resuming batches"
                )
                self._runner.rerun(work.began)
                serving.restart_dead_proxies()
                work.client = self._start_client(work.began, self.endpoints_file(work.began), resume=True)
                work.runs += 1
                work.draining = False  # generating again: it takes a slot
                _mark(work, draining=False)
                continue
            work.log.info("attempt.ended", state=record.state, rows=record.rows, client_runs=work.runs)
            if work.draining:
                _mark(work, draining=False)  # its record says how it ended now
            self._works.remove(work)
            self._outcomes.append(record)
        self._publish_free()

    def fail_running(self, failure: RuntimeFailure) -> None:
        """Stop every generating client at once and fail its run with ``failure`` (their endpoint is gone: they
        would only retry against nothing and drop rows)."""
        for work in self._works:
            client = work.client
            status = client.stop(self._grace) if client.poll() is None else client.poll()
            work.log.info("step.stopped", step=client.name, status=status)
            self._runner.fail(work.began, failure)

    def fail_all(self, failure: RuntimeFailure) -> None:
        """The allocation failed: every attempt it began and has not ended fails with it (their clients are stopped
        at teardown)."""
        log = self._job_log
        for began in [*self._waiting, *(w.began for w in [*self._works, *self._spares])]:
            log.error("attempt.failed", shard=began.shard, attempt=began.record.attempt, reason=failure.reason,
                      message=failure.message)  # fmt: skip
            self._runner.fail(began, failure)
            self._outcomes.append(read_json(began.layout.record, AttemptRecord))
        if self._source.pulling:
            log.error("allocation.failed", reason=failure.reason, message=failure.message)

    def fail_ended(self, failure: RuntimeFailure) -> None:
        """Fail every attempt that ended (a tune allocation whose calibration sweep failed after them)."""
        for i, record in enumerate(self._outcomes):
            self._job_log.error("attempt.failed", shard=record.shard, attempt=record.attempt, reason=failure.reason,
                                message=failure.message)  # fmt: skip
            self._outcomes[i] = self._runner.fail_ended(record, failure)

    def stop(self) -> None:
        """Stop every client still running, together."""
        self._source.siblings.close()
        clients = [w.client for w in reversed([*self._works, *self._spares])]
        stop_running([*clients, *self._exiting], self._grace, self._job_log)

    def exit_code(self) -> int:
        """0 only if every shard this allocation ran succeeded. A shard cancelled on its own (``cancel --shards``)
        is what the user asked for: it fails no allocation."""
        outcomes = self._outcomes
        codes = {exit_code_for(r) for r in outcomes if r.reason != "shard_cancelled"} or {
            EXIT_OK if outcomes else EXIT_FAILED
        }
        return EXIT_FAILED if EXIT_FAILED in codes else max(codes)

    def _cancel_spares(self) -> None:
        """Stop every spare client whose shard was cancelled (``cancel --shards``) and record its attempt
        ``cancelled`` now, not when it would have been promoted (its record said ``running`` until then)."""
        for spare in list(self._spares):
            if self._shard_cancelled(spare.began.shard):
                self._spares.remove(spare)
                self._cancel_spare(spare)

    def _cancel_spare(self, spare: Work) -> None:
        status = spare.client.stop(self._grace)
        spare.log.info("step.stopped", step=spare.client.name, status=status, why="ddslurm cancel --shards")
        self._outcomes.append(self._runner.cancel(spare.began, "cancelled by ddslurm cancel --shards before it ran"))

    def _promote(self) -> bool:
        """Give the first spare client its endpoints: it becomes a worker. False when its shard was cancelled meanwhile
        (``cancel --shards``): it is stopped and its attempt recorded ``cancelled``. A spare that ended while it
        waited (it had not begun its attempt: the record is still ``running``) is started again with the endpoints,
        as the shard's first client run: it used none of the shard's reruns (``client_retries``)."""
        spare = self._spares.pop(0)
        if self._shard_cancelled(spare.began.shard):
            self._cancel_spare(spare)
            return False
        own = spare.began.layout.dir / "endpoints.json"
        self.publish_endpoints(own, self.endpoints_file(spare.began).read_bytes())
        status = spare.client.poll()
        if status is not None and read_json(spare.began.layout.record, AttemptRecord).state == "running":
            spare.log.warning(
                "client.spare_restarted", status=status, why="the spare client ended before it was given endpoints"
            )
            spare.client = self._start_client(spare.began, own, resume=False)
        spare.log.info("client.promoted", why="a worker's shard ended; the spare client generates now")
        self._works.append(spare)
        return True

    def _work(self, began: Began, endpoints: Path, *, spare: bool = False) -> Work:
        """The attempt's client step started: it is no longer only waiting (see :meth:`begin_next`)."""
        log = self._log.bind(shard=began.shard, attempt=began.record.attempt)
        work = Work(began, self._start_client(began, endpoints, resume=False, spare=spare), log)
        self._waiting.remove(began)
        return work

    def _start_client(self, began: Began, endpoints_file: Path, *, resume: bool, spare: bool = False) -> Step:
        """A client step; a ``spare`` one shares the workers' CPUs (``srun --overlap``): it only imports Data
        Designer and waits until a worker's shard has ended, whose CPUs it then takes over."""
        argv: tuple[str, ...] = (
            str(self._runtime_exe),
            "client",
            "--run-dir",
            str(self._run_dir),
            "--plan-sha256",
            self._inputs.plan_sha256,
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
            name=f"client-{began.shard}" if self._source.pulling else "client",
            argv=argv,
            env=self._env,
            log=began.layout.dir / "client.out",
            cpus=self._inputs.plan.client_cpus,
            mem_mb=self._client_mb,
            srun_extra=("--overlap",) if spare else (),
            node=self._node_of_clients,
        )
        return self._launcher.start(spec)

    def _ended(self, work: Work) -> AttemptRecord | None:
        """The attempt's record once its client step has ended (None while it runs). A pulling allocation's
        shard whose cancel record appeared is stopped and ends ``cancelled``."""
        client, began = work.client, work.began
        code = client.poll()
        if code is None:
            if self._source.pulling and self._shard_cancelled(began.shard):
                status = client.stop(self._grace)
                work.log.info("step.stopped", step=client.name, status=status, why="ddslurm cancel --shards")
                return self._runner.cancel(began, "cancelled by ddslurm cancel --shards; the allocation goes on")
            recorded = read_json(began.layout.record, AttemptRecord)
            if recorded.state not in _RESULT_RECORDED:
                return None
            # Its result is recorded and published; the process only exits (its interpreter, its srun step: about
            # a second). The slot is free now, so the next shard's client generates that second sooner.
            self._exiting.append(client)
            return recorded
        record = read_json(began.layout.record, AttemptRecord)
        if record.state == "running" and code != 0:
            # scancel and the time limit signal the steps and the batch step together: the client may end first.
            self._stop.sleep(STOP_RACE_S)
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

    def _shard_cancelled(self, shard: int) -> bool:
        """``ddslurm cancel --shards`` wrote the shard's cancel record (pulling allocations)."""
        return os.path.lexists(RunLayout(self._run_dir).shard(shard).cancelled)
