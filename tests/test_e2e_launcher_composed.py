"""Issue 17 on the local Slurm cluster, launcher side, where the behaviour is Slurm's own: a run with automatic
retries that succeeds at once starts no retry level (each level waits for the failure of every earlier one), and
``cancel`` of a run whose sbatch timed out after Slurm took the array cancels that array too.

Every wait is bounded; every run is the test's own and is cancelled at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import AttemptRecord, SubmissionRecord, read_json
from tests.e2e import cli_json, held_run, sbatch_wrapper, slurm, submissions
from tests.e2e import run_cli as _cli
from tests.e2e import until as _until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]


def _attempt_dirs(run_dir: Path, shard: int) -> list[Path]:
    return sorted(run_dir.glob(f"shards/shard-{shard:05d}/attempts/attempt-*"))


def _accounting(jobs: list[str]) -> dict[str, tuple[str, str]]:
    """sacct of the arrays' tasks: job id → (state, start time; ``None``/``Unknown`` for a job that never ran)."""
    rows = slurm("sacct", "-X", "-n", "--parsable2", "-j", ",".join(jobs), "--format=JobID,State,Start")
    out = {}
    for line in rows.splitlines():
        parts = line.split("|")
        if len(parts) == 3:
            out[parts[0]] = (parts[1], parts[2])
    return out


def _queued(jobs: list[str]) -> str:
    return slurm("squeue", "-h", "-r", "-j", ",".join(jobs), "-o", "%i %T").strip()


def _queued_from(run_dir: Path) -> dict[str, str]:
    """Every job in the queue submitted from a batch script of ``run_dir`` (pending or running): job → script."""
    out = {}
    for line in slurm("squeue", "-h", "-r", "-t", "PD,R,CG", "-o", "%F|%o").splitlines():
        job, _, script = line.partition("|")
        if script.startswith(f"{run_dir}/"):
            out[job] = script
    return out


def _cancel_quietly(run_dir: Path, env: dict[str, str]) -> None:
    if (run_dir / "run.json").is_file():
        _cli("cancel", str(run_dir), env=env)
    ids = [r.array_job_id for r in submissions(run_dir)] + list(_queued_from(run_dir))
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)


# --- item 7: no retry level runs when nothing failed ---


def test_a_run_that_succeeds_starts_none_of_its_automatic_retry_levels(make_run_files: Any) -> None:
    files = make_run_files("no-retry-runs", num_records=4, shards=2, buffer_size=2, extra_run="retries: 3\n")
    run_dir = Path(
        cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)["run_dir"]
    )
    try:
        records = submissions(run_dir)
        assert [r.kind for r in records] == ["initial", "auto-retry", "auto-retry", "auto-retry"]
        jobs = [r.array_job_id for r in records]
        final = cli_json("wait", str(run_dir), "--timeout", "240", "--json", env=files.env, timeout=300)
        assert final["state"] == "succeeded" and final["records_done"] == 4, json.dumps(final)[-3000:]
        # Slurm cancels every retry level whose dependency can no longer be met (--kill-on-invalid-dep=yes).
        _until(lambda: _queued(jobs[1:]) == "", 60, "the retry levels to leave the queue", lambda: _queued(jobs[1:]))
        # No level ever ran: each is CANCELLED without a start in the accounting below (a level released by the
        # cancellation of the one before it would have a start time or a task's attempt), not "gone for 3 s".
        for shard in range(2):  # one attempt each: no retry level ran a task (it would record `superseded`)
            dirs = _attempt_dirs(run_dir, shard)
            assert len(dirs) == 1, dirs
            assert read_json(dirs[0] / "attempt.json", AttemptRecord).state == "succeeded"
        seen = _until(lambda: _accounting(jobs[1:]), 60, "sacct to list the retry levels")
        for job, (state, start) in seen.items():
            assert state.startswith("CANCELLED") and start in {"None", "Unknown"}, (job, state, start)
        status = cli_json("status", str(run_dir), "--json", env=files.env)
        assert status["state"] == "succeeded" and status["counts"] == {"succeeded": 2}
    finally:
        _cancel_quietly(run_dir, files.env)


# --- item 9: cancel finds the array whose sbatch timed out after Slurm took it ---


def test_cancel_cancels_and_records_an_array_whose_sbatch_timed_out(tmp_path: Path) -> None:
    run, profile, env = held_run(tmp_path / "hung", shards=2, extra="retries: 1\n")
    # the second sbatch (the automatic retry array) reaches Slurm, then never answers
    wrapped_bin = sbatch_wrapper(tmp_path, 2, f'{shutil.which("sbatch")} "$@"; exec sleep 600')
    hanging = {**env, "PATH": f"{wrapped_bin}:{env['PATH']}", "DDSLURM_SLURM_TIMEOUT": "5"}
    done = _cli("submit", str(run), "--profile", str(profile), env=hanging, timeout=120)
    (run_dir,) = (tmp_path / "hung" / "work" / "runs").iterdir()
    try:
        assert done.returncode == 1 and "may have reached Slurm before it was stopped" in done.stderr, done.stderr
        recorded = [r.array_job_id for r in submissions(run_dir)]
        queued = _queued_from(run_dir)
        assert len(recorded) == 1 and len(queued) == 2, (recorded, queued)
        (stray,) = set(queued) - set(recorded)

        out = cli_json("cancel", str(run_dir), "--json", env=env)
        assert out["run_cancelled"] and out["adopted"] == [stray], out
        assert sorted(out["cancelled"], key=int) == sorted(queued, key=int)
        _until(lambda: _queued_from(run_dir) == {}, 60, "both arrays to leave the queue", lambda: _queued_from(run_dir))
        record = read_json(run_dir / "submissions" / f"{stray}.json", SubmissionRecord)
        assert (record.plan_index, record.kind, record.after) == (1, "auto-retry", recorded[0])
        status = cli_json("status", str(run_dir), "--json", env=env)
        assert status["state"] == "cancelled" and not status["submission_incomplete"], status
    finally:
        _cancel_quietly(run_dir, env)
