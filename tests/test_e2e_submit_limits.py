"""Submitting within the cluster's limits, on the local Slurm cluster (``MaxJobCount`` 10,000, ``MaxArraySize``
1,001): a run whose array tasks exceed MaxJobCount is refused with the numbers and leaves nothing; a run that fits
is submitted as exactly the arrays its dry run shows; a submission interrupted part-way (an sbatch that fails, or
one that hangs after Slurm took the job) is completed by ``submit --continue`` with every planned array submitted
exactly once, or cancelled by ``cancel``; and the association and QOS limits are read from the real ``sacctmgr``.

The generation jobs are held with ``--begin`` an hour ahead and cancelled by each test, so nothing runs. The only
accounting change is a QOS of the test's own (random name), deleted afterwards: no limit of root's association,
which the other tests submit under, is touched.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import SubmitPlanRecord, read_json
from ddslurm.launcher import Slurm
from tests.e2e import held_run, sbatch_wrapper, slurm, submissions
from tests.e2e import run_cli as _cli

pytestmark = [pytest.mark.slurm]


def _queued_arrays(run_dir: Path) -> dict[str, tuple[str, int]]:
    """Every job in the queue submitted from a batch script of ``run_dir``: array job id → (script, tasks)."""
    out: dict[str, tuple[str, int]] = {}
    for line in slurm("squeue", "-h", "-r", "-o", "%F|%o", check=True).splitlines():
        job, _, script = line.partition("|")
        if script.startswith(f"{run_dir}/"):
            prev = out.get(job, (script, 0))
            out[job] = (script, prev[1] + 1)
    return out


def _run_dir(files_root: Path) -> Path:
    (root,) = (files_root / "work" / "runs").iterdir()
    return root


def _cancel(run_dir: Path, env: dict[str, str]) -> None:
    if (run_dir / "run.json").is_file():
        _cli("cancel", str(run_dir), env=env)
    ids = [r.array_job_id for r in submissions(run_dir)] + list(_queued_arrays(run_dir))
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)


def _assert_every_planned_array_queued_once(run_dir: Path) -> None:
    """The plan's arrays, the submission records and the queue agree one to one: each planned array was
    submitted exactly once, with its shards as its tasks."""
    plan = read_json(run_dir / "submit-plan.json", SubmitPlanRecord)
    records = submissions(run_dir)
    assert sorted(r.plan_index for r in records if r.plan_index is not None) == [a.index for a in plan.arrays]
    queued = _queued_arrays(run_dir)
    assert sorted(queued, key=int) == [r.array_job_id for r in records], (queued, records)
    by_script = {script: job for job, (script, _) in queued.items()}
    assert len(by_script) == len(queued)  # no script submitted twice
    job_of = {r.plan_index: r.array_job_id for r in records}
    for array in plan.arrays:
        job = job_of[array.index]
        assert by_script[array.script] == job and queued[job][1] == len(array.shards)
        if array.after is not None:
            dependency = re.search(r"Dependency=(\S+)", slurm("scontrol", "show", "job", f"{job}_0", check=True))
            assert dependency is not None and dependency.group(1).startswith(f"afternotok:{job_of[array.after]}")


@pytest.fixture
def cleanup() -> Iterator[list[tuple[Path, dict[str, str]]]]:
    runs: list[tuple[Path, dict[str, str]]] = []
    yield runs
    for root, env in runs:
        for run_dir in (root / "work" / "runs").glob("*"):
            _cancel(run_dir, env)


# --- refused with the numbers, nothing written ---


def test_a_run_over_max_job_count_is_refused_with_the_numbers_and_leaves_nothing(tmp_path: Path) -> None:
    run, profile, env = held_run(tmp_path / "big", shards=10000)
    pattern = re.compile(
        r"^error: 10,000 shards = 10,000 array tasks, but MaxJobCount is 10,000 with (?P<queued>[\d,]+) already "
        r"queued \(90 % headroom rule: (?P<usable>[\d,]+) usable\); use fewer shards \(at most (?P=usable) shards "
        r"fit\), or keep the shards and set allocations: (?P=usable) \(each allocation pulls several shards\)$"
    )
    for extra in ([], ["--dry-run"]):
        done = _cli("submit", str(run), "--profile", str(profile), *extra, env=env)
        assert done.returncode == 2 and done.stdout == "", done
        match = pattern.match(done.stderr.strip())
        assert match is not None, done.stderr
        queued = int(match["queued"].replace(",", ""))
        assert int(match["usable"].replace(",", "")) == math.floor(0.9 * (10000 - queued))
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "big" / "work").exists()


# --- a run that fits: exactly the dry run's arrays ---


def test_the_dry_run_splits_arrays_at_max_array_size(tmp_path: Path) -> None:
    run, profile, env = held_run(tmp_path / "split", shards=1002, extra="max_concurrent: 4\n")
    dry = _cli("submit", str(run), "--profile", str(profile), "--dry-run", "--json", env=env)
    if dry.returncode == 2:  # the cluster is busy (other runs' 1,000s of tasks): refused, with numbers that say so
        match = re.search(r"headroom rule: ([\d,]+) usable", dry.stderr)
        assert match is not None and int(match[1].replace(",", "")) < 1002, dry.stderr
        return
    assert dry.returncode == 0, dry.stderr
    # MaxArraySize 1,001 splits the 1,002 shards
    assert [(a["kind"], a["array"], a["shards"], a["after"]) for a in json.loads(dry.stdout)["arrays"]] == [
        ("initial", "0-1000%4", "0-1000", None),
        ("initial", "0%4", "1001", None),
    ]
    limits = json.loads(dry.stdout)["limits"]
    assert limits["max_array_size"] == 1001 and [c["name"] for c in limits["checked"]] == ["MaxJobCount"]
    shown = _cli("submit", str(run), "--profile", str(profile), "--dry-run", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "# 2 sbatch call(s), 1,002 array task(s) (MaxArraySize 1,001):" in shown.stdout
    assert re.search(r"\n#   array 1: --array=0%4 +shards 1001 \(initial\)\n", shown.stdout), shown.stdout
    assert not (tmp_path / "split" / "work").exists()


def test_a_run_that_fits_is_submitted_as_exactly_the_arrays_of_its_dry_run(
    tmp_path: Path, cleanup: list[tuple[Path, dict[str, str]]]
) -> None:
    root = tmp_path / "fits"
    run, profile, env = held_run(root, shards=3, extra="retries: 2\nmax_concurrent: 2\n")
    cleanup.append((root, env))
    dry = _cli("submit", str(run), "--profile", str(profile), "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    planned: list[dict[str, Any]] = json.loads(dry.stdout)["arrays"]
    assert [(a["kind"], a["array"], a["shards"], a["after"]) for a in planned] == [
        ("initial", "0-2%2", "0-2", None),
        ("auto-retry", "0-2%2", "0-2", 0),
        ("auto-retry", "0-2%2", "0-2", 1),
    ]
    assert not (root / "work").exists()
    done = _cli("submit", str(run), "--profile", str(profile), "--json", env=env)
    assert done.returncode == 0, done.stderr
    run_dir = Path(json.loads(done.stdout)["run_dir"])
    plan = read_json(run_dir / "submit-plan.json", SubmitPlanRecord)
    assert [(a.kind, a.array, a.after) for a in plan.arrays] == [(a["kind"], a["array"], a["after"]) for a in planned]
    _assert_every_planned_array_queued_once(run_dir)
    for record, array in zip(submissions(run_dir), planned, strict=True):
        assert f"#SBATCH --array={array['array']}\n" in Path(record.script).read_text()


# --- interrupted part-way: continue submits the rest, each planned array exactly once ---


def test_a_submission_whose_second_sbatch_fails_is_completed_by_continue(
    tmp_path: Path, cleanup: list[tuple[Path, dict[str, str]]]
) -> None:
    root = tmp_path / "interrupted"
    run, profile, env = held_run(root, shards=3, extra="retries: 2\n")
    cleanup.append((root, env))
    failing = sbatch_wrapper(tmp_path, 2, 'echo "sbatch: error: Batch job submission failed: injected" >&2; exit 1')
    done = _cli("submit", str(run), "--profile", str(profile), env={**env, "PATH": f"{failing}:{env['PATH']}"})
    run_dir = _run_dir(root)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: the submission of run {run_dir.name} stopped after 1 of 3 array(s): ")
    assert "sbatch failed (exit 1): sbatch: error: Batch job submission failed: injected" in done.stderr
    (first,) = submissions(run_dir)
    assert f"  submitted:     array job {first.array_job_id}: shards 0-2 (3 tasks)\n" in done.stderr
    assert "  not submitted: shards 0-2 (3 tasks, automatic retry)\n" in done.stderr
    assert f"ddslurm submit --continue {run_dir}\n" in done.stderr and f"ddslurm cancel {run_dir}\n" in done.stderr
    assert list(_queued_arrays(run_dir)) == [first.array_job_id]

    status = json.loads(_cli("status", str(run_dir), "--json", env=env).stdout)
    assert status["state"] == "incomplete" and status["submission_incomplete"] and status["unsubmitted_arrays"] == 2

    cont = _cli("submit", "--continue", str(run_dir), env=env)
    assert cont.returncode == 0, cont.stderr
    _assert_every_planned_array_queued_once(run_dir)
    status = json.loads(_cli("status", str(run_dir), "--json", env=env).stdout)
    assert not status["submission_incomplete"] and status["state"] != "incomplete"
    assert _cli("submit", "--continue", str(run_dir), env=env).stdout.startswith("nothing to submit")


def test_an_sbatch_that_hangs_after_slurm_took_the_job_is_not_submitted_twice(
    tmp_path: Path, cleanup: list[tuple[Path, dict[str, str]]]
) -> None:
    root = tmp_path / "hung"
    run, profile, env = held_run(root, shards=3, extra="retries: 2\n")
    cleanup.append((root, env))
    real = shutil.which("sbatch")
    hanging = sbatch_wrapper(tmp_path, 1, f'{real} "$@"; sleep 600')  # Slurm gets the array, sbatch never returns
    wrapped = {**env, "PATH": f"{hanging}:{env['PATH']}", "DDSLURM_SLURM_TIMEOUT": "5"}
    done = _cli("submit", str(run), "--profile", str(profile), env=wrapped, timeout=120)
    run_dir = _run_dir(root)  # kept: the sbatch may have reached Slurm
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "sbatch did not answer within 5 s and was stopped" in done.stderr
    assert "may have reached Slurm before it was stopped" in done.stderr
    assert submissions(run_dir) == [] and len(_queued_arrays(run_dir)) == 1  # queued, but not recorded

    status = json.loads(_cli("status", str(run_dir), "--json", env=env).stdout)
    assert status["state"] == "incomplete" and [s["state"] for s in status["shards"]] == ["unsubmitted"] * 3

    cont = _cli("submit", "--continue", str(run_dir), "--json", env=env)
    assert cont.returncode == 0, cont.stderr
    out = json.loads(cont.stdout)
    # the array Slurm took is found in the queue by its batch script and recorded, not submitted again
    assert out["adopted"] == list(_queued_arrays(run_dir))[:1] and len(out["job_ids"]) == 2
    _assert_every_planned_array_queued_once(run_dir)


def test_a_half_submitted_run_is_cancelled_with_one_command(
    tmp_path: Path, cleanup: list[tuple[Path, dict[str, str]]]
) -> None:
    root = tmp_path / "cancelled"
    run, profile, env = held_run(root, shards=3, extra="retries: 2\n")
    cleanup.append((root, env))
    failing = sbatch_wrapper(tmp_path, 2, 'echo "sbatch: error: injected" >&2; exit 1')
    done = _cli("submit", str(run), "--profile", str(profile), env={**env, "PATH": f"{failing}:{env['PATH']}"})
    run_dir = _run_dir(root)
    assert done.returncode == 1 and len(_queued_arrays(run_dir)) == 1, done.stderr
    cancelled = _cli("cancel", str(run_dir), "--json", env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["cancelled"] == [r.array_job_id for r in submissions(run_dir)]
    assert _queued_arrays(run_dir) == {}
    refused = _cli("submit", "--continue", str(run_dir), env=env)
    assert refused.returncode == 2 and "--resume-cancelled" in refused.stderr  # refused: nothing submitted
    assert len(submissions(run_dir)) == 1 and _queued_arrays(run_dir) == {}


# --- association and QOS limits as the real sacctmgr prints them ---


def test_association_and_qos_limits_are_read_from_sacctmgr() -> None:
    name = f"ddslurm-e2e-{secrets.token_hex(3)}"
    add = subprocess.run(
        ["sacctmgr", "-i", "add", "qos", name, "MaxSubmitJobsPerUser=7", "GrpSubmitJobs=11", "MaxJobsPerUser=3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert add.returncode == 0, add.stderr
    try:
        slurm = Slurm()
        qos = slurm.qos(name)
        assert qos is not None
        assert (qos.max_submit_per_user, qos.max_submit_per_account, qos.grp_submit_jobs, qos.max_jobs_per_user) == (
            7,
            None,
            11,
            3,
        )
        assert slurm.qos(f"{name}-missing") is None
        user = slurm.user()
        rows = slurm.associations(user, slurm.config().cluster_name)
        assert rows and all(r.user == user for r in rows)
        # nothing set on the test user's association: no limit, not 0
        assert all(r.max_submit_jobs is None and r.grp_submit_jobs is None for r in rows)
    finally:
        subprocess.run(["sacctmgr", "-i", "delete", "qos", name], capture_output=True, timeout=60, check=False)
