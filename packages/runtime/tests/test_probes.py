"""Liveness and readiness probes that never generate: SGLang's ``/health`` is a one-token generation that a busy
engine answers late or 503 (the stand-in's SGLang mode queues it behind the generations its gate holds), so a
loaded SGLang replica is not taken for hung; one that answers nothing (SIGSTOP) still is, and so is one whose
probe fails while its proxy gets no answer from it."""

from __future__ import annotations

import io
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ddslurm.config import DeploymentPlan, ReplicaPlan
from ddslurm.runtime._fleet import Fleet
from ddslurm.runtime._fleet_start import Replica
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._stop import StopSignal

fake_testing = pytest.importorskip("fake_vllm.testing")

TOKEN = "probe-token"


class ProcessStep:
    """A server step that is a plain process: what the fleet polls and stops (counted)."""

    def __init__(self, proc: subprocess.Popen[bytes], name: str = "server-gen-0") -> None:
        self.proc, self.name, self.stops = proc, name, 0

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace: float) -> int:
        self.stops += 1
        return 0


def _fleet(tmp_path: Path, engine: str, url: str, step: Any, limit: int) -> Fleet:
    fleet = Fleet(
        launcher=None, env={}, secrets=(), runtime_exe=Path("/x/ddslurm-runtime"), directory=tmp_path, job_id="9",
        token=TOKEN, server_mb=None, proxy_mb=None, http=httpx.Client(), stop=StopSignal(),
        log=new_logger(io.BytesIO()), grace=1.0, unhealthy_limit=limit,
    )  # fmt: skip
    replica = ReplicaPlan(index=0, gpus=1, cpus=1)
    fleet._deployments["gen"] = DeploymentPlan(
        alias="gen", model="m", served_model_name="m", engine=engine, tensor_parallel=1, replicas=(replica,),  # type: ignore[arg-type]
        startup_timeout=30, proxy=False, listen="tcp",
    )  # fmt: skip
    fleet._replicas["gen"] = [Replica("gen", 0, url, step)]
    return fleet


@pytest.fixture
def loaded_sglang(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """An SGLang stand-in (with the token) whose generation the gate holds: its /health gets no output."""
    gate = tmp_path / "gate"
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "0.1"}  # the hold decides the 503, the timeout only ends each probe
    with fake_testing.start_server(engine="sglang", api_key=TOKEN, args=["--fake-gate", str(gate)], env=env) as s:
        fake_testing.set_gate(gate, "hold")
        yield s, gate


def test_a_loaded_sglang_replica_whose_health_fails_is_not_stopped(tmp_path: Path, loaded_sglang: Any) -> None:
    server, _ = loaded_sglang
    assert httpx.get(f"{server.root_url}/health", timeout=30).status_code == 503  # what probing /health would see
    step = ProcessStep(server.proc)
    fleet = _fleet(tmp_path, "sglang", server.root_url, step, limit=6)
    for _ in range(8):
        fleet.check_health()
    assert step.stops == 0 and not fleet._failures
    assert "Health check failed" in server.log_text()  # its /health did fail meanwhile: the probe never asked it


def test_a_hung_sglang_replica_is_still_stopped(tmp_path: Path, loaded_sglang: Any) -> None:
    server, _ = loaded_sglang
    step = ProcessStep(server.proc)
    fleet = _fleet(tmp_path, "sglang", server.root_url, step, limit=2)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        fleet.check_health()
        assert step.stops == 0
        fleet.check_health()
        assert step.stops == 1
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


class Probed(Fleet):
    """A fleet whose replica's probe always fails, and whose proxy reports ``answers`` (one a check) for it."""

    answers: list[int]

    def _alive(self, alias: str, replica: Replica) -> bool:
        return False

    def _progress(self, alias: str) -> dict[str, int]:
        return {"http://127.0.0.1:1": self.answers.pop(0)}


@pytest.mark.parametrize(("answers", "stopped"), [([1, 2, 3, 4, 5], False), ([1, 1, 1, 1, 1], True)])
def test_a_failed_probe_is_no_strike_while_the_proxy_gets_answers(
    tmp_path: Path, answers: list[int], stopped: bool
) -> None:
    """A slow probe under load is forgiven while the replica answers requests through its proxy; one that answers
    none is stopped after ``unhealthy_limit`` failed checks in a row."""
    step = ProcessStep(subprocess.Popen(["sleep", "60"]))
    try:
        fleet = _fleet(tmp_path, "vllm", "http://127.0.0.1:1", step, limit=3)
        fleet.__class__ = Probed
        fleet.answers = list(answers)  # type: ignore[attr-defined]
        for _ in answers:
            fleet.check_health()
        assert (step.stops > 0) is stopped
    finally:
        step.proc.kill()
        step.proc.wait()
