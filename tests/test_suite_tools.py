"""The tools that measure and order the suite (docs/testing.md): the durations plugin records what pytest reports,
the order plugin hands out the long tests first, the report sums what the file holds, the import check finds a
module that does not import. Each runs pytest (or the tool) on a small suite of its own."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.import_all import import_every_module
from tools.pytest_times import plain_nodeid
from tools.suite_times import main as suite_times_main
from tools.suite_times import parse_sacct, report, sacct_seconds, slurm_report, step_kind, step_test

REPO = Path(__file__).resolve().parents[1]

SUITE = textwrap.dedent(
    """
    import pytest

    def test_plain():
        pass

    @pytest.mark.dd
    def test_engine():
        pass

    @pytest.mark.slurm
    def test_cluster():
        pass

    def test_fails():
        assert False

    @pytest.mark.skip(reason="not here")
    def test_skipped():
        pass

    @pytest.mark.slurm
    @pytest.mark.dd
    def test_both():
        pass
    """
)


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_small.py").write_text(SUITE)
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: cluster\n    dd: engine\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", *args, str(folder)],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_the_durations_file_holds_every_test_with_its_markers_and_outcome(tmp_path: Path) -> None:
    times = tmp_path / "out" / "durations.jsonl"
    done = _pytest(tmp_path, "-p", "tools.pytest_times", "--times-file", str(times))
    assert done.returncode == 1, done.stdout  # test_fails
    entries = {e["test"].split("::")[1]: e for e in map(json.loads, times.read_text().splitlines())}
    assert set(entries) == {"test_plain", "test_engine", "test_cluster", "test_fails", "test_skipped", "test_both"}
    assert {name: e["outcome"] for name, e in entries.items()} == {
        "test_plain": "passed", "test_engine": "passed", "test_cluster": "passed", "test_fails": "failed",
        "test_skipped": "skipped", "test_both": "passed",
    }  # fmt: skip
    assert entries["test_both"]["markers"] == ["dd", "slurm"] and entries["test_plain"]["markers"] == []
    assert all(e["s"] >= 0 and e["file"] == "test_small.py" for e in entries.values())
    seconds = [e["s"] for e in map(json.loads, times.read_text().splitlines())]
    assert seconds == sorted(seconds, reverse=True)  # slowest first


def test_long_first_hands_out_cluster_then_engine_tests_then_the_rest(tmp_path: Path) -> None:
    plain = _pytest(tmp_path, "--collect-only")
    ordered = _pytest(tmp_path, "--collect-only", "-p", "tools.pytest_order", "--long-first")

    def names(done: subprocess.CompletedProcess[str]) -> list[str]:
        return [line.split("::")[1] for line in done.stdout.splitlines() if "::" in line]

    assert names(plain) == ["test_plain", "test_engine", "test_cluster", "test_fails", "test_skipped", "test_both"]
    assert names(ordered) == ["test_cluster", "test_both", "test_engine", "test_plain", "test_fails", "test_skipped"]


SHARED = textwrap.dedent(
    """
    import os
    import pytest

    @pytest.fixture(scope="module")
    def scenario():
        with open(os.environ["SCENARIO_LOG"], "a") as log:
            log.write(os.environ.get("PYTEST_XDIST_WORKER", "-") + "\\n")
        return 42

    @pytest.mark.parametrize("n", range(8))
    def test_reads_the_shared_run(scenario, n):
        assert scenario == 42
    """
)


def test_a_module_scoped_run_runs_once_on_one_worker_with_share_module_fixtures(tmp_path: Path) -> None:
    """Under --dist loadgroup, every test of a module with a module-scoped fixture goes to one worker, so the
    fixture (a shared cluster run) runs once; the durations file names the tests without xdist's ``@group``."""
    (tmp_path / "test_shared.py").write_text(SHARED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log, times = tmp_path / "scenario.log", tmp_path / "durations.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "3", "--dist", "loadgroup",
         "-p", "tools.pytest_order", "--share-module-fixtures", "-p", "tools.pytest_times", "--times-file",
         str(times), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "SCENARIO_LOG": str(log)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout
    assert len(log.read_text().splitlines()) == 1  # one worker set the run up, once
    tests = sorted(json.loads(line)["test"] for line in times.read_text().splitlines())
    assert tests == [f"test_shared.py::test_reads_the_shared_run[{n}]" for n in range(8)]


def test_plain_nodeid_drops_the_group_but_not_a_parameters_at() -> None:
    assert plain_nodeid("a.py::t[x]@a.py") == "a.py::t[x]"
    assert plain_nodeid("a.py::t[u@h]") == "a.py::t[u@h]"
    assert plain_nodeid("a.py::t@g") == "a.py::t"


def test_the_report_sums_by_marker_and_by_file(tmp_path: Path) -> None:
    rows = [
        {"test": "a.py::x", "file": "a.py", "markers": ["slurm"], "outcome": "passed", "s": 10.0, "cpu_s": 1.0},
        {"test": "a.py::y", "file": "a.py", "markers": [], "outcome": "passed", "s": 1.5, "cpu_s": 1.25},
        {"test": "b.py::z", "file": "b.py", "markers": ["dd", "slurm"], "outcome": "failed", "s": 4.0, "cpu_s": 3.0},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    report(path, 2, out)
    text = out.getvalue()
    assert "3 tests, 16 test-seconds (summed over the workers) and 5 CPU-seconds" in text
    slowest = text.split("slowest tests:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[-1] for line in slowest] == ["a.py::x", "b.py::z"]  # the top 2 only
    costliest = text.split("in CPU-seconds:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[-1] for line in costliest] == ["b.py::z", "a.py::y"]
    markers = text.split("by marker")[1].split("\n\n")[0]
    assert "14.0 s      4.0 CPU-s      2 tests  slurm" in markers and "4.0 s      3.0 CPU-s      1 tests  dd" in markers
    assert "1.5 s      1.2 CPU-s      1 tests  (no marker)" in markers
    files = text.split("by file")[1]
    assert "11.5 s      2.2 CPU-s      2 tests  a.py" in files and "4.0 s      3.0 CPU-s      1 tests  b.py" in files


BUSY = textwrap.dedent(
    """
    import subprocess, sys

    def test_waits_for_a_busy_child():
        busy = "import time\\nwhile time.process_time() < 0.5:\\n    pass"
        subprocess.run([sys.executable, "-c", busy], check=True)

    def test_idle():
        pass
    """
)


def test_each_tests_cpu_seconds_count_the_children_it_waited_for(tmp_path: Path) -> None:
    """A child that spends half a CPU-second (its own CPU clock, whatever the machine's load) counts in the test
    that started it, also when a pytest-xdist worker ran it."""
    (tmp_path / "test_busy.py").write_text(BUSY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    times = tmp_path / "durations.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", "-p", "tools.pytest_times",
         "--times-file", str(times), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    cpu = {e["test"].split("::")[1]: e["cpu_s"] for e in map(json.loads, times.read_text().splitlines())}
    assert cpu["test_waits_for_a_busy_child"] >= 0.5 > cpu["test_idle"]


def test_the_import_check_names_a_module_that_does_not_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg_under_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text("VALUE = 1\n")
    (package / "bad.py").write_text("import no_such_distribution_here\n")
    sys.path.insert(0, str(tmp_path))
    try:
        imported, failed = import_every_module("pkg_under_test")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("pkg_under_test")]:
            del sys.modules[name]
    assert imported == 2  # the package and good
    assert len(failed) == 1 and failed[0].startswith("pkg_under_test.bad: ModuleNotFoundError")


AUDITED = textwrap.dedent(
    """
    import threading

    import pytest
    from data_designer.fake import compile_columns

    def test_calls_data_designer_unmarked():
        assert compile_columns() == 1

    def test_calls_it_from_a_thread_unmarked():
        worker = threading.Thread(target=compile_columns)
        worker.start()
        worker.join()

    @pytest.mark.dd
    def test_calls_data_designer_marked():
        assert compile_columns() == 1

    def test_never_calls_it():
        assert compile_columns is not None
    """
)


def test_the_dd_audit_names_each_unmarked_test_that_calls_data_designer_and_fails_the_session(tmp_path: Path) -> None:
    site = tmp_path / "site" / "data_designer"  # a module whose path holds data_designer/, as the real ones do
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "fake.py").write_text("def compile_columns():\n    return 1\n")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_audited.py").write_text(AUDITED)
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    dd: engine\n")
    args = ["-p", "no:cacheprovider", "-p", "no:xdist", "-p", "tools.pytest_dd_audit", "-q", str(suite)]
    env = {"PYTHONPATH": f"{REPO}:{tmp_path / 'site'}", "PATH": "/usr/bin:/bin"}
    audited = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--dd-audit"],
        cwd=suite, capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert audited.returncode == 1, audited.stdout  # every test passed; the audit failed the session
    assert "4 passed" in audited.stdout
    named = [line.strip() for line in audited.stdout.splitlines() if line.startswith("  test_audited.py::")]
    assert named == [
        "test_audited.py::test_calls_data_designer_unmarked",
        "test_audited.py::test_calls_it_from_a_thread_unmarked",
    ]
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=suite, capture_output=True, text=True, timeout=120, check=False,
        env=env,
    )  # fmt: skip
    assert plain.returncode == 0 and "dd-audit" not in plain.stdout  # off unless asked for


def test_no_two_runtime_test_files_serve_under_the_same_job_id() -> None:
    """Servers' ports derive from the job id: two test files using one id on two workers at once pick the same free
    port and one of them fails to bind ("Address already in use": seen in a full run)."""
    import re
    from collections import defaultdict

    files: dict[str, set[str]] = defaultdict(set)
    for path in sorted((REPO / "packages" / "runtime" / "tests").glob("test_*.py")):
        for job in set(re.findall(r'"(9\d{3})"', path.read_text())):
            files[job].add(path.name)
    shared = {job: sorted(names) for job, names in files.items() if len(names) > 1}
    assert shared == {}, shared
    assert len(files) > 10  # the scan found the job ids


# Recorded from `sacct -a -S ... -E ... -P --noheader --format=JobID,JobName,State,TotalCPU,WorkDir%400` on the local
# cluster after a make test (a collection job, a pulling allocation whose steps were cancelled, one minute-long step).
SACCT = """\
14265|ddslurm-collect-t|COMPLETED|00:00.211|/tmp/pytest-of-root/pytest-955/popen-gw2/test_hosted_only_run_end_to_en0/e2e/work/runs/t-20261205-145023-f57e03
14265.batch|batch|COMPLETED|00:00.211|
14294_0|ddslurm-t|FAILED|00:04.235|/tmp/pytest-of-root/pytest-955/popen-gw5/test_pulling_allocations_keep_0/pull/work/runs/t-20261205-145126-c34603
14294_0.batch|batch|CANCELLED|00:00.484|
14294_0.0|server-generator-0|CANCELLED|00:00.183|
14294_0.1|server-generator-1|CANCELLED|00:00.175|
14294_0.2|proxy-generator|COMPLETED|00:00.297|
14294_0.3|client-0|CANCELLED by 0|00:01.221|
14294_0.4|client-2|CANCELLED|01:01.213|
14300|ddslurm-demo|COMPLETED|1-00:00:02|/work/main/.ddslurm-work/runs/demo-20261205-145200-abcdef
14300.0|client|COMPLETED|1-00:00:02|
"""  # fmt: skip


def test_sacct_times_read_as_seconds() -> None:
    assert sacct_seconds("00:00.211") == pytest.approx(0.211)
    assert sacct_seconds("01:01.213") == pytest.approx(61.213)
    assert sacct_seconds("02:01:01") == 7261
    assert sacct_seconds("1-00:00:02") == 86402


def test_the_slurm_split_gives_each_step_its_kind_and_its_jobs_test() -> None:
    steps = parse_sacct(SACCT)
    assert [s.name for s in steps] == ["batch", "batch", "server-generator-0", "server-generator-1",
                                       "proxy-generator", "client-0", "client-2", "client"]  # fmt: skip
    assert [step_kind(s) for s in steps] == ["collections", "controllers (batch steps)", "model servers",
                                             "model servers", "proxies", "clients", "clients", "clients"]  # fmt: skip
    assert steps[5].state == "CANCELLED" and steps[5].job_name == "ddslurm-t"
    assert {step_test(s.workdir) for s in steps} == {
        "test_hosted_only_run_end_to_en0", "test_pulling_allocations_keep_0",
        "/work/main/.ddslurm-work/runs/demo-20261205-145200-abcdef",
    }  # fmt: skip
    out = io.StringIO()
    slurm_report(steps, {"label": "make test", "start": "S", "end": "E"}, 5, out)
    text = out.getvalue()
    total = 0.211 + 0.484 + 0.183 + 0.175 + 0.297 + 1.221 + 61.213 + 86402
    assert f"8 steps of 3 jobs spent {total:.0f} CPU-seconds" in text
    clients = 1.221 + 61.213 + 86402
    assert f"{clients:8.1f} CPU-s      3 steps  {clients / 3:5.2f} each  clients" in text
    pulling = 0.484 + 0.183 + 0.175 + 0.297 + 1.221 + 61.213
    assert f"{pulling:8.1f} CPU-s    2 clients     6 steps  test_pulling_allocations_keep_0" in text


def test_the_run_records_its_window_for_the_slurm_split(tmp_path: Path) -> None:
    window = tmp_path / "times" / "window.json"
    assert suite_times_main(["run", "--label", "t", "--window-file", str(window), "--", sys.executable, "-c", ""]) == 0
    recorded = json.loads(window.read_text())
    assert recorded["label"] == "t" and recorded["start"] <= recorded["end"]
    assert len(recorded["start"]) == len("2026-12-05T14:50:00")


def test_last_prints_again_the_line_the_run_ended_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    window = tmp_path / "window.json"
    argv = ["--label", "t", "--window-file", str(window), "--", sys.executable, "-c", "raise SystemExit(3)"]
    assert suite_times_main(["run", *argv]) == 3
    ended = capsys.readouterr().out.strip().splitlines()[-1]
    assert ended.startswith("t: ") and ended.endswith("; exit 3"), ended
    assert suite_times_main(["last", "--window-file", str(window)]) == 0
    assert capsys.readouterr().out.strip() == ended
    assert suite_times_main(["last", "--window-file", str(tmp_path / "none.json")]) == 1
    assert "no run recorded yet" in capsys.readouterr().err
