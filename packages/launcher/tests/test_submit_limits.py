"""Submitting within the scheduler's limits, with a fake Slurm: the limits read before anything is written (and
the arithmetic of the headroom rule), refusals with the numbers, a dry run that shows exactly the arrays the
submission makes, a submission that stops part-way (an sbatch error or timeout on the k-th array), the status of
such a run, ``submit --continue`` and ``cancel`` of it, and the timeout of every scheduler command."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from ddslurm.config import (
    CancelRecord,
    Limit,
    RunLayout,
    SubmissionRecord,
    SubmitPlanRecord,
    WinnerRecord,
    compact_ranges,
    encode,
    publish_once,
    read_json,
)
from ddslurm.launcher import Completed, LauncherError, Slurm, SlurmError, SubmitError, cli, run_status, submit
from ddslurm.launcher.cluster._slurm import SlurmTimeoutError, SubprocessRunner, parse_limit
from ddslurm.launcher.runs._steer import continue_submission, retry
from ddslurm.launcher.submission._arrays import PartialSubmitError, submit_lock
from ddslurm.launcher.testing import InProcessHost, accept_every_recipe, wait_ended, write_unit_run

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

KEY = "sk-limits-test-value-123"
CONFIG = "ClusterName = local\nMaxArraySize = {array}\nMaxJobCount = {count}\nAccountingStorageEnforce = {enforce}\n"


class FakeCluster:
    """Answers scontrol, squeue, sacct, sacctmgr, sbatch and scancel like Slurm would and records every call.

    ``queued``: jobs of other users slurmctld holds before anything is submitted. ``sbatch_faults``: what the
    n-th sbatch call (1-based) does instead of submitting: ``error`` (rc 1), ``timeout`` (the runner's
    :class:`SlurmTimeoutError`, nothing submitted), ``timeout-submitted`` (Slurm got the job, then the runner
    timed out), ``cancel`` (submits, while a ``ddslurm cancel`` writes the run's cancel record)."""

    def __init__(
        self,
        *,
        max_array: int = 1001,
        max_jobs: int = 10000,
        enforce: str = "none",
        queued: int = 0,
        sbatch_faults: Mapping[int, str] | None = None,
        assoc: str = "",
        account_row: str = "",
        qos: str = "",
    ) -> None:
        self.config = CONFIG.format(array=max_array, count=max_jobs, enforce=enforce)
        self.calls: list[list[str]] = []
        self.queued = [f"{900 + i}|bob|other|normal|PENDING|/home/bob/job.sh" for i in range(queued)]
        self.faults = dict(sbatch_faults or {})
        self.assoc, self.account_row, self.qos = assoc, account_row, qos
        self.jobs: list[tuple[str, str, int]] = []  # (array job id, script, tasks)
        self.sbatches = 0
        self.next_id = 4242
        self.on_cancel: Callable[[], None] = lambda: None

    def commands(self, name: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == name]

    def _submit(self, script: str) -> str:
        text = Path(script).read_text()
        spec = re.search(r"^#SBATCH --array=([^\s%]+)", text, re.MULTILINE)
        assert spec is not None
        lo, _, hi = spec.group(1).partition("-")
        job = str(self.next_id)
        self.next_id += 1
        self.jobs.append((job, script, int(hi or lo) - int(lo) + 1))
        return job

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        args = list(argv)
        self.calls.append(args)
        if args[0] == "scontrol":
            return Completed(0, self.config, "")
        if args[0] == "sinfo":  # the profile's checks (ddslurm doctor's): no node shown, so they are skipped
            return Completed(0, "", "")
        if args[0] == "squeue" and "-t" in args:  # the whole queue (limits, and finding submitted arrays)
            mine = [f"{job}|alice|acct|normal|PENDING|{script}" for job, script, n in self.jobs for _ in range(n)]
            return Completed(0, "".join(f"{line}\n" for line in [*self.queued, *mine]), "")
        if args[0] in {"squeue", "sacct", "scancel"}:
            return Completed(0, "", "")
        if args[0] == "sacctmgr":
            what = args[3]
            if what == "assoc":
                return Completed(0, self.account_row if any(a == "account=acct" for a in args) else self.assoc, "")
            if what == "user":
                return Completed(0, "acct\n", "")
            return Completed(0, self.qos, "")
        if args[0] == "sbatch":
            self.sbatches += 1
            fault = self.faults.get(self.sbatches, "")
            if fault == "error":
                return Completed(1, "", "sbatch: error: Batch job submission failed: Socket timed out on send/recv")
            if fault == "timeout":
                raise SlurmTimeoutError(args, 120.0)
            job = self._submit(args[-1])
            if fault == "timeout-submitted":
                raise SlurmTimeoutError(args, 120.0)
            if fault == "cancel":
                self.on_cancel()
            return Completed(0, f"{job}\n", "")
        raise AssertionError(f"unexpected command {args}")


def _files(tmp_path: Path, *, shards: int = 3, run_extra: str = "") -> tuple[Path, Path, dict[str, str]]:
    return write_unit_run(tmp_path, KEY, name="lim", num_records=max(10, shards), shards=shards, run_extra=run_extra)


@pytest.fixture(autouse=True)
def _no_data_designer_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data Designer's own validation of the recipe (a subprocess of seconds) is tested elsewhere."""
    accept_every_recipe(monkeypatch)


def _cli(argv: list[str], cluster: FakeCluster, env: dict[str, str]) -> tuple[int, str, str]:
    """``ddslurm <argv>`` against the fake cluster: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, env=env, slurm=Slurm(cluster, env=env, user="alice"), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _records(layout: RunLayout) -> list[SubmissionRecord]:
    return sorted(
        (read_json(p, SubmissionRecord) for p in layout.submissions.glob("*.json")), key=lambda r: int(r.array_job_id)
    )


def _run_dir(tmp_path: Path) -> RunLayout:
    (root,) = (tmp_path / "work" / "runs").iterdir()
    return RunLayout(root)


def _stopped(
    tmp_path: Path, cluster: FakeCluster, *, shards: int, run_extra: str = ""
) -> tuple[RunLayout, dict[str, str]]:
    """A run whose submission to ``cluster`` stopped part-way (an sbatch fault of the cluster's), and its
    environment."""
    run, profile, env = _files(tmp_path, shards=shards, run_extra=run_extra)
    with pytest.raises(PartialSubmitError):
        submit(run, profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env)
    return _run_dir(tmp_path), env


# --- the limits and their arithmetic ---


@pytest.mark.parametrize(
    ("limit", "used", "usable"),
    [
        pytest.param(10000, 120, 8892, id="the-issue's-example"),
        pytest.param(10000, 0, 9000, id="empty-cluster"),
        pytest.param(10, 9, 0, id="less-than-one-left"),
        pytest.param(10, 12, 0, id="already-over"),
        pytest.param(1001, 1, 900, id="exact-fraction"),
    ],
)
def test_headroom_rule_uses_at_most_ninety_percent_of_what_is_left(limit: int, used: int, usable: int) -> None:
    assert Limit("MaxJobCount", "cluster", limit, used).usable(0.9) == usable


@pytest.mark.parametrize(
    ("text", "want"),
    [("", None), ("-1", None), ("INFINITE", None), ("UNLIMITED", None), ("N/A", None), ("0", 0), ("500", 500)],
)
def test_no_limit_is_read_as_none(text: str, want: int | None) -> None:
    assert parse_limit(text) == want


def test_limits_come_from_the_config_the_association_and_the_qos_with_what_counts_against_each() -> None:
    cluster = FakeCluster(
        enforce="associations,limits,qos",
        assoc="acct|alice||50|20||normal,high|high\n",
        account_row="acct|||||200|normal|\nacct|alice||50|20||normal|high\nacct|carol||||||\n",
        qos="high|30|||40\n",
    )
    cluster.queued = [
        "1|alice|acct|high|PENDING|/a.sh",
        "2|alice|acct|high|RUNNING|/a.sh",
        "3|alice|acct|high|COMPLETED|/a.sh",  # finished: counts against MaxJobCount only
        "4|alice|other|normal|PENDING|/b.sh",
        "5|carol|acct|high|PENDING|/c.sh",
        "6|bob|x|normal|PENDING|/d.sh",
    ]
    limits = Slurm(cluster, user="alice").limits(partition="gpu")
    got = {(lim.name, lim.scope): (lim.limit, lim.used) for lim in limits.limits}
    assert got == {
        ("MaxJobCount", "cluster"): (10000, 6),
        ("MaxSubmitJobs", "association acct/alice"): (50, 2),
        ("GrpSubmitJobs", "account acct"): (200, 3),
        ("MaxSubmitJobsPerUser", "QOS high (per user)"): (30, 2),  # the association's default QOS
    }
    assert any(n.startswith("MaxJobs 20 ") for n in limits.notes)  # running jobs only: a note, not a refusal
    assert any(n.startswith("MaxJobsPerUser 40 ") for n in limits.notes)
    assert cluster.commands("sacctmgr")[0][:6] == ["sacctmgr", "-nP", "show", "assoc", "user=alice", "cluster=local"]
    assert len(cluster.commands("squeue")) == 1 and len(cluster.commands("scontrol")) == 1


def test_association_and_qos_limits_are_not_read_where_the_cluster_does_not_enforce_them() -> None:
    cluster = FakeCluster(enforce="none", queued=3)
    limits = Slurm(cluster, user="alice").limits()
    assert [(lim.name, lim.used) for lim in limits.limits] == [("MaxJobCount", 3)]
    assert cluster.commands("sacctmgr") == []
    assert "not enforced by this cluster (AccountingStorageEnforce = none)" in limits.notes[0]


# --- refusals: with the numbers, before anything is written ---


def test_a_run_over_max_job_count_is_refused_with_the_numbers_and_nothing_is_written(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=10000, run_extra="retries: 1\n")
    cluster = FakeCluster(queued=120)
    want = (
        "10,000 shards \u00d7 (1 + retries 1) = 20,000 array tasks, but MaxJobCount is 10,000 with 120 already "
        "queued (90 % headroom rule: 8,892 usable); use fewer shards or fewer retries (at most 4,446 shards fit "
        "with retries 1), or keep the shards and set allocations: 4,446 (each allocation pulls several shards)"
    )
    with pytest.raises(SubmitError) as refused:
        submit(run, profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env)
    assert str(refused.value) == want
    assert cluster.commands("sbatch") == [] and not (tmp_path / "work").exists()
    code, out, err = _cli(["submit", str(run), "--profile", str(profile), "--dry-run"], cluster, env)
    assert (code, out, err) == (2, "", f"error: {want}\n")  # the dry run refuses alike
    assert not (tmp_path / "work").exists()


def test_a_run_over_its_association_limit_is_refused_naming_it(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=40)
    cluster = FakeCluster(enforce="associations,limits", assoc="acct|alice||50||||normal\n", qos="normal||||\n")
    cluster.queued = ["7|alice|acct|normal|PENDING|/a.sh"] * 10
    with pytest.raises(SubmitError) as refused:
        submit(run, profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env)
    assert str(refused.value) == (
        "40 shards = 40 array tasks, but MaxSubmitJobs of association acct/alice is 50 with 10 already queued "
        "(90 % headroom rule: 36 usable); use fewer shards (at most 36 shards fit), or keep the shards and set "
        "allocations: 36 (each allocation pulls several shards)"
    )
    assert cluster.commands("sbatch") == [] and not (tmp_path / "work").exists()


def test_a_run_that_fits_is_submitted(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=3)
    cluster = FakeCluster(max_jobs=5)  # 3 tasks ≤ 90 % of 5 (4)
    done = submit(run, profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env)
    assert done.job_ids == ("4242",)
    plan = read_json(done.layout.submit_plan, SubmitPlanRecord)
    assert plan.tasks == 3 and [(c.name, c.limit, c.used, c.usable) for c in plan.limits] == [("MaxJobCount", 5, 0, 4)]


# --- the dry run shows exactly what the submission makes ---


def test_dry_run_shows_exactly_the_arrays_the_submission_makes(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=10, run_extra="retries: 1\nmax_concurrent: 2\n")
    cluster = FakeCluster(max_array=4, queued=7)
    code, out, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"], cluster, env)
    assert code == 0
    dry = json.loads(out)
    code, text, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run"], cluster, env)
    assert code == 0 and not (tmp_path / "work").exists() and cluster.commands("sbatch") == []
    assert dry["tasks"] == 20 and len(dry["arrays"]) == 6
    assert dry["limits"]["checked"] == [
        {"name": "MaxJobCount", "scope": "cluster", "limit": 10000, "used": 7, "usable": 8993}
    ]
    code, _, _ = _cli(["submit", str(run), "--profile", str(profile), "--json"], cluster, env)
    assert code == 0
    layout = _run_dir(tmp_path)
    records = {r.plan_index: r for r in _records(layout)}
    job_of = {i: r.array_job_id for i, r in records.items()}
    assert len(records) == len(dry["arrays"])
    for array in dry["arrays"]:
        record = records[array["index"]]
        script = Path(record.script).read_text()
        assert f"#SBATCH --array={array['array']}\n" in script
        assert f"--array={array['array']:<14} shards {array['shards']} ({array['kind']})" in text
        assert (record.kind, compact_ranges(record.shards)) == (array["kind"], array["shards"])
        assert record.after == (None if array["after"] is None else job_of[array["after"]])
        if record.after is not None:
            assert f"#SBATCH --dependency=afternotok:{record.after}\n" in script
    assert [a["shards"] for a in dry["arrays"]] == ["0-3", "4-7", "8-9", "0-3", "4-7", "8-9"]
    assert "MaxJobCount is 10,000 with 7 already queued (90 % headroom rule: 8,993 usable)" in text


def test_a_dry_run_without_a_scheduler_still_shows_the_arrays_and_says_what_it_did_not_check(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=3)

    class NoSlurm(FakeCluster):
        def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
            raise SlurmError(list(argv), 127, f"{argv[0]}: command not found (is Slurm installed and on PATH?)")

    code, text, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run"], NoSlurm(), env)
    assert code == 0 and "#   array 0: --array=0-2 " in text
    assert "scheduler limits not read (scontrol failed (exit 127): scontrol: command not found" in text
    with pytest.raises(SlurmError, match="command not found"):  # the submission itself needs them
        submit(run, profile, slurm=Slurm(NoSlurm(), user="alice"), host=HOST, env=env)
    assert not (tmp_path / "work").exists()


# --- a submission that stops part-way ---


@pytest.mark.parametrize("fault", ["error", "timeout"])
def test_a_failure_on_the_kth_sbatch_leaves_an_explicit_incomplete_run(tmp_path: Path, fault: str) -> None:
    run, profile, env = _files(tmp_path, shards=10, run_extra="retries: 1\n")
    cluster = FakeCluster(max_array=4, sbatch_faults={3: fault})
    code, out, err = _cli(["submit", str(run), "--profile", str(profile)], cluster, env)
    layout = _run_dir(tmp_path)
    root = layout.root
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith(f"error: the submission of run {layout.run_id} stopped after 2 of 6 array(s): ")
    assert ("Socket timed out on send/recv" in err) == (fault == "error")
    assert ("sbatch did not answer within 120 s and was stopped" in err) == (fault == "timeout")
    for line in (
        "  submitted:     array job 4242: shards 0-3 (4 tasks)\n",
        "  submitted:     array job 4243: shards 4-7 (4 tasks)\n",
        "  not submitted: shards 8-9 (2 tasks)\n",
        "  not submitted: shards 0-3 (4 tasks, automatic retry)\n",
        f"    submit the rest:               ddslurm submit --continue {root}\n",
        f"    or cancel what was submitted:  ddslurm cancel {root}\n",
    ):
        assert line in err
    plan = read_json(layout.submit_plan, SubmitPlanRecord)
    assert len(plan.arrays) == 6 and [r.plan_index for r in _records(layout)] == [0, 1]

    # status: the run is incomplete and says how to go on; the shards no array covers are unsubmitted
    status = run_status(layout, Slurm(FakeCluster()))
    assert status.state == "incomplete" and status.submission_incomplete and status.unsubmitted_arrays == 4
    assert [s.shard for s in status.shards if s.state == "unsubmitted"] == [8, 9]
    code, text, _ = _cli(["status", str(root)], FakeCluster(), env)
    assert code == 0 and "run " + layout.run_id + ": incomplete" in text
    assert "submission incomplete: 4 array(s) of its plan were not submitted (2 shard(s) have no task" in text
    assert f"ddslurm submit --continue {root}" in text and f"ddslurm cancel {root}" in text
    assert re.search(r"\n\s+8\s+unsubmitted ", text)
    code, out, _ = _cli(["status", str(root), "--json"], FakeCluster(), env)
    assert json.loads(out)["state"] == "incomplete" and json.loads(out)["counts"]["unsubmitted"] == 2
    assert _cli(["wait", str(root)], FakeCluster(), env)[0] == 1  # returns at once: nothing will run the rest

    # retry does not submit around an incomplete plan
    with pytest.raises(LauncherError, match=r"is incomplete \(4 arrays of its plan not submitted\): ddslurm submit"):
        retry(layout, Slurm(cluster, user="alice"), env)

    # one command submits the rest, exactly as planned: each planned array once, retries after their arrays
    code, out, err = _cli(["submit", "--continue", str(root)], cluster, env)
    assert code == 0, err
    assert out.startswith(f"submitted the rest of run {layout.run_id}: array job(s) 4244, 4245, 4246, 4247;")
    records = _records(layout)
    assert sorted(r.plan_index for r in records) == [0, 1, 2, 3, 4, 5]  # each planned array exactly once
    job_of = {r.plan_index: r.array_job_id for r in records}
    for array in plan.arrays:
        record = next(r for r in records if r.plan_index == array.index)
        assert record.shards == array.shards and record.kind == array.kind
        assert record.after == (None if array.after is None else job_of[array.after])
    status = run_status(layout, Slurm(FakeCluster()))
    assert not status.submission_incomplete and status.state != "incomplete"
    assert "unsubmitted" not in status.counts
    assert _cli(["submit", "--continue", str(root)], cluster, env)[1].startswith("nothing to submit")


def test_a_timed_out_sbatch_that_reached_slurm_is_recorded_by_continue_not_submitted_again(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=6)
    cluster = FakeCluster(max_array=2, sbatch_faults={2: "timeout-submitted"})
    code, _, err = _cli(["submit", str(run), "--profile", str(profile)], cluster, env)
    assert code == 1 and "may have reached Slurm before it was stopped" in err
    layout = _run_dir(tmp_path)
    assert [r.plan_index for r in _records(layout)] == [0]
    assert [s.state for s in run_status(layout, Slurm(FakeCluster())).shards].count("unsubmitted") == 4
    done = continue_submission(layout, Slurm(cluster, user="alice"), env)
    assert done.adopted == ("4243",) and done.job_ids == ("4244",)
    assert cluster.sbatches == 3  # the array Slurm got before the timeout was not submitted again
    assert [(r.plan_index, r.array_job_id, r.shards) for r in _records(layout)] == [
        (0, "4242", (0, 1)),
        (1, "4243", (2, 3)),
        (2, "4244", (4, 5)),
    ]


def test_the_first_sbatch_failing_leaves_nothing_but_a_timed_out_one_keeps_the_run(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path)
    with pytest.raises(SlurmError, match="Socket timed out"):
        submit(run, profile, slurm=Slurm(FakeCluster(sbatch_faults={1: "error"}), user="alice"), host=HOST, env=env)
    assert list((tmp_path / "work" / "runs").iterdir()) == []
    with pytest.raises(PartialSubmitError, match="stopped after 0 of 1 array"):
        submit(run, profile, slurm=Slurm(FakeCluster(sbatch_faults={1: "timeout"}), user="alice"), host=HOST, env=env)
    layout = _run_dir(tmp_path)  # sbatch may have reached Slurm: the run stays, incomplete
    assert run_status(layout, Slurm(FakeCluster())).state == "incomplete"


def test_continue_checks_the_limits_again(tmp_path: Path) -> None:
    layout, env = _stopped(tmp_path, FakeCluster(max_array=4, sbatch_faults={2: "error"}), shards=10)
    full = FakeCluster(max_jobs=20, queued=16)
    with pytest.raises(SubmitError) as refused:
        continue_submission(layout, Slurm(full, user="alice"), env)
    assert str(refused.value) == (
        "the 2 arrays left to submit hold 6 array tasks, but MaxJobCount is 20 with 16 already queued (90 % headroom "
        f"rule: 3 usable); wait until queued jobs have finished and continue again, or cancel the run: "
        f"ddslurm cancel {layout.root}"
    )
    assert full.commands("sbatch") == [] and run_status(layout, Slurm(FakeCluster())).state == "incomplete"


def test_cancel_of_a_half_submitted_run_cancels_what_was_submitted_and_ends_the_plan(tmp_path: Path) -> None:
    cluster = FakeCluster(max_array=2, sbatch_faults={3: "error"})
    layout, env = _stopped(tmp_path, cluster, shards=6, run_extra="retries: 1\n")
    code, out, _ = _cli(["cancel", str(layout.root), "--json"], cluster, env)
    assert code == 0 and json.loads(out) == {"cancelled": ["4243", "4242"], "run_cancelled": True, "adopted": []}
    assert cluster.commands("scancel") == [["scancel", "4243", "4242"]]  # only what was submitted
    sacct = "".join(f"{j}_{t}|CANCELLED|0:0|None\n" for j in ("4242", "4243") for t in range(2))

    class Ended(FakeCluster):  # Slurm's records of the cancelled tasks
        def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
            if argv[0] == "sacct":
                self.calls.append(list(argv))
                return Completed(0, sacct, "")
            return super().__call__(argv, env=env)

    status = run_status(layout, Slurm(Ended()))
    assert status.state == "cancelled" and not status.submission_incomplete
    assert [s.shard for s in status.shards if s.state == "unsubmitted"] == [4, 5]
    code, text, _ = _cli(["status", str(layout.root)], Ended(), env)
    assert "(ddslurm cancel); 2 shard(s) were never submitted; retry --resume-cancelled continues it" in text
    with pytest.raises(LauncherError, match=r"was cancelled .* --resume-cancelled submits every shard"):
        continue_submission(layout, Slurm(cluster, user="alice"), env)
    # continuing a cancelled run: every shard without a result, the never-submitted ones included
    ended = Ended()
    ended.next_id = 5000
    retried = retry(layout, Slurm(ended, user="alice"), env, resume_cancelled=True)
    assert retried.shards == (0, 1, 2, 3, 4, 5)
    assert "unsubmitted" not in run_status(layout, Slurm(FakeCluster())).counts


def test_a_cancel_during_the_submission_stops_it_and_cancels_the_array_it_raced(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=6)
    cluster = FakeCluster(max_array=2, sbatch_faults={2: "cancel"})

    def cancel_now() -> None:  # `ddslurm cancel` in another shell, while sbatch 2 is being answered
        (root,) = (tmp_path / "work" / "runs").iterdir()
        publish_once(RunLayout(root).cancelled, encode(CancelRecord(cancelled_at="now", array_job_ids=("4242",))))

    cluster.on_cancel = cancel_now
    with pytest.raises(PartialSubmitError, match=r"cancelled .* while it was being submitted"):
        submit(run, profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env)
    assert cluster.sbatches == 2 and cluster.commands("scancel") == [["scancel", "4243"]]


def test_two_submitters_of_one_run_never_both_submit(tmp_path: Path) -> None:
    cluster = FakeCluster(max_array=2, sbatch_faults={2: "error"})
    layout, env = _stopped(tmp_path, cluster, shards=4)
    with submit_lock(layout), pytest.raises(LauncherError, match="another ddslurm is submitting arrays of run"):
        continue_submission(layout, Slurm(cluster, user="alice"), env)
    assert cluster.sbatches == 2


def test_retry_arrays_are_checked_against_the_limits_too(tmp_path: Path) -> None:
    run, profile, env = _files(tmp_path, shards=3)
    done = submit(run, profile, slurm=Slurm(FakeCluster(), user="alice"), host=HOST, env=env)
    layout = RunLayout(done.layout.root)
    publish_once(
        layout.shard(0).winner,
        encode(
            WinnerRecord(shard=0, attempt="a", rows=4, dataset_dir="/x", files=(), plan_sha256="-", published_at="-")
        ),
    )
    sacct = "4242_1|FAILED|1:0|None\n4242_2|FAILED|1:0|None\n"

    class Full(FakeCluster):
        def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
            if argv[0] == "sacct":
                return Completed(0, sacct, "")
            return super().__call__(argv, env=env)

    with pytest.raises(SubmitError, match=r"^retrying 2 shards = 2 array tasks, but MaxJobCount is 10 with 9 already"):
        retry(layout, Slurm(Full(max_jobs=10, queued=9), user="alice"), env)


# --- every scheduler command has a timeout that ends in a clear error ---


def _fake_command(tmp_path: Path, name: str, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("command", ["sbatch", "squeue", "sacct", "scancel", "scontrol", "sacctmgr"])
def test_every_scheduler_command_that_hangs_ends_in_a_clear_error(tmp_path: Path, command: str) -> None:
    # the command forks a child that keeps the output pipe open: the whole process group is stopped
    pid_file = tmp_path / "child.pid"
    bin_dir = _fake_command(tmp_path, command, f"sleep 300 &\necho $! > {pid_file}\nsleep 300")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DDSLURM_SLURM_TIMEOUT": "0.5"}
    slurm = Slurm(env=env, user="alice")
    call: dict[str, Callable[[], object]] = {
        "sbatch": lambda: slurm.sbatch(str(tmp_path / "x.sbatch")),
        "squeue": lambda: slurm.squeue(["1"]),
        "sacct": lambda: slurm.sacct(["1"]),
        "scancel": lambda: slurm.scancel(["1"]),
        "scontrol": slurm.config,
        "sacctmgr": lambda: slurm.qos("normal"),
    }
    with pytest.raises(SlurmTimeoutError) as timed_out:
        call[command]()
    assert wait_ended(int(pid_file.read_text())), "the child holding the output pipe was not stopped"
    assert str(timed_out.value).startswith(f"{command} did not answer within 0.5 s and was stopped (")
    assert "DDSLURM_SLURM_TIMEOUT sets the timeout" in str(timed_out.value)


def test_the_default_timeout_and_a_missing_command() -> None:
    assert SubprocessRunner.from_env({}).timeout_s == 120
    assert SubprocessRunner.from_env({"DDSLURM_SLURM_TIMEOUT": "nonsense"}).timeout_s == 120
    assert SubprocessRunner.from_env({"DDSLURM_SLURM_TIMEOUT": "7.5"}).timeout_s == 7.5
    slurm = Slurm(env={"PATH": "/nonexistent"})
    with pytest.raises(SlurmError, match="scontrol: command not found"):
        slurm.config()


def test_a_timed_out_sbatch_through_the_cli_is_an_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, profile, env = _files(tmp_path, shards=2)
    bin_dir = _fake_command(tmp_path, "sbatch", "sleep 30")
    real = FakeCluster()

    class Mixed(SubprocessRunner):  # the real runner for sbatch (which hangs), the fake cluster for the rest
        def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
            return super().__call__(argv, env=env) if argv[0] == "sbatch" else real(argv, env=env)

    for key, value in {**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "DDSLURM_SLURM_TIMEOUT": "0.5"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(cli, "Slurm", lambda env: Slurm(Mixed(0.5), env=env, user="alice"))
    assert cli.main(["submit", str(run), "--profile", str(profile)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "sbatch did not answer within 0.5 s" in err
    assert "ddslurm submit --continue" in err
