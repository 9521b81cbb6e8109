"""A pytest plugin that keeps every test's duration: one JSON line a test, in the file ``--times-file`` names.

Each line holds the test's node id, its file, its markers, its outcome, its seconds (setup, call and teardown
together, as pytest's own reports measure them) and its CPU-seconds on the submit side: those of the process that
ran it and of every process it started and waited for (the ``ddslurm`` commands, ``runtime inspect``, the local
stand-ins), measured by the worker around each phase (``getrusage``); the Slurm jobs a test submits are slurmd's
children, not the test's, and are not in it. ``tools/suite_times.py`` lists the slowest and costliest tests and the
seconds by file and by marker. With pytest-xdist the workers' reports reach the controller, which alone writes the
file. ``make test`` loads it (``-p tools.pytest_times --times-file .test-times/durations.jsonl``)."""

from __future__ import annotations

import json
import resource
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

PLUGIN_NAME = "ddslurm-test-times"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--times-file", default=None, help="write every test's seconds, markers and outcome to this JSON-lines file"
    )


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("--times-file")
    if not target:
        return
    config.pluginmanager.register(PhaseCpu(), f"{PLUGIN_NAME}-cpu")  # where the tests run: a worker, or alone
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes
        declared = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
        config.pluginmanager.register(TestTimes(Path(target), declared), PLUGIN_NAME)


def cpu_s() -> float:
    """CPU-seconds of this process and of every child it waited for, so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class PhaseCpu:
    """Puts each phase's CPU-seconds in its report (``user_properties``, which pytest-xdist carries to the
    controller): the CPU spent since the test began or its previous phase ended."""

    def __init__(self) -> None:
        self._mark = cpu_s()

    def pytest_runtest_logstart(self) -> None:
        self._mark = cpu_s()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self) -> Generator[None, Any, None]:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        now = cpu_s()
        report.user_properties.append(("cpu_s", round(now - self._mark, 3)))
        self._mark = now


def plain_nodeid(nodeid: str) -> str:
    """The test's own id: ``nodeid`` without the ``@group`` pytest-xdist appends under ``--dist loadgroup`` (a
    parameter's ``@`` stays: the group comes after the closing bracket)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


class TestTimes:
    """Sums each test's phases as their reports arrive; writes the file, slowest first, when the session ends."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, path: Path, markers: set[str]) -> None:
        self._path = path
        self._markers = markers
        self._tests: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = plain_nodeid(report.nodeid)
        entry = self._tests.setdefault(
            test,
            {"test": test, "file": test.split("::", 1)[0], "markers": [], "outcome": "passed", "s": 0.0, "cpu_s": 0.0},
        )
        entry["s"] = round(entry["s"] + report.duration, 3)
        cpu = sum(v for name, v in report.user_properties if name == "cpu_s" and isinstance(v, (int, float)))
        entry["cpu_s"] = round(entry["cpu_s"] + cpu, 3)
        if report.when == "setup":
            entry["markers"] = sorted(k for k in report.keywords if k in self._markers)
        if report.failed:
            entry["outcome"] = "failed"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        entries = sorted(self._tests.values(), key=lambda e: -e["s"])
        self._path.write_text("".join(json.dumps(e) + "\n" for e in entries))
