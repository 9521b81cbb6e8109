"""The launcher's operations as a library (what the commands of ``ddslurm`` call, without Typer): the dry run, the
refreshes of ``status --watch`` and ``wait``, finding and listing runs, the report page, and the commands run in a
process group of their own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

import ddslurm.launcher as launcher
from ddslurm.config import RunLayout
from ddslurm.launcher import (
    Completed,
    LauncherError,
    ListedRun,
    RunStatus,
    SchedulerBusy,
    Slurm,
    SlurmError,
    WaitTimeout,
    dry_run,
    follow_run,
    list_runs,
    open_run,
    release,
    submit,
    wait_for_run,
)
from ddslurm.launcher.cluster._process import Stopped, run_in_group
from ddslurm.launcher.runs import _follow as follow_module
from ddslurm.launcher.runs._find import save_report
from ddslurm.launcher.submission import _dry_run as dry_run_module
from ddslurm.launcher.testing import (
    FakeSlurm,
    InProcessHost,
    accept_every_recipe,
    wait_ended,
    write_unit_run,
)

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

KEY = "sk-services-test-0000"


@pytest.fixture
def _no_recipe_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data Designer's own validation of the recipe (a subprocess of seconds) is tested elsewhere."""
    accept_every_recipe(monkeypatch)


def test_every_name_the_package_exports_is_there() -> None:
    missing = [name for name in launcher.__all__ if not hasattr(launcher, name)]
    assert missing == []


# --- the dry run ---


class NoScheduler:
    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        raise SlurmError(list(argv), 127, f"{argv[0]}: command not found (is Slurm installed and on PATH?)")


@pytest.mark.usefixtures("_no_recipe_check")
def test_a_dry_run_returns_the_arrays_the_bill_and_the_script_and_writes_nothing(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY, shards=3)
    done = dry_run(run, profile, slurm=Slurm(NoScheduler(), user="alice"), host=HOST, env=env)
    assert [a.array for a in done.planned.arrays] == ["0-2"]
    assert done.planned.limits.max_array_size == dry_run_module.DEFAULT_MAX_ARRAY_SIZE
    assert "scheduler limits not read (scontrol failed (exit 127)" in done.planned.limits.notes[0]
    assert done.bill.shards == 3 and done.plan.num_records == 10
    assert done.script.startswith("#!") and "#SBATCH" in done.script
    assert done.layout.root.name.startswith("unit-") and not (tmp_path / "work").exists()


# --- following a run ---


def _status(state: Any) -> RunStatus:
    return RunStatus(run_id="r", run_dir="/r", state=state, shards=[], records_requested=1, records_done=0)


def _scripted(monkeypatch: pytest.MonkeyPatch, answers: list[str | Exception]) -> None:
    """``run_status`` answers ``answers`` in turn (a state, or an error to raise)."""
    queue: Iterator[str | Exception] = iter(answers)

    def scripted(layout: RunLayout, slurm: Slurm) -> RunStatus:
        answer = next(queue)
        if isinstance(answer, Exception):
            raise answer
        return _status(answer)

    monkeypatch.setattr(follow_module, "run_status", scripted)


def test_follow_backs_off_while_the_scheduler_is_busy_and_stops_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = SlurmError(["squeue"], 1, "slurm_load_jobs error: Socket timed out")
    _scripted(monkeypatch, ["pending", busy, busy, "running", "running", "running", "succeeded", "never read"])
    sleeps: list[float] = []
    seen = list(follow_run(RunLayout(Path("/r")), Slurm(FakeSlurm()), every=1.0, grow=2.0, sleep=sleeps.append))
    assert [s.state if isinstance(s, RunStatus) else f"busy {s.retry_in:g}" for s in seen] == [
        "pending", "busy 2", "busy 4", "running", "running", "running", "succeeded",
    ]  # fmt: skip
    assert isinstance(seen[1], SchedulerBusy) and seen[1].error is busy
    assert sleeps == [1.0, 2.0, 4.0, 2.0, 4.0, 5.0]  # the back-off starts over; growing waits stop at 5 s


