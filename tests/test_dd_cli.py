"""Data Designer compatibility: DD's own CLI still starts where ddslurm is installed, and the range of DD versions
the runtime accepts is the range CI tests (``make test-dd-range``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
DATA_DESIGNER = Path(sys.executable).parent / "data-designer"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--help"], id="help"),
        pytest.param(["preview", "--help"], id="preview"),
        pytest.param(["create", "--help"], id="create"),
        pytest.param(["validate", "--help"], id="validate"),
    ],
)
def test_data_designers_cli_starts(args: list[str], tmp_path: Path) -> None:
    """typer 0.29 broke ``data-designer preview`` and ``create`` (``Option() got an unexpected keyword argument
    'click_type'``): the workspace locks a typer DD's CLI runs with."""
    env = {
        **os.environ,
        "DATA_DESIGNER_HOME": str(tmp_path / "dd-home"),
        "NEMO_TELEMETRY_ENABLED": "false",
        "DATA_DESIGNER_DISABLE_VERSION_CHECK": "1",
    }
    done = subprocess.run(
        [str(DATA_DESIGNER), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Usage" in done.stdout and "Traceback" not in done.stdout + done.stderr


def _requirement(package: str, distribution: str) -> str:
    """The version specifiers with which ddslurm-``package`` requires ``distribution``."""
    deps = tomllib.loads((REPO / "packages" / package / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(rf"{distribution}(?![\w-])", d))
    return spec.replace(" ", "").removeprefix(distribution)


def test_one_data_designer_range_is_stated_and_every_package_requires_it() -> None:
    """``ddslurm.config.DATA_DESIGNER_VERSIONS`` is the range: what ``doctor`` accepts in ``python_env``, and what
    the runtime and the launcher require of ``data-designer`` and the providers of ``data-designer-config`` (the
    launcher is not pinned: it installs beside any supported Data Designer)."""
    from ddslurm.config import DATA_DESIGNER_VERSIONS

    assert _requirement("runtime", "data-designer") == DATA_DESIGNER_VERSIONS
    assert _requirement("launcher", "data-designer") == DATA_DESIGNER_VERSIONS
    assert _requirement("providers", "data-designer-config") == DATA_DESIGNER_VERSIONS


def test_the_supported_data_designer_range_is_the_one_ci_tests() -> None:
    """``ddslurm-runtime`` accepts ``data-designer>=OLDEST,<UPPER``; ``make test-dd-range`` runs the runtime's
    tests against OLDEST and NEWEST, the newest release below UPPER, which is NEWEST's next minor release (so
    widening the range means testing the new bound). NEWEST may be a pre-release: pip and uv take it only when
    asked for by its version, and take the final release of its series without a change here."""
    spec = _requirement("runtime", "data-designer")
    match = re.fullmatch(r"(>=[\d.]+,<[\d.]+)", spec)
    assert match, f"expected data-designer>=OLDEST,<UPPER, got {spec!r}"
    accepted = SpecifierSet(match.group(1), prereleases=True)
    makefile = (REPO / "Makefile").read_text()
    bounds = dict(re.findall(r"^(DD_OLDEST|DD_NEWEST)\s*:?=\s*(\S+)", makefile, re.MULTILINE))
    oldest, newest = Version(bounds["DD_OLDEST"]), Version(bounds["DD_NEWEST"])
    lower = next(Version(s.version) for s in accepted if s.operator == ">=")
    upper = next(Version(s.version) for s in accepted if s.operator == "<")
    assert oldest == lower and newest in accepted
    assert upper.release[:2] == (newest.major, newest.minor + 1), f"{spec}: the upper bound is not after {newest}"
    assert "test-dd-range" in (REPO / ".ci" / "run").read_text()
