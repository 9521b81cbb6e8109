"""Issue 17 on the local Slurm cluster, launcher side, where the behaviour is Slurm's own: a run with automatic
retries that succeeds at once starts no retry level (each level waits for the failure of every earlier one), and
``cancel`` of a run whose sbatch timed out after Slurm took the array cancels that array too.

Every wait is bounded; every run is the test's own and is cancelled at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import AttemptRecord, SubmissionRecord, read_json
from tests.e2e import run_cli as _cli
from tests.e2e import until as _until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

DDSLURM = str(Path(sys.executable).parent / "ddslurm")


def _json(*args: str, env: dict[str, str], timeout: float = 300) -> Any:
    done = _cli(*args, "--json", env=env, timeout=timeout)
    assert done.returncode == 0, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


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


def _queued_from(run_dir: Path) -> dict[str, str]:
    """Every job in the queue submitted from a batch script of ``run_dir`` (pending or running): job → script."""
    out = {}
    for line in _slurm("squeue", "-h", "-r", "-t", "PD,R,CG", "-o", "%F|%o").splitlines():
        job, _, script = line.partition("|")
        if script.startswith(f"{run_dir}/"):
            out[job] = script
    return out


def _cancel_quietly(run_dir: Path, env: dict[str, str]) -> None:
    if (run_dir / "run.json").is_file():
        _cli("cancel", str(run_dir), env=env)
    ids = [r.array_job_id for r in _records(run_dir)] + list(_queued_from(run_dir))
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


# --- item 9: cancel finds the array whose sbatch timed out after Slurm took it ---

HELD_RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}
  model_configs:
  - {alias: writer, model: m-1, provider: hosted, inference_parameters: {temperature: 0.3, max_parallel_requests: 2}}
"""


def _held_run(root: Path, *, shards: int, extra: str) -> tuple[Path, Path, dict[str, str]]:
    """A run whose jobs are held an hour (``--begin``: nothing runs), its profile and environment."""
    root.mkdir(parents=True)
    home = root / "dd"
    home.mkdir()
    (home / "model_providers.yaml").write_text(
        "providers:\n- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HELD_KEY}\n"
    )
    (root / "recipe.yaml").write_text(HELD_RECIPE)
    run = root / "run.yaml"
    run.write_text(
        f"name: held-{secrets.token_hex(3)}\nrecipe: recipe.yaml\nnum_records: {shards}\nshards: {shards}\n"
        "submission:\n  time_limit: '00:10:00'\n  cpus: 1\n  memory: 100M\n  extra_sbatch: ['--begin=now+1hour']\n"
        f"{extra}"
    )
    profile = root / "profile.yaml"
    repo = Path(__file__).resolve().parents[1]
    profile.write_text(
        f"workspace: {root / 'work'}\npython_env: {repo / '.venv'}\npartition: gpu\ncpu_partition: cpu\n"
    )
    env = {**os.environ, "DATA_DESIGNER_HOME": str(home), "HELD_KEY": "sk-held-e2e-" + "5" * 16}
    env.pop("DDSLURM_SLURM_TIMEOUT", None)
    return run, profile, env


def test_cancel_cancels_and_records_an_array_whose_sbatch_timed_out(tmp_path: Path) -> None:
    run, profile, env = _held_run(tmp_path / "hung", shards=2, extra="retries: 1\n")
    real = shutil.which("sbatch")
    assert real is not None
    wrapped_bin = tmp_path / "wrapped-bin"
    wrapped_bin.mkdir()
    count = tmp_path / "sbatch-calls"
    # the second sbatch (the automatic retry array) reaches Slurm, then never answers
    (wrapped_bin / "sbatch").write_text(
        "#!/bin/bash\n"
        f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
        f'if [ "$n" = 2 ]; then {real} "$@"; exec sleep 600; fi\n'
        f'exec {real} "$@"\n'
    )
    (wrapped_bin / "sbatch").chmod(0o755)
    hanging = {**env, "PATH": f"{wrapped_bin}:{env['PATH']}", "DDSLURM_SLURM_TIMEOUT": "5"}
    done = _cli("submit", str(run), "--profile", str(profile), env=hanging, timeout=120)
    (run_dir,) = (tmp_path / "hung" / "work" / "runs").iterdir()
    try:
        assert done.returncode == 1 and "may have reached Slurm before it was stopped" in done.stderr, done.stderr
        recorded = [r.array_job_id for r in _records(run_dir)]
        queued = _queued_from(run_dir)
        assert len(recorded) == 1 and len(queued) == 2, (recorded, queued)
        (stray,) = set(queued) - set(recorded)

        out = _json("cancel", str(run_dir), env=env)
        assert out["run_cancelled"] and out["adopted"] == [stray], out
        assert sorted(out["cancelled"], key=int) == sorted(queued, key=int)
        _until(lambda: _queued_from(run_dir) == {}, 60, "both arrays to leave the queue", lambda: _queued_from(run_dir))
        record = read_json(run_dir / "submissions" / f"{stray}.json", SubmissionRecord)
        assert (record.plan_index, record.kind, record.after) == (1, "auto-retry", recorded[0])
        status = _json("status", str(run_dir), env=env)
        assert status["state"] == "cancelled" and not status["submission_incomplete"], status
    finally:
        _cancel_quietly(run_dir, env)