def test_wait_gives_up_after_its_timeout_with_the_last_status(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, ["running"] * 10)
    ticks = iter(range(100))
    updates: list[RunStatus | SchedulerBusy] = []
    follow = follow_run(
        RunLayout(Path("/r")), Slurm(FakeSlurm()), timeout=2.5, sleep=lambda _: None, clock=lambda: next(ticks)
    )
    with pytest.raises(WaitTimeout, match=r"^run still running after 2 s$") as raised:
        updates.extend(follow)
    assert raised.value.status is not None and raised.value.status.state == "running"
    assert len(updates) == 3  # clock 1, 2, 3: the third is past 2.5 s


def test_wait_for_run_returns_the_terminal_status(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, ["running", "failed"])
    updates: list[RunStatus | SchedulerBusy] = []
    st = wait_for_run(RunLayout(Path("/r")), Slurm(FakeSlurm()), sleep=lambda _: None, on_update=updates.append)
    assert st.state == "failed" and [u.state for u in updates if isinstance(u, RunStatus)] == ["running", "failed"]


def test_release_says_a_scheduler_that_fails_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(layout: RunLayout, slurm: Slurm, status: RunStatus) -> tuple[str, ...]:
        raise SlurmError(["squeue"], 1, "slurm_load_jobs error")

    monkeypatch.setattr(follow_module, "release_leftovers", broken)
    released = release(RunLayout(Path("/r")), Slurm(FakeSlurm()), _status("succeeded"))
    assert released.tasks == () and released.error is not None and "squeue failed" in str(released.error)


# --- finding and listing runs, the report page ---


@pytest.mark.usefixtures("_no_recipe_check")
def test_runs_are_found_by_id_and_listed_as_list_shows_them(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY, shards=2)
    done = submit(run, profile, slurm=Slurm(FakeSlurm()), host=HOST, env=env)
    env = {**env, "DDSLURM_PROFILE": str(profile)}
    assert open_run(done.layout.run_id, env).root == done.layout.root
    [listed] = list_runs(tmp_path / "work", Slurm(FakeSlurm()))
    assert isinstance(listed, ListedRun) and (listed.run_id, listed.records, listed.records_done) == (
        done.layout.run_id, 10, 0,
    )  # fmt: skip
    assert list(msgspec.to_builtins(listed)) == [
        "run_id", "name", "state", "records", "records_done", "submitted_at", "created", "run_dir",
    ]  # fmt: skip


def test_the_report_page_goes_to_the_run_directory_or_says_where_it_could_not(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    assert save_report(layout, "<html></html>") == layout.root / "report.html"
    assert (layout.root / "report.html").read_text() == "<html></html>"
    with pytest.raises(LauncherError, match=r"/missing/page.html: cannot write the report: "):
        save_report(layout, "<html></html>", tmp_path / "missing" / "page.html")


# --- commands in a process group of their own ---


def test_a_command_gets_its_input_and_gives_its_output() -> None:
    done = run_in_group(["sh", "-c", "cat; echo done >&2; exit 3"], input="in", timeout_s=10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "in", "done\n")


def test_a_command_past_its_timeout_is_stopped_with_everything_it_started(tmp_path: Path) -> None:
    """The command prints, then starts a child that holds the pipes and waits for it: the timeout stops it with what
    it printed, and the child too. What is asserted is judged once the command got that far (its pid file, renamed
    into place after the print, says so): on a machine too busy to start a shell within the timeout (one beside a
    CPU-bound process did not within 0.5 s), the timeout doubles, up to 32 s."""
    pid_file = tmp_path / "child.pid"
    script = f"echo started >&2; sleep 300 & echo $! > {pid_file}.new && mv {pid_file}.new {pid_file}; wait"
    timeout = 0.5
    while True:
        with pytest.raises(Stopped) as stopped:
            run_in_group(["sh", "-c", script], timeout_s=timeout)
        if pid_file.exists() or timeout >= 32:
            break
        timeout *= 2
    assert pid_file.exists(), f"the command did not start its child within {timeout} s"
    assert stopped.value.stderr == "started\n"
    assert wait_ended(int(pid_file.read_text())), "the backgrounded sleep (it holds the pipes) was not killed"
