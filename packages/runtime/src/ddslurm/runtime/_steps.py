"""Processes of an attempt, each an ``srun`` step inside the allocation (or a plain process outside Slurm).

Slurm accounts every step and tears them all down with the job; the controller stops them itself first
(TERM, a grace period that lets vLLM exit, then KILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ddslurm.runtime._redact import RedactedPopen

GpuRequest = Literal["gres", "gpus"]


@dataclass(frozen=True, slots=True)
class StepSpec:
    """What to run and with which share of the allocation. ``env`` is the step's whole environment."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log: Path
    cpus: int = 1
    mem_mb: int | None = None
    gpus: int = 0
    gpu_request: GpuRequest = "gres"
    srun_extra: tuple[str, ...] = ()
    node: int | None = None
    """The allocation's node to run on, by its index in the job's node list (``srun --relative``); None: where
    srun places it (an allocation of one node)."""
    redact: tuple[str, ...] = field(default=(), repr=False)
    """Secrets the step holds that must never reach its log: its output goes through the runtime, which writes
    each occurrence as ``[redacted]`` (:mod:`ddslurm.runtime._redact`; the allocation's token for servers and
    proxies). Empty: the step writes its log file itself."""


@dataclass(slots=True)
class Step:
    spec: StepSpec
    proc: subprocess.Popen[bytes]
    terminate: Callable[[Step], None] | None = None
    """How to deliver TERM to the step's task (srun itself would kill it at once); default: the process group."""
    started: float = field(default_factory=time.monotonic)
    job_name: str | None = None
    """The name Slurm knows the step by (``srun --job-name``), unique within the allocation: ``spec.name`` the
    first time a name starts, ``spec.name.N`` the N-th (an in-allocation rerun, a restarted proxy). None outside
    Slurm."""

    @property
    def name(self) -> str:
        return self.spec.name

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace: float) -> int:
        """TERM, wait up to ``grace`` seconds, then KILL; returns the exit status."""
        if self.proc.poll() is None:
            if self.terminate is not None:
                self.terminate(self)
            else:
                self.signal_group(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
        return self.proc.wait()

    def signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


class StepLauncher(Protocol):
    def start(self, spec: StepSpec) -> Step: ...


def stop_together(steps: Sequence[Step], grace: float) -> list[int]:
    """Stop every step at once (TERM, up to ``grace`` seconds, KILL), one thread each; their exit statuses. Each
    stop is a Slurm query, a signal and the process's exit (0.2-0.9 s under srun): one after the other, they kept
    every GPU of the allocation a second or more (docs/performance.md)."""
    if len(steps) < 2:
        return [step.stop(grace) for step in steps]
    with ThreadPoolExecutor(max_workers=len(steps), thread_name_prefix="stop") as pool:
        return list(pool.map(lambda step: step.stop(grace), steps))


def stop_running(steps: Sequence[Step], grace: float, log: Any) -> None:
    """Stop those of ``steps`` still running, together (:func:`stop_together`), and log each (``step.stopped``)."""
    running = [step for step in steps if step.poll() is None]
    for step, status in zip(running, stop_together(running, grace), strict=True):
        log.info("step.stopped", step=step.name, status=status)


def srun_argv(spec: StepSpec, job_name: str | None = None) -> list[str]:
    """The ``srun`` command line of a step: exactly its CPUs, memory and GPUs, so steps never share GPUs.
    ``job_name``: the step's name in Slurm (default ``spec.name``)."""
    argv = [
        "srun",
        "--exact",
        "--nodes=1",
        "--ntasks=1",
        *([f"--relative={spec.node}"] if spec.node is not None else []),
        f"--cpus-per-task={spec.cpus}",
        f"--job-name={job_name or spec.name}",
        "--export=ALL",
        "--kill-on-bad-exit=1",
    ]
    if spec.mem_mb is not None:
        argv.append(f"--mem={spec.mem_mb}M")
    if spec.gpus and spec.gpu_request == "gpus":
        argv.append(f"--gpus={spec.gpus}")
    else:
        argv.append(f"--gres=gpu:{spec.gpus}" if spec.gpus else "--gres=none")
    argv.extend(spec.srun_extra)
    argv.extend(spec.argv)
    return argv


def _popen(argv: Sequence[str], spec: StepSpec) -> subprocess.Popen[bytes]:
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    if spec.redact:
        return RedactedPopen(
            argv,
            log=spec.log,
            secrets=spec.redact,
            stdin=subprocess.DEVNULL,
            env=dict(spec.env),
            start_new_session=True,
        )
    with spec.log.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(spec.env),
            start_new_session=True,
        )


class SrunLauncher:
    """Starts steps with srun inside the current allocation.

    srun answers SIGTERM by killing its tasks at once, which gives vLLM no time to exit; so TERM goes to the
    step's task through ``scancel --signal=TERM JOB.STEP`` (the step found by its name), and srun ends when the
    task does. A name that starts again (an in-allocation rerun of a client, a restarted proxy) gets its start's
    number (``client-3.2``): squeue may still list the earlier step of that name, and TERM must reach exactly the
    step this Step started, never its predecessor.
    """

    def __init__(
        self,
        job_id: str,
        *,
        array_job_id: str | None = None,
        array_task_id: str | None = None,
        run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
        popen: Callable[[Sequence[str], StepSpec], subprocess.Popen[bytes]] | None = None,
    ) -> None:
        self._job_id = job_id
        self._run = run
        self._popen = popen or _popen
        self._starts: dict[str, int] = {}
        # squeue names an array task's steps "<array>_<task>.<step>", other jobs' "<job>.<step>"; the array's
        # other tasks run steps with the same names, so only this task's prefix may match.
        self._prefix = f"{array_job_id}_{array_task_id}." if array_job_id and array_task_id else f"{job_id}."

    def start(self, spec: StepSpec) -> Step:
        count = self._starts[spec.name] = self._starts.get(spec.name, 0) + 1
        job_name = spec.name if count == 1 else f"{spec.name}.{count}"
        proc = self._popen(srun_argv(spec, job_name), spec)
        return Step(spec, proc, terminate=self._terminate, job_name=job_name)

    def step_id(self, name: str) -> str | None:
        out = self._run(
            ["squeue", "-h", "--steps", "-j", self._job_id, "-o", "%i|%j"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        for line in out.stdout.splitlines():
            step, _, step_name = line.strip().partition("|")
            if step_name == name and step.startswith(self._prefix):
                return step
        return None

    def _terminate(self, step: Step) -> None:
        step_id = self.step_id(step.job_name or step.name)
        if step_id is None:
            step.signal_group(signal.SIGTERM)
            return
        self._run(["scancel", "--signal=TERM", step_id], capture_output=True, text=True, timeout=30, check=False)


class LocalLauncher:
    """Starts steps as plain processes (outside Slurm: development and tests)."""

    def start(self, spec: StepSpec) -> Step:
        return Step(spec, _popen(spec.argv, spec))


def without(env: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """``env`` minus ``names`` (the run's secret variables never reach server or proxy steps)."""
    drop = set(names)
    return {k: v for k, v in env.items() if k not in drop}
