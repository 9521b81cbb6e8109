"""A small Slurm client over argument vectors (no shell). The command runner is injected for tests."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ddslurm.launcher.errors import SlurmError


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed: ...


def subprocess_runner(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
    proc = subprocess.run(
        list(argv),
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return Completed(proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True, slots=True)
class TaskState:
    """Scheduler view of one array task (or a plain job, ``task`` None)."""

    job_id: str
    task: int | None
    state: str
    reason: str = ""
    exit_code: str = ""


_RANGE = re.compile(r"^(?P<array>\d+)_\[(?P<spec>[^\]]+)\]$")


def expand_task_spec(spec: str) -> list[int]:
    """``0-3,7%2`` → [0, 1, 2, 3, 7] (the throttle after ``%`` is ignored)."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def parse_job_key(key: str) -> list[tuple[str, int | None]]:
    """``12_3`` → [("12", 3)]; ``12_[0-2]`` → three tasks; ``12`` → [("12", None)]."""
    if m := _RANGE.match(key):
        return [(m.group("array"), t) for t in expand_task_spec(m.group("spec"))]
    if "_" in key:
        array, task = key.split("_", 1)
        if task.isdigit():
            return [(array, int(task))]
    return [(key, None)]


NODE_ENV_ALLOWED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SLURM_CONF")
"""The submitting environment's variables a job gets besides the ones its submission names: where programs are,
the locale and time zone, the temporary directory, and where Slurm's configuration is. Nothing else."""


def job_environment(env: Mapping[str, str], names: Sequence[str] = ()) -> dict[str, str]:
    """The whole environment a job gets: :data:`NODE_ENV_ALLOWED` and ``names`` as ``env`` has them (unset or
    empty ones are left out). ``sbatch --export=ALL`` from exactly this environment: Slurm passes it on as it
    is, and does not load the user's login environment (``--export=NONE`` and ``--export=NAME,...`` both make
    the node run the user's login shell, ``~/.profile`` and ``~/.bashrc`` included, and keep what it sets)."""
    out: dict[str, str] = {}
    for name in (*NODE_ENV_ALLOWED, *names):
        value = env.get(name)
        if value:
            out[name] = value
    return out


class Slurm:
    def __init__(self, runner: Runner = subprocess_runner, env: Mapping[str, str] | None = None) -> None:
        self._run = runner
        self._env = env
        self._max_array: int | None = None

    def _check(self, argv: list[str], env: Mapping[str, str] | None = None) -> str:
        done = self._run(argv, env=env if env is not None else self._env)
        if done.returncode != 0:
            raise SlurmError(argv, done.returncode, done.stderr or done.stdout)
        return done.stdout

    def sbatch(self, script: str, *, export: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        """Submit ``script`` (a path). The job's environment is exactly :func:`job_environment` of the submitting
        environment (``env``, else the client's, else this process's) and ``export``: sbatch runs in it with
        ``--export=ALL``, so no login file of the user and nothing else of the submitting shell reaches the job."""
        base = env if env is not None else self._env if self._env is not None else os.environ
        out = self._check(["sbatch", "--parsable", "--export=ALL", script], job_environment(base, export))
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(["sbatch"], 0, f"unexpected output: {out!r}")
        return job_id

    def squeue(self, job_ids: Sequence[str]) -> list[TaskState]:
        """Live jobs among ``job_ids`` (one call whatever their number). Unknown ids are simply absent."""
        if not job_ids:
            return []
        done = self._run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|%T|%r"], env=self._env)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return []
            raise SlurmError(["squeue"], done.returncode, done.stderr)
        states: list[TaskState] = []
        for line in done.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 3:
                continue
            for job, task in parse_job_key(parts[0]):
                states.append(TaskState(job, task, parts[1], parts[2]))
        return states

    def sacct(self, job_ids: Sequence[str]) -> list[TaskState]:
        """Accounting records (final states) for ``job_ids``; allocation lines only."""
        if not job_ids:
            return []
        out = self._check(
            ["sacct", "-X", "-n", "--parsable2", "-j", ",".join(job_ids), "--format=JobID,State,ExitCode,Reason"]
        )
        states: list[TaskState] = []
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 3:
                continue
            state = parts[1].split()[0] if parts[1] else ""
            for job, task in parse_job_key(parts[0]):
                states.append(TaskState(job, task, state, parts[3] if len(parts) > 3 else "", parts[2]))
        return states

    def scancel(self, job_ids: Sequence[str]) -> None:
        """Cancel jobs, array tasks (``12_3``) or steps; unknown or finished ids are not an error."""
        if job_ids:
            self._check(["scancel", *job_ids])

    def max_array_size(self) -> int:
        """The cluster's MaxArraySize: task ids must stay below it (1001 when Slurm does not say)."""
        if self._max_array is None:
            out = self._check(["scontrol", "show", "config"])
            match = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
            self._max_array = int(match.group(1)) if match else 1001
        return self._max_array
