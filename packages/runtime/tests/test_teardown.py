"""Teardown: clients, then proxies, then servers; the steps of each group are stopped at once."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

from ddslurm.config import RunLayout
from ddslurm.runtime._controller import Controller, ProxyStep, stop_together
from ddslurm.runtime._log import new_logger
from ddslurm.runtime.testing import make_controller


class SlowStop:
    """A running step whose stop takes ``seconds`` (under srun: a Slurm query, the signal, the process's exit)."""

    def __init__(self, name: str, events: list[tuple[str, str, float]], seconds: float = 0.3) -> None:
        self.name, self.events, self.seconds, self.stopped = name, events, seconds, False
        self.lock = threading.Lock()

    def poll(self) -> int | None:
        return 0 if self.stopped else None

    def stop(self, grace: float) -> int:
        with self.lock:
            self.events.append(("begin", self.name, time.monotonic()))
        time.sleep(self.seconds)
        with self.lock:
            self.events.append(("end", self.name, time.monotonic()))
        self.stopped = True
        return 143


def _controller(tmp_path: Path) -> Controller:
    # no launcher: teardown starts nothing
    return make_controller(RunLayout(tmp_path / "run-1"), None, scratch_home=tmp_path)  # type: ignore[arg-type]


def test_teardown_stops_clients_then_proxies_then_servers_each_group_at_once(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    events: list[tuple[str, str, float]] = []
    names = ["server-gen-0", "server-gen-1", "server-gen-2", "proxy-gen", "client-0", "client-1"]  # start order
    steps: list[Any] = [SlowStop(n, events) for n in names]
    controller._steps = list(steps)
    controller._proxies = {"gen": ProxyStep("gen", 1, steps[3], tmp_path / "proxy.log")}
    out = io.BytesIO()
    started = time.monotonic()
    controller._teardown(new_logger(out))
    took = time.monotonic() - started
    assert took < 3 * 0.3 + 0.4, took  # three groups, each stopped at once; not six steps one after the other
    group = {"client": 0, "proxy": 1, "server": 2}
    kind = {n: group[n.split("-")[0]] for n in names}
    for what, name, at in events:
        if what == "begin":  # every step of an earlier group had ended before this one began
            assert all(end <= at for w, n, end in events if w == "end" and kind[n] < kind[name]), (name, events)
    stopped = [line for line in out.getvalue().decode().splitlines() if '"step.stopped"' in line]
    assert len(stopped) == 6 and controller._steps == []
    assert all(s.stopped for s in steps)


def test_stop_together_returns_each_status_in_order() -> None:
    events: list[tuple[str, str, float]] = []
    steps: list[Any] = [SlowStop("a", events, 0.2), SlowStop("b", events, 0.0)]
    assert stop_together(steps, 1.0) == [143, 143]
    assert stop_together([], 1.0) == []
