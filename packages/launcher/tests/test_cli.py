"""The ``ddslurm`` command line (``ddslurm.launcher.cli.main``) with a fake Slurm: help and version, the profile
from ``DDSLURM_PROFILE``, ``--json`` on every command (errors included), the status table, ``list`` from one
squeue and one sacct call, ``logs`` defaults, and a reader that closes the pipe."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.main import get_command

from ddslurm.collector.testing import make_published_run
from ddslurm.config import (
    AttemptRecord,
    FileEntry,
    RunLayout,
    SubmissionRecord,
    WinnerRecord,
    atomic_write,
    encode,
    publish_once,
    sha256_file,
)
from ddslurm.launcher import Completed, Slurm, prepare, submit_shards, write_run_dir
from ddslurm.launcher.cli import DISTRIBUTIONS, app, main
from ddslurm.launcher.commands._output import ExitCode
from ddslurm.launcher.testing import FakeSlurm, accept_every_recipe, accept_recipe, write_attempt, write_unit_run

KEY = "sk-cli-test-value-123456"
DDSLURM = Path(sys.executable).parent / "ddslurm"


def _submitted(root: Path, *, shards: int = 3) -> tuple[RunLayout, Path, dict[str, str]]:
    """A run submitted to a fake Slurm as array 4242 (task i runs shard i); its profile and environment."""
    root.mkdir(parents=True, exist_ok=True)
    run, profile, env = write_unit_run(root, KEY, num_records=10 * shards, shards=shards)
    now = datetime.now(UTC)
    prepared = prepare(run, profile, env, now, check_recipe=accept_recipe)
    write_run_dir(prepared)
    submit_shards(prepared.layout, prepared.plan, list(range(shards)), Slurm(FakeSlurm()), env, now)
    return prepared.layout, profile, env


def _attempt(layout: RunLayout, shard: int, job: str, state: Any, **kwargs: Any) -> AttemptRecord:
    """An attempt of ``shard`` as array task ``4242_<shard>`` (raw job id ``job``) wrote it."""
    return write_attempt(layout, shard, job, state, task=f"4242_{shard}", **kwargs)


def _cli(argv: list[str], env: dict[str, str], runner: FakeSlurm | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    slurm = Slurm(runner if runner is not None else FakeSlurm(), env=env)
    code = main(argv, env=env, slurm=slurm, stdout=out, stderr=err, sleep=lambda _: None)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def _no_recipe_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data Designer's own validation of the recipe (a subprocess of seconds) is tested elsewhere."""
    accept_every_recipe(monkeypatch)


# --- help, version, completion ---


def test_version_names_every_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == ExitCode.OK
    text = capsys.readouterr().out
    assert text.startswith("ddslurm ") and all(f"  {name} " in text for name in DISTRIBUTIONS)
    assert main(["--version", "--json"]) == ExitCode.OK
    found = json.loads(capsys.readouterr().out)
    assert set(found) == set(DISTRIBUTIONS) and found["data-designer"]


