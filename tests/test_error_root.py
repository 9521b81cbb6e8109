"""One error root: every error class of every package's ``errors`` module derives from ``DdslurmError``, and an
error of each package reaches ``ddslurm``'s ``main`` as ``error: ...`` with the exit code and ``--json`` code that
docs/cli.md documents for it (``ddslurm.launcher.commands._output`` decides both, for every package)."""

from __future__ import annotations

import importlib
import inspect
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddslurm.collector.errors import MissingWinnersError
from ddslurm.config import ConfigFileError, DdslurmError
from ddslurm.launcher import Slurm, api
from ddslurm.launcher.cli import main
from ddslurm.launcher.errors import SlurmError
from ddslurm.launcher.testing import FakeSlurm
from ddslurm.planner.errors import LimitError
from ddslurm.providers.errors import ResolutionError
from ddslurm.runtime.errors import InputsError
from tests.test_cli_docs import _table

ROOT = Path(__file__).resolve().parents[1]


def _errors_modules() -> list[str]:
    """``ddslurm.<package>.errors`` of every package of the workspace (found on disk, so a new one is included)."""
    return sorted(
        f"ddslurm.{path.parent.name}.errors" for path in (ROOT / "packages").glob("*/src/ddslurm/*/errors.py")
    )


def test_every_packages_errors_module_is_found() -> None:
    assert _errors_modules() == [
        f"ddslurm.{name}.errors" for name in ("collector", "config", "launcher", "planner", "providers", "runtime")
    ]


@pytest.mark.parametrize("module_name", _errors_modules())
def test_every_error_class_of_an_errors_module_is_a_ddslurm_error(module_name: str) -> None:
    """Every exception class an ``errors`` module defines (its roots included) derives from ``DdslurmError``, so
    ``except DdslurmError`` catches whatever any package raises; a new root of ``Exception`` fails here."""
    module = importlib.import_module(module_name)
    defined = [
        kind
        for _, kind in inspect.getmembers(module, inspect.isclass)
        if kind.__module__ == module_name and issubclass(kind, BaseException)
    ]
    assert defined, f"{module_name} defines no error"
    assert [kind.__name__ for kind in defined if not issubclass(kind, DdslurmError)] == []


def _documented_exit(code: str) -> int:
    """The exit code docs/cli.md's table "Error codes" (under "Errors") gives the error code ``code``."""
    exits = {name.strip("`"): exit_code for name, exit_code, _ in _table("Errors")}
    return int(exits[code])


REPRESENTATIVES = [
    pytest.param(
        lambda: ConfigFileError("run.yaml", "expected int, got str", line=3, col=1, field="shards"),
        "invalid_input",
        id="config",
    ),
    pytest.param(lambda: ResolutionError(["model alias 'writer' has no provider"]), "providers", id="providers"),
    pytest.param(lambda: LimitError("2 arrays of 2000 tasks exceed MaxArraySize 1001"), "failed", id="planner"),
    pytest.param(lambda: SlurmError(["squeue"], 1, "slurm_load_jobs error"), "slurm", id="launcher"),
    pytest.param(lambda: InputsError("plan.json: sha256 differs from the plan"), "failed", id="runtime"),
    pytest.param(lambda: MissingWinnersError([0, 2]), "collect_failed", id="collector"),
]


@pytest.mark.parametrize(("make", "code"), REPRESENTATIVES)
def test_an_error_of_each_package_reaches_main_as_its_documented_error(
    make: Callable[[], DdslurmError], code: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``status`` raising the package's error: ``error: MESSAGE`` on stderr, the exit code docs/cli.md gives the
    error's code, and with ``--json`` that code and exit code in the error object on stdout."""

    def raises(*_: Any, **__: Any) -> Any:
        raise make()

    monkeypatch.setattr(api, "open_run", raises)  # where `status` finds the run
    expected = _documented_exit(code)
    message = str(make())

    for as_json in (False, True):
        out, err = io.StringIO(), io.StringIO()
        argv = ["status", str(tmp_path), *(["--json"] if as_json else [])]
        exit_code = main(argv, env={}, slurm=Slurm(FakeSlurm(), env={}), stdout=out, stderr=err, sleep=lambda _: None)
        assert (exit_code, err.getvalue()) == (expected, f"error: {message}\n"), as_json
        if as_json:
            error = json.loads(out.getvalue())["error"]
            assert (error["code"], error["message"], error["exit_code"]) == (code, message, expected)
        else:
            assert out.getvalue() == ""
