"""Node hygiene on the real cluster: no attempt leaves its scratch directory (the per-job Data Designer home) in
the node's temporary directory, whether it is cancelled (``scancel``) or killed (``kill -9``; the next attempt
on the node sweeps what that left).

The three local "nodes" share this host's /tmp and pids, and other tests run attempts at the same time, so every
assertion names this test's own job ids.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import AttemptRecord, read_json
from tests.e2e import cli_json as _cli
from tests.e2e import processes
from tests.e2e import until as _until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

SERVED = ["--served-model-name", "demo/writer-8b", "demo/judge-70b"]


def _scratch_dirs(job: str, base: Path | None = None) -> list[Path]:
    """The scratch directories of Slurm job ``job`` in the node's temporary directory (or ``base``, the job's
    ``TMPDIR``): ddslurm's name (``ddslurm-scratch-<user>-<job>-...``) and the one earlier versions used
    (``ddslurm-attempt-<job>-...``)."""
    user = re.sub(r"[^A-Za-z0-9_.]", "_", getpass.getuser())
    names = re.compile(rf"ddslurm-scratch-{re.escape(user)}-{job}-.+|ddslurm-attempt-{job}(-r\d+)?-[^-]+")
    found: list[Path] = []
    for where in [base] if base else sorted({Path(tempfile.gettempdir()), Path("/tmp")}):
        found += [p for p in where.iterdir() if names.fullmatch(p.name)]
    return sorted(found)


def _in_squeue(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%A"], capture_output=True, text=True, check=False)
    return job in out.stdout.split()


def _attempt(run_dir: Path, *jobs: str) -> AttemptRecord:
    """The shard's attempt (with ``jobs``: one of another job than those) once it recorded its job id."""

    def find() -> AttemptRecord | None:
        for path in run_dir.glob("shards/shard-00000/attempts/*/attempt.json"):
            record = read_json(path, AttemptRecord)
            if record.job_id not in jobs:
                return record
        return None

    found: AttemptRecord = _until(find, 180, "an attempt to start")
    return found


def _runs(pid: int) -> bool:
    """Whether ``pid`` is still a live process (a zombie is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in {"Z", "X"}


def _client_pid(run_dir: Path) -> int:
    """The client step's own process (not the ``srun`` that started it)."""

    def find() -> int | None:
        for pid, argv in processes():
            if Path(argv[0]).name != "srun" and "client" in argv and str(run_dir) in argv:
                return pid
        return None

    pid: int = _until(find, 120, "the client step")
    return pid


def _slow_run(
    make_run_files: Any, name: str, base_url: str, key: str, extra_run: str = "", tmpdir: Path | None = None
) -> tuple[Path, dict]:
    """A one-shard run against ``base_url``; with ``tmpdir``, its jobs' ``TMPDIR`` (their scratch base)."""
    files = make_run_files(name, num_records=12, shards=1, buffer_size=2, extra_run=extra_run)
    (files.dd_home / "model_providers.yaml").write_text(
        f"providers:\n- {{name: demo-hosted, endpoint: '{base_url}', api_key: DEMO_HOSTED_API_KEY}}\n"
    )
    env = {**files.env, "DEMO_HOSTED_API_KEY": key, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)
    return Path(submitted["run_dir"]), env


def test_scancel_of_a_running_attempt_leaves_no_scratch_directory(make_run_files: Any) -> None:
    from fake_vllm.testing import start_server

    key = "sk-hygiene-" + "3" * 16
    with start_server("demo", args=[*SERVED, "--fake-latency", "2"], api_key=key) as slow:
        run_dir, _ = _slow_run(make_run_files, "scancel", slow.base_url, key)
        job = _attempt(run_dir).job_id
        made = _until(lambda: _scratch_dirs(job), 180, f"job {job}'s scratch directory")
        assert len(made) == 1, made
        subprocess.run(["scancel", job], check=True, timeout=30)
        _until(lambda: not _in_squeue(job), 120, f"job {job} to end")
    record = _attempt(run_dir)
    assert record.state == "failed" and record.reason == "cancelled", record  # it was stopped while generating
    assert _scratch_dirs(job) == []


