"""An allocation's model servers and their proxies, from launch to teardown.

    launch (replicas, then each deployment's proxy, not waiting) ─► wait until every replica, then every proxy,
    answers (serving.json) ─► watch: health checks (a replica or proxy that stops answering is stopped after
    ``unhealthy_limit`` checks in a row), a replica that dies leaves rotation, no replica of an alias left fails
    the attempts, a dead proxy fails the clients' runs and is started again before a client runs again ─► teardown

Launching and readiness, where each step listens and how a replica that spans nodes is started and watched, are
:class:`~ddslurm.runtime._fleet_start.FleetStart`'s; a :class:`Fleet` is one that is also watched and torn down.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx

from ddslurm.config import read_tail
from ddslurm.runtime._fleet_start import PROXY_READY_S, FleetStart, ProxyStep, Replica
from ddslurm.runtime._listeners import ListenerNotOursError, socket_path
from ddslurm.runtime._scratch import remove_scratch
from ddslurm.runtime._serving import (
    HEALTH_TIMEOUT_S,
    ProxyDiedError,
    ServerDiedError,
    alive,
    answers,
    auth_headers,
)
from ddslurm.runtime._steps import Step, stop_running


class Fleet(FleetStart):
    """The servers and proxies of one allocation (:class:`~ddslurm.runtime._fleet_start.FleetStart`), watched
    while the attempts run and stopped at the end."""

    # --- watching --------------------------------------------------------------------------------------

    def check_replicas(self) -> None:
        """A replica that died is started again, up to its deployment's ``restarts`` (a replica on one node), else
        leaves rotation (reported once); no replica of an alias left fails the attempts.

        A replica dies with any of its steps: the leader, or a follower of a replica that spans nodes (its engine
        cannot go on without a rank). Its other ranks are stopped. A restart starts the same command on the same
        GPUs and listener (its port stays this allocation's; a socket's stale file is removed first), so the
        proxy's upstream and the endpoints file stay true: the proxy holds or routes around the requests until the
        replica answers /health again (``server.restarted``), and a client that saw errors meanwhile resumes its
        batches. When no replica of the alias is left (a replica that spans nodes is the only one, or the restarts
        are spent) the attempts fail at once, with the log of the rank that died and its leader's, and the
        teardown stops every step. First, another user's connection to a replica's rendezvous fails the attempts
        (``rendezvous_intruder``), whether the engine is still running or died of it."""
        for reps in self._replicas.values():
            for r in reps:  # a rank dead or alive: an intruder at its rendezvous is the reason, not its death
                if r.rendezvous and id(r.step) not in self._reported:
                    self._check_rendezvous(r, "during generation")
        for alias, reps in self._replicas.items():
            dead = {r.index: r.dead() for r in reps}
            for r in reps:
                gone = dead[r.index]
                if not gone:
                    self._check_restarted(alias, r)
                    continue
                if id(r.step) in self._reported:
                    continue
                self._reported.add(id(r.step))
                alive = [x for x in reps if not dead[x.index]]
                for step in gone:
                    self._log.warning("server.died", step=step.name, status=step.poll(), left=len(alive))
                if rest := [s for s in r.steps if s not in gone]:
                    stop_running(rest, self._grace, self._log)
                if self._restart(alias, r):
                    dead[r.index] = []
            if all(dead[r.index] for r in reps):
                tails = "\n".join(_tails(r, dead[r.index]) for r in reps)
                spent = sum(self._restarts.get((alias, r.index), 0) for r in reps)
                after = f" (after {spent} restart{'s' if spent != 1 else ''})" if spent else ""
                raise ServerDiedError(f"every replica of {alias!r} exited during generation{after}\n{tails}")

    def _restart(self, alias: str, replica: Replica) -> bool:
        """Start a dead replica on one node again, if its deployment's restarts are not spent; whether it was."""
        key = (alias, replica.index)
        used = self._restarts.get(key, 0)
        allowed = self._deployments[alias].restarts
        if replica.followers or used >= allowed:
            return False
        self._restarting.pop(key, None)
        if (path := socket_path(replica.url)) is not None:
            path.unlink(missing_ok=True)  # the dead server's socket file; the directory is this allocation's
        step = self._launcher.start(replica.step.spec)
        self._servers.append(step)
        replica.step = step
        self._restarts[key] = used + 1
        self._restarting[key] = step.started
        self._failures.pop(step.name, None)
        self._log.warning("server.restarting", step=step.name, restart=used + 1, of=allowed, listen=replica.url)
        return True

    def _check_restarted(self, alias: str, replica: Replica) -> None:
        """A restarted replica that answers /health is back in rotation (logged with its load time); one that does
        not within its deployment's ``startup_timeout`` is stopped (then it is dead again)."""
        key = (alias, replica.index)
        began = self._restarting.get(key)
        if began is None:
            return
        if self._alive(alias, replica):
            del self._restarting[key]
            load_s = round(time.monotonic() - began, 2)
            self._log.info("server.restarted", step=replica.step.name, restart=self._restarts[key], load_s=load_s)
        elif time.monotonic() - began > self._deployments[alias].startup_timeout:
            self._log.error("server.hung", step=replica.step.name, why="not healthy within startup_timeout")
            replica.step.stop(self._grace)

    def settle_restarts(self) -> None:
        """At the end of generation, say how each restart still in progress ended: a replica that answers /health
        now is logged back (``server.restarted``), one still loading ``server.restart_unfinished``. The watch loop
        probes a restarted replica once a round, and the proxy sooner: the shard may end on the replica's answers
        before the loop's next round saw it healthy, and the log would not say it came back."""
        for alias, reps in self._replicas.items():
            for r in reps:
                key = (alias, r.index)
                if key not in self._restarting or r.step.poll() is not None:
                    continue
                self._check_restarted(alias, r)
                if key in self._restarting:
                    self._log.info("server.restart_unfinished", step=r.step.name, restart=self._restarts[key])

    def check_health(self) -> None:
        """A live replica that stops answering its liveness probe (hung, holding its port) is stopped after
        ``unhealthy_limit`` checks in a row, so it leaves the proxy's rotation and counts as dead; the probe never
        generates (:func:`~ddslurm.runtime._serving.alive`: SGLang's ``/health`` does), and a failed one is no
        strike while the replica is making progress: its proxy got answers from it since the last check (a
        loaded engine can be slow to answer a probe, never for long to the requests it runs). A proxy that stops
        answering at all is stopped the same way (and then counts as a dead proxy)."""
        for proxy in self._proxies.values():
            if proxy.step.poll() is not None:
                continue
            answered = answers(self._clients.get(proxy.url), proxy.url)
            if self._strike(proxy.step, answered, "proxy.unresponsive", "proxy.hung", "no answer"):
                proxy.hung = True
        for alias, reps in self._replicas.items():
            progress = self._progress(alias)
            for r in reps:
                if r.step.poll() is None and (alias, r.index) not in self._restarting:  # a reload: not hung
                    healthy = self._alive(alias, r)
                    before, now = self._answered.get(r.url), progress.get(r.url)
                    self._answered[r.url] = now
                    if not healthy and before is not None and now is not None and now > before:
                        self._log.info("server.busy", step=r.step.name, why="probe failed, but it answered requests")
                        healthy = True
                    self._strike(r.step, healthy, "server.unhealthy", "server.hung", "no healthy answer")

    def _alive(self, alias: str, replica: Replica) -> bool:
        dep = self._deployments[alias]
        client = self._clients.get(replica.url)
        return alive(client, replica.url, dep.engine, dep.served_model_name, self._token)

    def _progress(self, alias: str) -> dict[str, int]:
        """How many answers the proxy of ``alias`` got from each replica so far (``GET /ddslurm/upstreams``, with
        the token: the proxy's port is this allocation's, :class:`~ddslurm.runtime._ports.PortHolds`); empty
        without a proxy or an answer."""
        proxy = self._proxies.get(alias)
        if proxy is None or proxy.step.poll() is not None:
            return {}
        try:
            answer = self._clients.get(proxy.url).get(
                f"{proxy.url}/ddslurm/upstreams", headers=auth_headers(self._token), timeout=HEALTH_TIMEOUT_S
            )
            upstreams = answer.json()["upstreams"] if answer.status_code == 200 else []
            return {str(u["url"]): int(u["served"]) for u in upstreams}
        except (httpx.HTTPError, ListenerNotOursError, ValueError, KeyError, TypeError):
            return {}

    def _strike(self, step: Step, healthy: bool, warning: str, hung: str, why: str) -> bool:
        """Count a failed health check of ``step`` (a success clears its count); stop it after
        ``unhealthy_limit`` in a row. Returns whether it was stopped."""
        failures = self._failures
        if healthy:
            failures.pop(step.name, None)
            return False
        failures[step.name] = failures.get(step.name, 0) + 1
        self._log.warning(warning, step=step.name, checks=failures[step.name])
        if failures[step.name] < self._unhealthy_limit:
            return False
        self._log.error(hung, step=step.name, why=f"{why}; stopping it")
        step.stop(self._grace)
        return True

    def _dead_proxy(self) -> ProxyStep | None:
        return next((p for p in self._proxies.values() if p.step.poll() is not None), None)

    def proxy_down(self) -> bool:
        return self._dead_proxy() is not None

    def proxy_failure(self) -> ProxyDiedError | None:
        """The failure of the clients' runs when a proxy, their endpoint, is gone (logged; retryable: a rerun
        starts the proxy again); None while every proxy runs."""
        proxy = self._dead_proxy()
        if proxy is None:
            return None
        status = proxy.step.poll()
        why = (
            f"stopped after {self._unhealthy_limit} health checks in a row without an answer"
            if proxy.hung
            else f"exited with status {status}"
        )
        self._log.error("proxy.died", step=proxy.step.name, status=status, hung=proxy.hung, why="stopping the clients")
        tails = "".join(
            f"\n--- {path}:\n{tail}" for path in (proxy.step.spec.log, proxy.log) if (tail := read_tail(path).strip())
        )
        return ProxyDiedError(
            f"{proxy.step.name}, the endpoint of {proxy.alias!r} at {proxy.url}, {why} during generation; "
            f"the client was stopped{tails}"
        )

    def restart_dead_proxies(self) -> None:
        """Start every proxy that has exited again, in front of the replicas still running, before a client runs
        again: on its old port, which this allocation still holds (no other user could take it meanwhile), so the
        endpoints file stays true."""
        for alias, old in list(self._proxies.items()):
            if old.step.poll() is None:
                continue
            alive = [r for r in self._replicas[alias] if not r.dead()]
            if not alive:
                raise ServerDiedError(f"no replica of {alias!r} is left to restart its proxy in front of")
            proxy = self._start_proxy(alias, old.port, alive, old.step.spec.cpus)
            self._wait_ready(proxy.step, proxy.url, None, PROXY_READY_S)
            self._log.warning("proxy.restarted", alias=alias, port=old.port, upstreams=[r.url for r in alive])

    # --- teardown --------------------------------------------------------------------------------------

    def stop(self) -> None:
        """The proxies, then the servers, each group stopped together; then the held ports are let go and the
        sockets' directory removed."""
        stop_running([p.step for p in reversed(self._proxies.values())], self._grace, self._log)
        stop_running(list(reversed(self._servers)), self._grace, self._log)
        self._holds.release()
        self._claims.release()
        self._clients.close()
        if self._sockets is not None:
            remove_scratch(self._sockets)


def _tails(replica: Replica, dead: Sequence[Step]) -> str:
    """The last lines of a dead replica's logs: its leader's (the only step of a replica on one node), after those
    of the followers that exited (which rank died, and why)."""
    steps = [*(s for s in dead if s is not replica.step), replica.step]
    lines = []
    for step in steps:
        why = "" if step is replica.step or step.poll() is None else f" ({step.name} exited with status {step.poll()})"
        lines.append(f"--- {step.spec.log}{why}:\n{read_tail(step.spec.log)}")
    return "\n".join(lines)
