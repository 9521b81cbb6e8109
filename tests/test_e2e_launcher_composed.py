"""Issue 17 on the local Slurm cluster, launcher side, where the behaviour is Slurm's own: a run with automatic
retries that succeeds at once starts no retry level (each level waits for the failure of every earlier one), and
``cancel`` of a run whose sbatch timed out after Slurm took the array cancels that array too.

Every wait is bounded; every run is the test's own and is cancelled at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import AttemptRecord, SubmissionRecord, read_json

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

DDSLURM = str(Path(sys.executable).parent / "ddslurm")


def _cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DDSLURM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def _json(*args: str, env: dict[str, str], timeout: float = 300) -> Any:
    done = _cli(*args, "--json", env=env, timeout=timeout)
    assert done.returncode == 0, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def _until(predicate: Callable[[], Any], timeout: float, what: str, show: Callable[[], Any] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}" + (f"; last seen: {show()}" if show else ""))


def _slurm(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False).stdout


def _records(run_dir: Path) -> list[SubmissionRecord]:
    return sorted(
        (read_json(p, SubmissionRecord) for p in run_dir.glob("submissions/*.json")), key=lambda r: int(r.array_job_id)
    )


def _attempt_dirs(run_dir: Path, shard: int) -> list[Path]:
    return sorted(run_dir.glob(f"shards/shard-{shard:05d}/attempts/attempt-*"))


def _accounting(jobs: list[str]) -> dict[str, tuple[str, str]]:
    """sacct of the arrays' tasks: job id → (state, start time; ``None``/``Unknown`` for a job that never ran)."""
    rows = _slurm("sacct", "-X", "-n", "--parsable2", "-j", ",".join(jobs), "--format=JobID,State,Start")
    out = {}
    for line in rows.splitlines():
        parts = line.split("|")
        if len(parts) == 3:
            out[parts[0]] = (parts[1], parts[2])
    return out


def _queued(jobs: list[str]) -> str:
    return _slurm("squeue", "-h", "-r", "-j", ",".join(jobs), "-o", "%i %T").strip()


def _cancel_quietly(run_dir: Path, env: dict[str, str]) -> None:
    if (run_dir / "run.json").is_file():
        _cli("cancel", str(run_dir), env=env)
    ids = [r.array_job_id for r in _records(run_dir)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)


# --- item 7: no retry level runs when nothing failed ---


def test_a_run_that_succeeds_starts_none_of_its_automatic_retry_levels(make_run_files: Any) -> None:
    files = make_run_files("no-retry-runs", num_records=4, shards=2, buffer_size=2, extra_run="retries: 3\n")
    run_dir = Path(_json("submit", str(files.run_file), "--profile", str(files.profile), env=files.env)["run_dir"])
    try:
        records = _records(run_dir)
        assert [r.kind for r in records] == ["initial", "auto-retry", "auto-retry", "auto-retry"]
        jobs = [r.array_job_id for r in records]
        final = _json("wait", str(run_dir), "--timeout", "240", env=files.env, timeout=300)
        assert final["state"] == "succeeded" and final["records_done"] == 4, json.dumps(final)[-3000:]
        # Slurm cancels every retry level whose dependency can no longer be met (--kill-on-invalid-dep=yes).
        _until(lambda: _queued(jobs[1:]) == "", 60, "the retry levels to leave the queue", lambda: _queued(jobs[1:]))
        time.sleep(3)  # a level released by the cancellation of the one before it would be running by now
        assert _queued(jobs[1:]) == ""
        for shard in range(2):  # one attempt each: no retry level ran a task (it would record `superseded`)
            dirs = _attempt_dirs(run_dir, shard)
            assert len(dirs) == 1, dirs
            assert read_json(dirs[0] / "attempt.json", AttemptRecord).state == "succeeded"
        seen = _until(lambda: _accounting(jobs[1:]), 60, "sacct to list the retry levels")
        for job, (state, start) in seen.items():
            assert state.startswith("CANCELLED") and start in {"None", "Unknown"}, (job, state, start)
        status = _json("status", str(run_dir), env=files.env)
        assert status["state"] == "succeeded" and status["counts"] == {"succeeded": 2}
    finally:
        _cancel_quietly(run_dir, files.env)