def _controller_pid(run_dir: Path, job: str) -> int:
    """The batch step of ``job`` (``ddslurm-runtime generate``, the allocation's controller)."""

    def find() -> int | None:
        for pid, argv in processes():
            environ = Path(f"/proc/{pid}/environ")
            if "generate" in argv and str(run_dir) in argv:
                with contextlib.suppress(OSError):
                    if f"SLURM_JOB_ID={job}\0".encode() in environ.read_bytes():
                        return pid
        return None

    pid: int = _until(find, 120, f"job {job}'s controller")
    return pid


def test_a_scratch_directory_left_by_kill_9_is_swept_by_its_controller_or_the_next_attempt_on_the_node(
    make_run_files: Any, tmp_path: Path
) -> None:
    """A client SIGKILLed (its own cleanup cannot run) leaves its scratch directory while its job runs; the job's
    controller sweeps it when the job ends. When the controller is SIGKILLed too, the directory outlives the job,
    and the next attempt's client on the node sweeps it.

    The run's jobs get a temporary directory of their own (``TMPDIR``, which ddslurm passes on and takes as the
    scratch base): every client of this user sweeps its own base, so in the node's shared /tmp another test's
    client could sweep the directory this test needs left behind."""
    from fake_vllm.testing import start_server

    key = "sk-hygiene-" + "4" * 16
    base = tmp_path / "node-tmp"
    base.mkdir()

    def _scratch(job: str) -> list[Path]:
        return _scratch_dirs(job, base)

    with start_server("demo", args=[*SERVED, "--fake-latency", "2"], api_key=key) as slow:
        # client_retries: 0, so that the job ends with its client instead of running it again
        run_dir, env = _slow_run(
            make_run_files, "killed", slow.base_url, key, extra_run="client_retries: 0\n", tmpdir=base
        )
        first = _attempt(run_dir).job_id
        left = _until(lambda: _scratch(first), 180, f"job {first}'s scratch directory")
        pid = _client_pid(run_dir)
        os.kill(pid, signal.SIGKILL)
        _until(lambda: not _runs(pid), 30, "the client to die")
        assert _scratch(first) == left  # nothing runs after SIGKILL: left behind (its job still runs)
        _until(lambda: not _in_squeue(first), 120, f"job {first} to end")
        assert _scratch(first) == []  # its controller swept it as the job ended

        assert _cli("retry", str(run_dir), "--json", env=env)["shards"] == [0]
        killed = _attempt(run_dir, first).job_id
        left = _until(lambda: _scratch(killed), 180, f"job {killed}'s scratch directory")
        controller, pid = _controller_pid(run_dir, killed), _client_pid(run_dir)
        # The controller is stopped first, so that neither can clean up after the other: killed first, its job's end
        # would send the client a SIGTERM, whose cleanup sweeps the directory before the client's SIGKILL arrives (a
        # busy machine ran that in between once); the client killed first, the controller would see it end and sweep.
        os.kill(controller, signal.SIGSTOP)
        os.kill(pid, signal.SIGKILL)
        _until(lambda: not _runs(pid), 30, "the client to die")
        os.kill(controller, signal.SIGKILL)
        _until(lambda: not _in_squeue(killed), 120, f"job {killed} to end")
        assert _scratch(killed) == left  # nobody of its job was left to sweep it

        assert _cli("retry", str(run_dir), "--json", env=env)["shards"] == [0]
        job = _attempt(run_dir, first, killed).job_id
        _until(lambda: _scratch(job), 180, f"job {job}'s scratch directory")  # made after the sweep
        # Swept by this attempt's client: nobody else has this base.
        assert _scratch(killed) == []

        _cli("cancel", str(run_dir), "--json", env=env)
        _until(lambda: not _in_squeue(job), 120, f"job {job} to end")
    assert _scratch(job) == []
