"""What the harness sees of the local cluster: the run's Slurm jobs, its processes (by command line and by the
Slurm job in their environment), its scratch directories, and the scheduler commands it sends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from ddslurm.runtime._scratch import ScratchMarker

NODE_LOCK = threading.Lock()
"""One node down at a time across the campaign's scenarios."""
KINDS = ("client", "proxy", "generate", "server")


def sh(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} timed out after {timeout:.0f} s")


def run_arrays(run_dir: Path) -> list[str]:
    """The array job ids the run's submissions recorded."""
    arrays = []
    for path in run_dir.glob("submissions/*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            arrays.append(str(json.loads(path.read_text())["array_job_id"]))
    return sorted(set(arrays), key=int)


def queued(arrays: list[str]) -> dict[str, tuple[str, str, str, str]]:
    """Queued or running jobs of the arrays: job id → (array task id ``A_i``, state, node list, squeue's reason)."""
    if not arrays:
        return {}
    out = sh("squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%A|%i|%T|%N|%r").stdout
    jobs = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            jobs[parts[0]] = (parts[1], parts[2], parts[3], parts[4])
    return jobs


def job_ids(arrays: list[str]) -> set[str]:
    """Every job id of the arrays' tasks Slurm knows of (sacct), queued ones included."""
    if not arrays:
        return set()
    out = sh("sacct", "-n", "-P", "-X", "-j", ",".join(arrays), "--format=JobIDRaw").stdout
    return {line.strip() for line in out.splitlines() if line.strip()} | set(queued(arrays))


@dataclass(frozen=True)
class Proc:
    pid: int
    kind: str
    job: str
    argv: tuple[str, ...]


def _words(pid: str) -> list[str]:
    with contextlib.suppress(OSError):
        return [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
    return []


def _environ(pid: str) -> dict[str, str]:
    env = {}
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            name, sep, value = item.decode(errors="replace").partition("=")
            if sep and name.startswith("SLURM_"):
                env[name] = value
    return env


def kind_of(words: list[str]) -> str | None:
    """``client`` / ``proxy`` / ``generate`` for ``ddslurm-runtime <kind>`` itself (not an ``srun`` that runs it),
    ``server`` for ``fake-vllm serve``; None otherwise."""
    if not words:
        return None
    program, rest = Path(words[0]).name, words[1:]
    if program.startswith("python") and rest:
        if rest[0] == "-m" and len(rest) > 1:
            program, rest = rest[1], rest[2:]
        else:
            program, rest = Path(rest[0]).name, rest[1:]
    if program == "ddslurm-runtime" and rest and rest[0] in ("client", "proxy", "generate"):
        return rest[0]
    if program in ("fake-vllm", "fake_vllm") and rest and rest[0] == "serve":
        return "server"
    return None


def run_processes(run_dir: Path, arrays: list[str], jobs: set[str]) -> list[Proc]:
    """Processes of the run: started by one of its Slurm jobs (by environment), or naming its directory."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        words = _words(entry.name)
        kind = kind_of(words)
        env = _environ(entry.name)
        job = env.get("SLURM_JOB_ID", "")
        ours = env.get("SLURM_ARRAY_JOB_ID", "") in arrays or job in jobs
        if not ours and kind is not None and any(str(run_dir) in w for w in words):
            ours = True
        if ours and (kind is not None or env):
            found.append(Proc(int(entry.name), kind or "other", job, tuple(words)))
    return found


def kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True


def scratch_dirs(jobs: set[str]) -> list[Path]:
    """``ddslurm-scratch-*`` directories whose marker names one of ``jobs``."""
    bases = {Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp")}
    left = []
    for base in bases:
        with contextlib.suppress(OSError):
            for entry in base.iterdir():
                if not entry.name.startswith("ddslurm-scratch-") or entry.is_symlink() or not entry.is_dir():
                    continue
                marker = scratch_marker(entry)
                job = None if marker is None else str(marker.job_id)
                if job in jobs or (job is None and any(f"-{j}-" in entry.name for j in jobs)):
                    left.append(entry)
    return left


def scratch_marker(path: Path) -> ScratchMarker | None:
    """The marker of a ``ddslurm-scratch-*`` directory, as the runtime writes it; None if unreadable."""
    from ddslurm.runtime._scratch import MARKER, ScratchMarker

    with contextlib.suppress(OSError, msgspec.DecodeError):
        return msgspec.json.decode((path / MARKER).read_bytes(), type=ScratchMarker)
    return None


def scratch_creator(path: Path) -> int | None:
    """The pid that made a ``ddslurm-scratch-*`` directory (its marker's), None if unreadable."""
    marker = scratch_marker(path)
    return None if marker is None else marker.pid


def sweep_scratch(paths: list[Path]) -> str:
    """The sweep a ddslurm step runs when it starts on a node (``ddslurm.runtime._scratch.node_sweeper``: this user's
    directories whose creator and Slurm job are gone) over the directories holding ``paths``; why it kept any of
    ``paths``, for the scenario's line."""
    from ddslurm.runtime._scratch import node_sweeper

    sweeper = node_sweeper({}, uid=os.getuid(), host=socket.gethostname())  # outside any job, as the harness is
    notes = []
    for base in sorted({p.parent for p in paths}):
        report = sweeper.sweep(base)
        if report.error:
            notes.append(f"sweep of {base} skipped: {report.error}")
        notes += [f"{e.path.name} kept: {e.why}" for e in report.kept if e.path in paths]
    return f" ({'; '.join(notes[:3])})" if notes else ""


def other_jobs_on(node: str, ours: set[str]) -> set[str]:
    out = sh("squeue", "-h", "-t", "R", "-o", "%A|%N").stdout
    others = set()
    for line in out.splitlines():
        job, _, nodes = line.partition("|")
        if not nodes or job in ours:
            continue
        names = sh("scontrol", "show", "hostnames", nodes).stdout.split()
        if node in names:
            others.add(job)
    return others


def node_state(node: str) -> str:
    out = sh("sinfo", "-h", "-n", node, "-N", "-o", "%t").stdout.split()
    return out[0] if out else ""
