"""A pytest plugin that finds the tests which use Data Designer without the ``dd`` marker.

``make test-dd-range`` runs, under each supported Data Designer, only the tests of its paths marked ``dd``: a test
that calls Data Designer's code (its engine, its config classes) unmarked runs under the workspace's version alone.
With ``--dd-audit``, every test not marked ``dd`` runs under a profile hook (``sys.setprofile`` and
``threading.setprofile``) that notes a call into a module under ``data_designer/``; the session fails and lists
those tests. The processes a test starts are not followed (those of ``ddslurm-runtime`` import Data Designer when
they answer ``inspect`` or run a client: such tests are marked by what they start).

    uv run pytest -p tools.pytest_dd_audit --dd-audit -m "not dd" -p no:xdist packages/runtime/tests

The hook slows the tests it watches several-fold: an audit, not a lane of CI."""

from __future__ import annotations

import sys
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest

PACKAGE_DIR = "/data_designer/"
"""What the path of a Data Designer module holds (its three distributions install under ``data_designer``)."""


class _Calls:
    """Whether the test under way called into Data Designer (set from any thread)."""

    def __init__(self) -> None:
        self.seen = False

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and not self.seen and PACKAGE_DIR in frame.f_code.co_filename:
            self.seen = True


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--dd-audit",
        action="store_true",
        default=False,
        help="fail the session if a test not marked dd calls Data Designer's code (tools/pytest_dd_audit.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--dd-audit"):
        return
    if getattr(config.option, "numprocesses", None):
        raise pytest.UsageError("--dd-audit watches the tests in this process: run it without -n (-p no:xdist)")
    config.pluginmanager.register(_Audit(), "dd-audit")


class _Audit:
    def __init__(self) -> None:
        self.unmarked: list[str] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
        if item.get_closest_marker("dd") is not None:
            yield
            return
        calls = _Calls()
        sys.setprofile(calls.hook)
        threading.setprofile(calls.hook)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        if calls.seen:
            self.unmarked.append(item.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.unmarked:
            terminalreporter.write_line(f"dd-audit: {len(self.unmarked)} test(s) call Data Designer without @dd:")
            for nodeid in self.unmarked:
                terminalreporter.write_line(f"  {nodeid}")
        else:
            terminalreporter.write_line("dd-audit: every test that calls Data Designer is marked dd")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.unmarked and exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
