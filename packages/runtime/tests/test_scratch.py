"""Node hygiene: the scratch directory's name and place, its removal on every exit path that runs code, and the
sweep of stale ones (pid, job and clock checks injected)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from ddslurm.runtime._scratch import (
    MARKER,
    PREFIX,
    JobQueryError,
    ScratchMarker,
    SqueueJobs,
    Sweeper,
    create_scratch,
    pid_alive,
    process_start_time,
    remove_scratch,
    scratch_base,
    scratch_directory,
    scratch_owner,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
UID = os.getuid()
HOST = "node-a"


def owner(
    *, job: str | None = "100", pid: int = 4242, uid: int = UID, host: str = HOST, step: str = "0"
) -> ScratchMarker:
    env = {"SLURMD_NODENAME": "n1", **({"SLURM_JOB_ID": job, "SLURM_STEP_ID": step} if job else {})}
    return scratch_owner(env, f"attempt-{job or 'x'}", uid=uid, user="alice", pid=pid, pid_start=7, host=host, now=NOW)


class Jobs:
    """A job checker that records its calls; ``running`` lists jobs still queued or running."""

    def __init__(self, running: Sequence[str] = (), fail: bool = False) -> None:
        self.running = frozenset(running)
        self.fail = fail
        self.calls: list[list[str]] = []

    def __call__(self, job_ids: Sequence[str]) -> frozenset[str]:
        self.calls.append(list(job_ids))
        if self.fail:
            raise JobQueryError("squeue exited 1: slurm_load_jobs error: Unable to contact slurm controller")
        return self.running & set(job_ids)


def sweeper(
    *, alive: set[int] = frozenset(), jobs: Jobs | None = None, uid: int = UID, job: str | None = "999"
) -> Sweeper:
    return Sweeper(
        uid=uid,
        host=HOST,
        job_id=job,
        pid_alive=lambda pid, _start: pid in alive,
        jobs_running=jobs or Jobs(),
        clock=lambda: NOW + timedelta(hours=1),
    )


# --- naming and placement -----------------------------------------------------------------------------------


def test_name_identifies_user_job_step_and_pid(tmp_path: Path) -> None:
    made = owner(job="4242", pid=777, step="3")
    path = create_scratch(tmp_path, made)
    assert path.parent == tmp_path
    assert path.name.startswith("ddslurm-scratch-alice-4242-3-777-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    marker = msgspec.json.decode((path / MARKER).read_bytes(), type=ScratchMarker)
    assert marker == made
    assert (marker.uid, marker.job_id, marker.step, marker.pid, marker.node) == (UID, "4242", "3", 777, "n1")
    assert stat.S_IMODE((path / MARKER).stat().st_mode) == 0o600


def test_name_outside_slurm_uses_the_attempt_and_keeps_parts_separable(tmp_path: Path) -> None:
    made = scratch_owner({}, "attempt-t1-r2", uid=UID, user="a-b c/d", pid=9, pid_start=None, host="h", now=NOW)
    assert (made.job_id, made.step, made.node) == (None, "local", "h")
    path = create_scratch(tmp_path, made)
    assert path.name.startswith("ddslurm-scratch-a_b_c_d-t1_r2-local-9-")
    assert len(path.name.removeprefix(PREFIX).split("-")) == 5  # user, job, step, pid, random


def test_base_is_the_jobs_own_temporary_directory_when_slurm_gives_one(tmp_path: Path) -> None:
    job_tmp, tmpdir = tmp_path / "job", tmp_path / "tmpdir"
    job_tmp.mkdir()
    tmpdir.mkdir()
    default = str(tmp_path)
    assert scratch_base({"SLURM_JOB_TMP": str(job_tmp), "TMPDIR": str(tmpdir)}, lambda: default) == job_tmp
    assert scratch_base({"TMPDIR": str(tmpdir)}, lambda: default) == tmpdir
    missing = str(tmp_path / "missing")
    assert scratch_base({"SLURM_JOB_TMP": missing, "TMPDIR": missing}, lambda: default) == tmp_path
    assert scratch_base({}, lambda: default) == tmp_path


# --- removal on every exit path -----------------------------------------------------------------------------


def test_removed_on_return_and_on_exception(tmp_path: Path) -> None:
    with scratch_directory(tmp_path, owner()) as path:
        (path / "dd-home" / "managed-assets").mkdir(parents=True)
        (path / "dd-home" / "x.yaml").write_text("x")
    assert not path.exists()
    with pytest.raises(RuntimeError), scratch_directory(tmp_path, owner()) as path:
        raise RuntimeError("boom")
    assert not path.exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


CHILD = """
import sys, time
from datetime import UTC, datetime
from pathlib import Path
from ddslurm.runtime._scratch import scratch_directory, scratch_owner
import os
now = datetime.now(UTC)
owner = scratch_owner({}, "attempt-sig", uid=os.getuid(), user="u", pid=1, pid_start=None, host="h", now=now)
with scratch_directory(Path(sys.argv[1]), owner) as path:
    (path / "dd-home").mkdir()
    print(path, flush=True)
    for _ in range(600):  # short sleeps: a signal delivered to another thread than the main one (an import may
        time.sleep(0.1)   # start one) runs its Python handler only once the main thread wakes
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1])
def test_a_terminating_signal_removes_it_and_still_ends_the_process_by_that_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    assert (path / "dd-home").is_dir()
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == -sig  # the same death as without the handler
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_sigkill_leaves_it_behind(tmp_path: Path) -> None:
    """What the sweep is for: nothing runs after SIGKILL."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait(timeout=30)
    assert (path / MARKER).is_file()


def test_a_signal_someone_else_handles_is_left_to_them(tmp_path: Path) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, _: seen.append(signum))
    try:
        with scratch_directory(tmp_path, owner(), signals=(signal.SIGUSR2,)) as path:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
            assert seen == [signal.SIGUSR2] and path.is_dir()
        assert not path.exists()
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_removal_follows_no_symbolic_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_text("keep")
    base = tmp_path / "base"
    base.mkdir()
    path = create_scratch(base, owner())
    (path / "link-dir").symlink_to(outside, target_is_directory=True)
    (path / "home").mkdir()
    (path / "home" / "link-file").symlink_to(outside / "keep.txt")
    assert remove_scratch(path)
    assert not path.exists()
    assert (outside / "keep.txt").read_text() == "keep" and (outside / "sub").is_dir()
    link = base / f"{PREFIX}link"
    link.symlink_to(outside, target_is_directory=True)
    assert not remove_scratch(link)
    assert link.is_symlink() and (outside / "keep.txt").exists()


# --- the sweep ----------------------------------------------------------------------------------------------


def test_a_live_creator_is_kept_without_asking_the_scheduler(tmp_path: Path) -> None:
    path = create_scratch(tmp_path, owner(pid=4242))
    jobs = Jobs()
    report = sweeper(alive={4242}, jobs=jobs).sweep(tmp_path)
    assert path.is_dir() and report.removed == ()
    assert "still runs" in report.kept[0].why
    assert jobs.calls == []


def test_a_dead_creator_whose_job_ended_is_swept(tmp_path: Path) -> None:
    path = create_scratch(tmp_path, owner(job="100", pid=4242))
    (path / "dd-home").mkdir()
    jobs = Jobs(running=())
    report = sweeper(jobs=jobs).sweep(tmp_path)
    assert report.removed == (path,) and not path.exists()
    assert jobs.calls == [["100"]]  # one query for every candidate
    assert report.entries[0].why == "creator pid 4242 gone and job 100 ended; made 3600 s ago"


def test_a_dead_creator_whose_job_still_runs_is_kept(tmp_path: Path) -> None:
    ended = create_scratch(tmp_path, owner(job="100", pid=1))
    running = create_scratch(tmp_path, owner(job="200", pid=2))
    jobs = Jobs(running=["200"])
    report = sweeper(jobs=jobs).sweep(tmp_path)
    assert report.removed == (ended,) and running.is_dir()
    assert jobs.calls == [["100", "200"]]
    assert [e.why for e in report.kept] == ["job 200 is still queued or running"]


def test_another_users_directory_is_kept(tmp_path: Path) -> None:
    path = create_scratch(tmp_path, owner(pid=1))
    report = sweeper(uid=UID + 1).sweep(tmp_path)  # the directory belongs to UID, not to the sweeping user
    assert path.is_dir() and report.removed == ()
    assert report.kept[0].why == f"owned by uid {UID}"
    claims_other = create_scratch(tmp_path, owner(pid=1, uid=UID + 1))  # our directory, marker names another uid
    report = sweeper().sweep(tmp_path)
    assert claims_other.is_dir() and any(e.why == f"marker names uid {UID + 1}" for e in report.kept)


def test_a_symbolic_link_is_not_followed(tmp_path: Path) -> None:
    base, elsewhere = tmp_path / "base", tmp_path / "elsewhere"
    base.mkdir()
    elsewhere.mkdir()
    target = create_scratch(elsewhere, owner(job="100", pid=1))  # a stale directory, but not in base
    link = base / f"{PREFIX}alice-100-0-1-link"
    link.symlink_to(target, target_is_directory=True)
    real = create_scratch(base, owner(job="100", pid=1))
    (real / MARKER).unlink()
    (real / MARKER).symlink_to(target / MARKER)  # a marker that is a link proves nothing
    report = sweeper(jobs=Jobs()).sweep(base)
    assert report.removed == ()
    assert link.is_symlink() and (target / MARKER).is_file() and real.is_dir()
    assert {e.why for e in report.kept} == {
        "a symbolic link (never followed)",
        "no readable marker: not known to be ddslurm's",
    }


def test_when_squeue_fails_nothing_is_swept(tmp_path: Path) -> None:
    job_dir = create_scratch(tmp_path, owner(job="100", pid=1))
    local_dir = create_scratch(tmp_path, owner(job=None, pid=2))  # stale without asking: still left
    jobs = Jobs(fail=True)
    report = sweeper(jobs=jobs).sweep(tmp_path)
    assert report.removed == () and job_dir.is_dir() and local_dir.is_dir()
    assert report.error is not None and "Unable to contact" in report.error
    assert jobs.calls == [["100"]]


def test_an_earlier_client_of_this_very_job_is_swept_without_asking(tmp_path: Path) -> None:
    path = create_scratch(tmp_path, owner(job="300", pid=1))
    jobs = Jobs(running=["300"])  # the job runs: it is this one
    report = sweeper(jobs=jobs, job="300").sweep(tmp_path)
    assert report.removed == (path,) and jobs.calls == []


def test_outside_slurm_only_the_pid_decides_and_only_on_its_own_host(tmp_path: Path) -> None:
    here = create_scratch(tmp_path, owner(job=None, pid=1))
    there = create_scratch(tmp_path, owner(job=None, pid=2, host="node-b"))
    jobs = Jobs()
    report = sweeper(jobs=jobs).sweep(tmp_path)
    assert report.removed == (here,) and there.is_dir() and jobs.calls == []
    assert report.kept[0].why == "made outside Slurm on another host (node-b)"


def test_a_directory_from_another_host_needs_its_job_ended(tmp_path: Path) -> None:
    """On a temporary directory shared between hosts the pid means nothing here: the job decides."""
    path = create_scratch(tmp_path, owner(job="100", pid=4242, host="node-b"))
    checked: list[int] = []

    def alive(pid: int, _: int | None) -> bool:
        checked.append(pid)
        return True

    swept = Sweeper(uid=UID, host=HOST, job_id=None, pid_alive=alive, jobs_running=Jobs(["100"]), clock=lambda: NOW)
    assert swept.sweep(tmp_path).removed == () and path.is_dir()
    swept = Sweeper(uid=UID, host=HOST, job_id=None, pid_alive=alive, jobs_running=Jobs(), clock=lambda: NOW)
    assert swept.sweep(tmp_path).removed == (path,)
    assert checked == []


def test_only_ddslurm_directories_are_considered(tmp_path: Path) -> None:
    other = tmp_path / "somebody-else"
    other.mkdir()
    legacy = tmp_path / "ddslurm-attempt-100-abcd1234"  # older versions' name: no marker, never guessed at
    legacy.mkdir()
    no_marker = tmp_path / f"{PREFIX}alice-100-0-1-abc"
    no_marker.mkdir()
    a_file = tmp_path / f"{PREFIX}file"
    a_file.write_text("x")
    garbled = create_scratch(tmp_path, owner(pid=1))
    (garbled / MARKER).write_text("{not json")
    report = sweeper(jobs=Jobs()).sweep(tmp_path)
    assert report.removed == ()
    assert other.is_dir() and legacy.is_dir() and no_marker.is_dir() and a_file.is_file() and garbled.is_dir()
    assert sorted(e.path.name for e in report.kept) == sorted([no_marker.name, a_file.name, garbled.name])


def test_an_interrupted_removal_keeps_the_marker_so_the_next_sweep_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = create_scratch(tmp_path, owner(pid=1, job=None))
    (path / "dd-home" / "deep").mkdir(parents=True)

    def refuse(*_: object, **__: object) -> None:
        raise PermissionError("cannot remove")

    with monkeypatch.context() as patch:
        patch.setattr("ddslurm.runtime._scratch.shutil.rmtree", refuse)
        report = sweeper().sweep(tmp_path)
    assert report.removed == () and (path / MARKER).is_file()
    assert report.kept[0].why.startswith("could not be removed (creator pid 1 gone")
    assert sweeper().sweep(tmp_path).removed == (path,) and not path.exists()


# --- the checks the node uses -------------------------------------------------------------------------------


def completed(rc: int, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], rc, out, err)


def test_squeue_is_asked_once_for_every_job() -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        assert kwargs["timeout"] == 10.0
        return completed(0, "101\n555\n")

    assert SqueueJobs(run=run)(["101", "100", "local-x"]) == {"101"}
    assert calls == [["squeue", "-h", "-r", "-j", "100,101", "-o", "%A"]]
    assert SqueueJobs(run=run)(["not-a-job"]) == frozenset() and len(calls) == 1


def test_squeue_answers_and_failures() -> None:
    def gone(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return completed(1, err="slurm_load_jobs error: Invalid job id specified\n")

    assert SqueueJobs(run=gone)(["7"]) == frozenset()  # purged from the controller long ago: ended

    def down(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return completed(1, err="slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n")

    def slow(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(argv, 10)

    def missing(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("squeue")

    for run, says in ((down, "Unable to contact"), (slow, "did not answer"), (missing, "could not run")):
        with pytest.raises(JobQueryError, match=says):
            SqueueJobs(run=run)(["7"])


def test_pid_alive_knows_live_dead_zombie_and_reused_pids() -> None:
    me = os.getpid()
    start = process_start_time(me)
    assert start is not None
    assert pid_alive(me, start) and pid_alive(me, None)
    assert not pid_alive(me, start + 1)  # the same number, another process
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] != "Z":
        time.sleep(0.05)
    assert not pid_alive(zombie.pid, None)  # exited, not yet reaped
    zombie.wait()
    assert not pid_alive(zombie.pid, None)
    assert not pid_alive(0, None) and not pid_alive(-1, None)