def _words(text: str) -> str:
    """Help text without Rich's box drawing and line breaks."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_every_command_and_option_has_help_and_the_help_lists_it(capsys: pytest.CaptureFixture[str]) -> None:
    group = get_command(app)
    commands = group.commands  # type: ignore[attr-defined]
    assert set(commands) == {
        "submit", "providers", "status", "wait", "workflow", "cancel", "retry", "accept-partial", "logs", "collect",
        "report", "list", "init", "doctor", "tune",
    }  # fmt: skip
    for name, command in {"": group, **commands}.items():
        assert main([name, "--help"] if name else ["--help"]) == ExitCode.OK
        shown = _words(capsys.readouterr().out)
        assert command.help, name
        for param in command.params:
            help_text = getattr(param, "help", None)
            assert help_text, f"{name}: {param.name} has no help"
            assert _words(help_text) in shown, f"{name} --help does not show the help of {param.name}"
            for opt in param.opts if param.param_type_name == "option" else []:
                assert opt in shown, f"{name} --help does not list {opt}"
        if name:
            assert "--json" in shown and "--help" in shown


def test_shell_completion_is_offered(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Typer detects the shell from the process tree (shellingham), which a test worker may not have: say it is bash.
    monkeypatch.setattr("typer.completion._get_shell_name", lambda: "bash")
    assert main(["--show-completion", "bash"]) == ExitCode.OK
    assert "_DDSLURM_COMPLETE=complete_bash" in capsys.readouterr().out
    assert main(["--help"]) == ExitCode.OK
    assert "--install-completion" in capsys.readouterr().out


# --- DDSLURM_PROFILE ---


@pytest.mark.usefixtures("_no_recipe_check")
def test_submit_takes_the_profile_from_DDSLURM_PROFILE(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY)
    code, _, err = _cli(["submit", str(run), "--dry-run"], env)
    assert code == ExitCode.USAGE and "submit needs --profile" in err
    with_profile = {**env, "DDSLURM_PROFILE": str(profile)}
    code, out, err = _cli(["submit", str(run), "--dry-run"], with_profile)
    assert code == ExitCode.OK, err
    assert f"# run dir would be {tmp_path / 'work' / 'runs'}" in out
    code, out, err = _cli(["submit", str(run), "--json"], with_profile)
    assert code == ExitCode.OK, err
    submitted = json.loads(out)
    assert Path(submitted["run_dir"]).parent == tmp_path / "work" / "runs"
    code, out, _ = _cli(["status", submitted["run_id"], "--json"], with_profile)  # the run id, found by the profile
    assert code == ExitCode.OK and json.loads(out)["run_id"] == submitted["run_id"]


# --- --json everywhere ---


def test_every_command_prints_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout, profile, env = _submitted(tmp_path)
    root = str(layout.root)
    _attempt(layout, 0, "5000", "partial", progress=4)
    (layout.shard(0).attempt("attempt-5000").dir / "client.log").write_text('{"event": "begin", "level": "info"}\n')
    monkeypatch.setenv("DATA_DESIGNER_HOME", env["DATA_DESIGNER_HOME"])
    ended = FakeSlurm(sacct="".join(f"4242_{t}|FAILED|1:0|None\n" for t in range(3)))
    ended.next_id = 6000
    expected: list[tuple[list[str], Any]] = [
        (["providers", str(tmp_path / "run.yaml")], lambda o: {"aliases", "problems"} <= set(o)),
        (["status", root], lambda o: o["state"] == "failed" and len(o["shards"]) == 3),
        (["status", root, "--watch"], lambda o: o["state"] == "failed"),
        (["list", "--profile", str(profile)], lambda o: [r["run_id"] for r in o] == [layout.run_id]),
        (["logs", root, "--shard", "0"], lambda o: o["record"]["event"] == "begin" and o["source"].endswith(".log")),
        (
            ["cancel", root, "--shards", "1"],
            lambda o: o == {"cancelled": [], "run_cancelled": False, "adopted": [], "shards": [1], "finished": []},
        ),
        (["retry", root, "--shards", "2"], lambda o: o["shards"] == [2] and len(o["job_ids"]) == 1),
    ]
    candidate = WinnerRecord(
        shard=0, attempt="attempt-5000", rows=4, dataset_dir="/x", files=(), plan_sha256="-", published_at="-"
    )
    atomic_write(layout.shard(0).attempt("attempt-5000").candidate, encode(candidate))
    expected.append(
        (
            ["accept-partial", root, "--shards", "0"],
            lambda o: (
                o
                == {
                    "accepted": [{"shard": 0, "rows": 4, "stage": None}],
                    "cpu_stage": {"shards": [], "job_ids": [], "queued": []},
                }
            ),
        )
    )
    published = make_published_run(tmp_path / "collected", [[pa.table({"a": [1, 2]})]])
    expected.append((["collect", str(published.root), "--local"], lambda o: o["rows"] == 2 and o["files"]))
    for argv, check in expected:
        code, out, err = _cli([*argv, "--json"], env, ended)
        assert code in (ExitCode.OK, ExitCode.FAILED), (argv, err)
        assert check(json.loads(out)), (argv, out, err)
    code, out, _ = _cli(["wait", root, "--json"], env, ended)
    assert code == ExitCode.FAILED and json.loads(out)["state"] == "failed"  # the run's answer, not an error


def _error(argv: list[str], env: dict[str, str], runner: FakeSlurm | None = None) -> tuple[int, dict[str, Any]]:
    code, out, err = _cli([*argv, "--json"], env, runner)
    document = json.loads(out)
    assert set(document) == {"error"} and document["error"]["exit_code"] == code, out
    assert err.startswith("error: ") or "Usage:" in err, err  # people still read it on stderr
    return code, document["error"]


@pytest.mark.usefixtures("_no_recipe_check")
def test_every_command_reports_an_error_as_one_json_object(tmp_path: Path) -> None:
    layout, profile, env = _submitted(tmp_path)
    root = str(layout.root)
    pending = FakeSlurm(squeue="4242_[0-2]|PENDING|Priority\n")
    cases: list[tuple[list[str], ExitCode, str, str]] = [
        (["submit", str(tmp_path / "run.yaml")], ExitCode.USAGE, "usage", "needs --profile"),
        (["submit", str(tmp_path / "nothing.yaml"), "--profile", str(profile)], ExitCode.USAGE, "submit_refused", ""),
        (["submit", "--continue", str(tmp_path)], ExitCode.USAGE, "run_not_found", "no run"),
        (["providers", str(tmp_path / "nothing.yaml")], ExitCode.USAGE, "invalid_input", "nothing.yaml"),
        (["status", str(tmp_path / "nothing")], ExitCode.USAGE, "run_not_found", "no run"),
        (["status", root, "--bogus"], ExitCode.USAGE, "usage", "No such option: --bogus"),
        (["wait", root, "--timeout", "0"], ExitCode.TIMEOUT, "timeout", "run still pending after 0 s"),
        (["cancel", root, "--shards", "5"], ExitCode.USAGE, "usage", "no shard 5: the run has shards 0-2"),
        (["retry", root, "--shards", "x"], ExitCode.USAGE, "usage", "expected numbers and ranges"),
        (["accept-partial", root, "--shards", "0"], ExitCode.FAILED, "failed", "has no partial result"),
        (["logs", root, "--shard", "7"], ExitCode.USAGE, "usage", "no shard 7: the run has shards 0-2"),
        (["logs", root, "--shard", "0"], ExitCode.FAILED, "failed", "has no client log yet"),
        (["collect", root, "--local"], ExitCode.FAILED, "collect_failed", "no published result"),
        (["list"], ExitCode.USAGE, "usage", "needs --profile"),
    ]
    for argv, exit_code, kind, words in cases:
        code, error = _error(argv, env, pending)
        assert (code, error["code"]) == (exit_code, kind), (argv, error)
        assert words in error["message"], (argv, error)
    _, error = _error(["wait", root, "--timeout", "0"], env, pending)
    assert error["status"]["state"] == "pending"  # where the run stood when wait gave up


def test_a_run_file_with_several_mistakes_reports_every_one_in_text_and_json(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY, run_extra="shard: 2\nsubmission:\n  cpus: many\n")

    code, out, err = _cli(["submit", str(run), "--profile", str(profile), "--dry-run"], env)
    assert code == ExitCode.USAGE and out == ""
    assert err.splitlines() == [
        f"error: {run}:5:1: shard: unknown field; did you mean 'shards'?",
        f"{run}:7:3: submission.cpus: expected int, got str",
    ]

    code, error = _error(["submit", str(run), "--profile", str(profile), "--dry-run"], env)
    assert (code, error["code"]) == (ExitCode.USAGE, "submit_refused")  # as for one mistake
    assert error["problems"] == [
        {"file": str(run), "line": 5, "col": 1, "field": "shard", "message": "unknown field; did you mean 'shards'?"},
        {"file": str(run), "line": 7, "col": 3, "field": "submission.cpus", "message": "expected int, got str"},
    ]
    _, error = _error(["providers", str(run)], env)
    assert error["code"] == "invalid_input" and [p["line"] for p in error["problems"]] == [5, 7]


@pytest.mark.parametrize("local", [True, False], ids=["local", "job"])
def test_collect_of_a_run_still_running_says_to_wait_first(tmp_path: Path, local: bool) -> None:
    layout, _, env = _submitted(tmp_path)
    running = FakeSlurm(squeue="4242_0|RUNNING|None\n4242_[1-2]|PENDING|Priority\n")

    argv = ["collect", str(layout.root), *(["--local"] if local else [])]
    code, error = _error(argv, env, running)

    assert (code, error["code"]) == (ExitCode.FAILED, "collect_failed")
    assert error["message"] == (
        f"3 shard(s) have no published result yet: 0, 1, 2; the run is still running: run `ddslurm wait "
        f"{layout.root}` first, then collect"
    )
    assert running.commands("sbatch") == []  # no collection job for a run that cannot be collected


def test_collect_of_a_run_that_failed_says_where_to_look(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path)
    ended = FakeSlurm(sacct="".join(f"4242_{t}|FAILED|1:0|None\n" for t in range(3)))

    code, error = _error(["collect", str(layout.root), "--local"], env, ended)

    assert code == ExitCode.FAILED
    assert error["message"].endswith(
        f"; the run's state is failed: `ddslurm status {layout.root}` says why, `ddslurm retry {layout.root}` "
        "makes new attempts"
    )


def test_cancel_of_shards_says_which_shards_it_cancelled_and_how(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path)
    (layout.shard(2).winner).write_text("{}")  # shard 2 has its result
    queued = FakeSlurm(squeue="4242_[0-2]|PENDING|Priority\n")

    code, out, _ = _cli(["cancel", str(layout.root), "--shards", "1,2"], env, queued)

    assert code == ExitCode.OK
    assert out.splitlines() == [
        f"cancelled shards 1-2 of run {layout.run_id}: 2 tasks 4242_1, 4242_2 cancelled (ddslurm retry --shards runs "
        "them again)",
        "shard 2 already had a result, which is kept",
    ]
    assert [c[1:] for c in queued.commands("scancel")] == [["4242_1", "4242_2"]]


def test_collect_when_the_scheduler_cannot_say_how_the_run_stands_gives_both_ways_out(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path)

    class Unreadable(FakeSlurm):
        def __call__(self, argv: Any, *, env: Any = None) -> Any:
            self.calls.append(list(argv))
            return Completed(1, "", "slurm_load_jobs error: Unable to contact slurm controller")

    code, error = _error(["collect", str(layout.root), "--local"], env, Unreadable())

    assert (code, error["code"]) == (ExitCode.FAILED, "collect_failed")
    assert error["message"] == (
        f"3 shard(s) have no published result yet: 0, 1, 2; `ddslurm wait {layout.root}` waits for a run still "
        f"running, `ddslurm status {layout.root}` says why shards failed"
    )


def test_ctrl_c_is_an_error_too(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path, shards=1)

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    out, err = io.StringIO(), io.StringIO()
    argv = ["wait", str(layout.root), "--json"]
    code = main(argv, env=env, slurm=Slurm(FakeSlurm()), stdout=out, stderr=err, sleep=interrupt)
    assert code == ExitCode.INTERRUPTED and err.getvalue() == "error: interrupted\n"
    assert json.loads(out.getvalue()) == {"error": {"code": "interrupted", "message": "interrupted", "exit_code": 130}}


def test_a_submission_that_stopped_part_way_says_what_was_submitted_in_its_error(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY, run_extra="retries: 1\n")

    class SecondSbatchFails(FakeSlurm):
        def __call__(self, argv: Any, *, env: Any = None) -> Any:
            if argv[0] == "sbatch" and self.commands("sbatch"):
                self.calls.append(list(argv))
                return Completed(1, "", "sbatch: error: injected")
            return super().__call__(argv, env=env)

    with pytest.MonkeyPatch.context() as patch:
        accept_every_recipe(patch)
        code, error = _error(["submit", str(run), "--profile", str(profile)], env, SecondSbatchFails())
    assert (code, error["code"], error["state"]) == (ExitCode.FAILED, "submission_incomplete", "incomplete")
    assert [a["job_id"] for a in error["submitted"]] == ["4242"] and len(error["not_submitted"]) == 1
    assert "ddslurm submit --continue" in error["message"]


# --- status ---


def test_status_table_shows_array_tasks_attempts_rates_pending_reasons_and_rows_after_a_cancel(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path, shards=4)
    _attempt(layout, 0, "5000", "running", progress=4, started=(datetime.now(UTC) - timedelta(seconds=2)).isoformat())
    _attempt(layout, 1, "5001", "failed", reason="cancelled", started="2026-01-01T00:00:00+00:00")
    _attempt(layout, 1, "5005", "cancelled", reason="cancelled", progress=3, started="2026-01-01T01:00:00+00:00")
    slurm = FakeSlurm(
        squeue="4242_0|RUNNING|None\n4242_[2-3]|PENDING|JobArrayTaskLimit\n", sacct="4242_1|CANCELLED|0:0|None\n"
    )
    code, text, _ = _cli(["status", str(layout.root)], env, slurm)
    assert code == ExitCode.OK
    header, *rows = text.splitlines()[2:]
    assert header.split() == ["SHARD", "STATE", "ROWS", "ROWS/S", "ATTEMPT", "JOB", "SLURM", "REASON"]
    # the attempt's number among the shard's attempts (the second of two), never its Slurm job id
    assert re.fullmatch(r"\s+0  running\s+4/10\s+\d+\.\d\s+1\s+4242_0\s+RUNNING", rows[0]), rows[0]
    assert re.fullmatch(r"\s+1  cancelled\s+3/10\s+2 of 2\s+4242_1\s+CANCELLED\s+cancelled", rows[1]), rows[1]
    assert "5000" not in text and "5005" not in text
    assert rows[2].split()[-3:] == ["PENDING", "pending:", "JobArrayTaskLimit"]
    assert "\x1b[" not in text and "─" not in text  # plain off a terminal
    shards = json.loads(_cli(["status", str(layout.root), "--json"], env, slurm)[1])["shards"]
    assert [s["job_id"] for s in shards] == ["4242_0", "4242_1", "4242_2", "4242_3"]
    assert shards[2]["pending_reason"] == "JobArrayTaskLimit" and shards[1]["rows"] == 3
    assert [(s["attempt"], s["attempt_number"], s["attempts"]) for s in shards[:2]] == [
        ("attempt-5000", 1, 1),
        ("attempt-5005", 2, 2),
    ]
    assert shards[0]["stage"] is None and shards[0]["stage_rows"] is None  # a single-stage run


def test_a_succeeded_shard_shows_its_array_task_not_the_raw_job_id(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]})]])
    record = SubmissionRecord(array_job_id="44", shards=(0,), submitted_at="2026-01-01T00:00:00+00:00", script="-")
    layout.submissions.mkdir()
    publish_once(layout.submissions / "44.json", encode(record))
    attempt = AttemptRecord(
        shard=0, attempt="attempt-1", job_id="45", node="n1", state="succeeded",
        started_at="2026-01-01T00:00:00+00:00", slurm_log=str(layout.logs / "slurm-44_0.out"),
    )  # fmt: skip
    atomic_write(layout.shard(0).attempt("attempt-1").record, encode(attempt))
    status = json.loads(_cli(["status", str(layout.root), "--json"], {}, FakeSlurm())[1])
    assert (status["state"], status["shards"][0]["job_id"]) == ("succeeded", "44_0")


# --- list ---


def test_list_asks_slurm_once_for_every_run_and_shows_the_newest_first(tmp_path: Path) -> None:
    layouts = []
    for n in range(3):
        layout, profile, env = _submitted(tmp_path / f"r{n}")
        layouts.append(layout)
    workspace = tmp_path / "ws"
    (workspace / "runs").mkdir(parents=True)
    for n, layout in enumerate(layouts):  # one workspace; the runs submitted an hour apart, r2 last
        moved = workspace / "runs" / layout.run_id
        layout.root.rename(moved)
        for sub in (moved / "submissions").glob("*.json"):
            data = json.loads(sub.read_text())
            sub.write_text(json.dumps({**data, "submitted_at": f"2026-01-01T0{n}:00:00+00:00"}))
    (workspace / "runs" / "broken").mkdir()
    (workspace / "runs" / "broken" / "run.json").write_text("{")
    os.utime(workspace / "runs" / "broken" / "run.json", (0, 0))  # written in 1970: the oldest
    profile.write_text(profile.read_text().replace("workspace: work", f"workspace: {workspace}"))
    runner = FakeSlurm(squeue="4242_[0-2]|RUNNING|None\n")
    code, text, err = _cli(["list", "--profile", str(profile)], env, runner)
    assert code == ExitCode.OK, err
    assert [c[0] for c in runner.calls] == ["squeue", "sacct"]  # one call each, for all runs together
    header, *rows = text.splitlines()
    assert header.split() == ["RUN", "STATE", "ROWS", "AGE", "DIR"]
    ids = [r.split()[0] for r in rows]
    assert ids == [layouts[2].run_id, layouts[1].run_id, layouts[0].run_id, "broken"]
    assert rows[0].split()[1:3] == ["running", "0/30"] and "unreadable" in rows[3]
    listed = json.loads(_cli(["list", "--profile", str(profile), "--json"], env, runner)[1])
    assert [r["run_id"] for r in listed][:3] == ids[:3] and listed[0]["records"] == 30


# --- logs ---


def test_logs_default_to_the_failed_shard_and_render_structured_lines(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path)
    for shard in range(3):
        _attempt(layout, shard, f"500{shard}", "running", started="2026-01-01T00:00:00+00:00")
        line = {"event": "batch.done", "level": "info", "timestamp": "2026-01-01T00:00:01.5Z", "shard": shard}
        (layout.shard(shard).attempt(f"attempt-500{shard}").dir / "client.log").write_text(
            json.dumps(line) + "\nnot a record\n"
        )
    slurm = FakeSlurm(squeue="4242_0|RUNNING|None\n4242_2|RUNNING|None\n", sacct="4242_1|FAILED|1:0|None\n")
    code, out, err = _cli(["logs", str(layout.root)], env, slurm)
    assert code == ExitCode.OK and err == "shard 1 (failed); --shard N shows another\n"
    assert out == "2026-01-01 00:00:01.5 info    batch.done shard=1\nnot a record\n"
    code, out, err = _cli(["logs", str(layout.root)], env, FakeSlurm(squeue="4242_[0-2]|RUNNING|None\n"))
    assert code == ExitCode.OK and "shard=0" in out and err == ""  # nothing failed: shard 0
    _attempt(layout, 2, "5009", "running", started="2026-01-01T02:00:00+00:00")
    code, _, err = _cli(["logs", str(layout.root), "--shard", "2"], env, slurm)
    assert code == ExitCode.FAILED and "shard 2 has no client log yet" in err  # the latest attempt's
    code, out, _ = _cli(["logs", str(layout.root), "--shard", "2", "--attempt", "5002"], env, slurm)
    assert code == ExitCode.OK and "shard=2" in out
    code, _, err = _cli(["logs", str(layout.root), "--shard", "2", "--attempt", "77"], env, slurm)
    assert code == ExitCode.USAGE and "shard 2 has no attempt '77' (its attempts: 5002, 5009)" in err


def test_logs_of_an_attempt_whose_server_failed_show_the_server_log(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path)
    _attempt(layout, 0, "6000", "failed", reason="server_start_failed")
    _attempt(layout, 1, "6001", "failed", reason="generation_failed")
    for shard, job in ((0, "6000"), (1, "6001")):
        attempt = layout.shard(shard).attempt(f"attempt-{job}").dir
        (attempt / "client.log").write_text(f"client of shard {shard}\n")
        (attempt / "server-writer-0.log").write_text(f"CUDA out of memory on shard {shard}\n")
    slurm = FakeSlurm(sacct="4242_0|FAILED|1:0|None\n4242_1|FAILED|1:0|None\n")

    code, out, err = _cli(["logs", str(layout.root)], env, slurm)
    assert code == ExitCode.OK and out == "CUDA out of memory on shard 0\n"
    assert err.splitlines() == [
        "shard 0 (failed); --shard N shows another",
        "the server log: attempt 6000 failed with server_start_failed; --step client shows the client",
    ]
    code, out, _ = _cli(["logs", str(layout.root), "--shard", "0", "--step", "client"], env, slurm)
    assert out == "client of shard 0\n"  # asked for: the client
    code, out, err = _cli(["logs", str(layout.root), "--shard", "1"], env, slurm)
    assert out == "client of shard 1\n" and err == ""  # a generation failure: the client's log


def test_logs_follow_waits_for_a_pending_shard_s_log(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path, shards=1)
    slurm = FakeSlurm(squeue="4242_0|PENDING|Resources\n")
    naps: list[float] = []

    def sleep(seconds: float) -> None:  # the task starts, writes a line, and ends
        naps.append(seconds)
        if len(naps) == 2:
            _attempt(layout, 0, "5000", "running")
            (layout.shard(0).attempt("attempt-5000").dir / "client.log").write_text("first\n")
        if len(naps) == 3:
            with (layout.shard(0).attempt("attempt-5000").dir / "client.log").open("a") as fh:
                fh.write("second\n")
            slurm.squeue_out, slurm.sacct_out = "", "4242_0|FAILED|1:0|None\n"

    out, err = io.StringIO(), io.StringIO()
    code = main(["logs", str(layout.root), "-f"], env=env, slurm=Slurm(slurm), stdout=out, stderr=err, sleep=sleep)
    assert code == ExitCode.OK
    assert "waiting for the client log of shard 0" in err.getvalue()
    assert out.getvalue().splitlines() == ["first", "second"]


# --- a closed pipe ---


@pytest.mark.skipif(not DDSLURM.exists(), reason="the ddslurm script is not installed")
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path / "run")
    _attempt(layout, 0, "5000", "failed", reason="client_failed")
    (layout.shard(0).attempt("attempt-5000").dir / "client.log").write_text(
        "".join(json.dumps({"event": "line", "level": "info", "n": n}) + "\n" for n in range(30000))
    )
    bin_dir = tmp_path / "bin"  # a scheduler that knows none of the run's jobs
    bin_dir.mkdir()
    for name in ("squeue", "sacct"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for command, want in (
        ("status", (ExitCode.OK, ExitCode.CLOSED_PIPE)),  # small: may fit in the pipe before head exits
        ("logs --shard 0 --lines 30000", (ExitCode.CLOSED_PIPE,)),
        ("logs --shard 0 --lines 30000 --json", (ExitCode.CLOSED_PIPE,)),
    ):
        script = f"{DDSLURM} {command.split()[0]} {layout.root} {' '.join(command.split()[1:])} | head -c 1"
        done = subprocess.run(
            ["bash", "-c", f'{script}; exit "${{PIPESTATUS[0]}}"'], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode in want, (command, done.returncode, done.stderr)
        assert done.stderr == "", (command, done.stderr)  # no traceback, no "Exception ignored"


# --- wait: a succeeded run leaves nothing queued ---


def _published(layout: RunLayout, shard: int) -> None:
    dataset = layout.shard(shard).attempt("attempt-77").output / f"shard-{shard:05d}"
    (dataset / "parquet-files").mkdir(parents=True)
    batch = dataset / "parquet-files" / "batch_00000.parquet"
    pq.write_table(pa.table({"q": [f"row {i}" for i in range(10)]}), batch)
    entry = FileEntry(path="parquet-files/batch_00000.parquet", size=batch.stat().st_size, sha256=sha256_file(batch))
    winner = WinnerRecord(
        shard=shard,
        attempt="attempt-77",
        rows=10,
        dataset_dir=str(dataset),
        files=(entry,),
        plan_sha256="-",
        published_at=datetime.now(UTC).isoformat(),
    )
    assert publish_once(layout.shard(shard).winner, encode(winner))


def test_retry_fresh_of_a_finished_shard_refuses_and_says_why(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path, shards=3)
    _published(layout, 2)
    _attempt(layout, 1, "6001", "failed", reason="generation_failed")
    ended = FakeSlurm(sacct="4242_0|COMPLETED|0:0|None\n4242_1|FAILED|1:0|None\n4242_2|COMPLETED|0:0|None\n")
    ended.next_id = 5000  # the run's own array is 4242

    code, out, err = _cli(["retry", str(layout.root), "--shards", "2", "--fresh"], env, ended)
    assert (code, out) == (ExitCode.FAILED, "")
    assert err == (
        "error: shard 2 has a result already: a published winner is never replaced, so there is nothing to retry "
        f"(--fresh starts over only shards without a result); `ddslurm collect {layout.root}` uses it\n"
    )
    assert ended.commands("sbatch") == [] and not layout.shard(2).fresh.exists()

    code, out, err = _cli(["retry", str(layout.root), "--shards", "1-2", "--fresh"], env, ended)
    assert code == ExitCode.OK, err
    assert out.splitlines() == [
        "retrying 1 shard(s) as array job(s) 5000",
        "not retried: shard 2 already had a result, which is never replaced",
    ]
    assert layout.shard(1).fresh.exists() and not layout.shard(2).fresh.exists()


def test_wait_cancels_the_queued_tasks_of_a_succeeded_run(tmp_path: Path) -> None:
    """Slurm requeued task 4242_2 after its shard was published (its node failed before the task ended): it could only
    start to record ``superseded``. Once the run has succeeded, ``wait`` cancels it; the running one is left."""
    layout, _, env = _submitted(tmp_path, shards=3)
    for shard in range(3):
        _published(layout, shard)
    runner = FakeSlurm(squeue="4242_1|COMPLETING|None\n4242_2|PENDING|BeginTime\n")
    code, out, err = _cli(["wait", str(layout.root), "--json"], env, runner)
    assert code == ExitCode.OK and json.loads(out)["state"] == "succeeded"
    assert runner.commands("scancel") == [["scancel", "4242_2"]]
    assert "cancelled 1 queued task(s)" in err and "4242_2" in err


def test_wait_cancels_nothing_of_a_run_that_did_not_succeed(tmp_path: Path) -> None:
    layout, _, env = _submitted(tmp_path, shards=2)
    _published(layout, 0)
    _attempt(layout, 1, "4243", "failed", reason="generation_failed")
    runner = FakeSlurm(squeue="", sacct="4242_0|COMPLETED|0:0|None\n4242_1|FAILED|1:0|None\n")
    code, _, _ = _cli(["wait", str(layout.root), "--json"], env, runner)
    assert code == ExitCode.FAILED and runner.commands("scancel") == []
