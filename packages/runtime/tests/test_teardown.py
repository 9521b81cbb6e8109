"""Teardown: clients, then proxies, then servers; the steps of each group are stopped at once."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from ddslurm.config import ProviderSnapshot, RunLayout, digest
from ddslurm.config.testing import make_plan
from ddslurm.runtime import AttemptRunner, Inputs
from ddslurm.runtime._controller import Controller
from ddslurm.runtime._fleet import Fleet
from ddslurm.runtime._fleet_start import ProxyStep
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._steps import stop_together
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._workers import OneShard, Work, Workers


class SlowStop:
    """A running step whose stop takes ``seconds`` (under srun: a Slurm query, the signal, the process's exit); with
    ``together``, its stop returns only once every step sharing that barrier is being stopped too (a teardown that
    stopped them one after the other breaks the barrier: an event, not a clock, says they were stopped at once)."""

    def __init__(
        self,
        name: str,
        events: list[tuple[str, str, float]],
        seconds: float = 0.3,
        together: threading.Barrier | None = None,
    ) -> None:
        self.name, self.events, self.seconds, self.stopped = name, events, seconds, False
        self.together = together
        self.lock = threading.Lock()

    def poll(self) -> int | None:
        return 0 if self.stopped else None

    def stop(self, grace: float) -> int:
        with self.lock:
            self.events.append(("begin", self.name, time.monotonic()))
        if self.together is not None:
            self.together.wait(timeout=60)  # BrokenBarrierError when the group's others are not stopped meanwhile
        time.sleep(self.seconds)
        with self.lock:
            self.events.append(("end", self.name, time.monotonic()))
        self.stopped = True
        return 143


def _allocation(tmp_path: Path, log: Any) -> tuple[Workers, Fleet]:
    """The two halves of an allocation, with nothing started (teardown starts nothing)."""
    layout = RunLayout(tmp_path / "run-1")
    runner = AttemptRunner(layout, engine=lambda r: None, env={}, scratch_home=tmp_path, make_logger=new_logger)
    plan = make_plan("run-1", (4,))
    inputs = Inputs(plan=plan, plan_sha256=digest(plan), recipe={}, snapshot=ProviderSnapshot())
    common: dict[str, Any] = {"launcher": None, "env": {}, "runtime_exe": Path("/x/ddslurm-runtime"), "grace": 15.0}
    workers = Workers(
        runner, OneShard(0), inputs, run_dir=layout.root, allocation=None, job_id="9", node="n1", restart=0,
        slurm_log=None, client_mb=None, identity="1::", logger=log, stop=StopSignal(), **common,
    )  # fmt: skip
    fleet = Fleet(
        secrets=(), directory=tmp_path, job_id="9", token="t", server_mb=None, proxy_mb=None, http=httpx.Client(),
        stop=StopSignal(), log=log, unhealthy_limit=6, **common,
    )  # fmt: skip
    return workers, fleet


def test_teardown_stops_clients_then_proxies_then_servers_each_group_at_once(tmp_path: Path) -> None:
    events: list[tuple[str, str, float]] = []
    names = ["server-gen-0", "server-gen-1", "server-gen-2", "proxy-gen", "client-0", "client-1"]  # start order
    groups = {"server": threading.Barrier(3), "proxy": threading.Barrier(1), "client": threading.Barrier(2)}
    steps: list[Any] = [SlowStop(n, events, together=groups[n.split("-")[0]]) for n in names]
    out = io.BytesIO()
    workers, fleet = _allocation(tmp_path, new_logger(out))
    fleet._servers.extend(steps[:3])
    fleet._proxies["gen"] = ProxyStep("gen", 1, steps[3], tmp_path / "proxy.log")
    workers._works.extend(Work(None, step, None) for step in steps[4:])  # type: ignore[arg-type]
    Controller._teardown(workers, fleet)  # each group's barrier held: its steps were stopped at once
    assert not any(barrier.broken for barrier in groups.values())
    group = {"client": 0, "proxy": 1, "server": 2}
    kind = {n: group[n.split("-")[0]] for n in names}
    for what, name, at in events:
        if what == "begin":  # every step of an earlier group had ended before this one began
            assert all(end <= at for w, n, end in events if w == "end" and kind[n] < kind[name]), (name, events)
    stopped = [line for line in out.getvalue().decode().splitlines() if '"step.stopped"' in line]
    assert len(stopped) == 6
    assert all(s.stopped for s in steps)


def test_stop_together_returns_each_status_in_order() -> None:
    events: list[tuple[str, str, float]] = []
    steps: list[Any] = [SlowStop("a", events, 0.2), SlowStop("b", events, 0.0)]
    assert stop_together(steps, 1.0) == [143, 143]
    assert stop_together([], 1.0) == []
