"""``ddslurm-config check``: the resolved file (YAML, or JSON with --json), its problems as ``error:`` lines and exit
2, and a Rich --help whose examples parse."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import typer
from typer.main import get_command

from ddslurm.config import load_profile, load_run_file
from ddslurm.config.cli import app, examples, help_text, main
from ddslurm.config.testing import parse_only

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

RUN_TEXT = "name: demo\nrecipe: r.yaml\nnum_records: 4\n"


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(RUN_TEXT, encoding="utf-8")
    return path


def test_check_prints_the_run_file_with_every_default_as_yaml_that_loads_back(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(run_file)]) == 0

    out = capsys.readouterr().out
    assert out.startswith("name: demo\nrecipe: r.yaml\nnum_records: 4\nshards: 1\n")  # the fields in their order
    assert "\n  time_limit: 01:00:00\n" in out and "\nmax_concurrent: null\n" in out  # defaults, unset as null
    assert load_run_file(run_file, text=out) == load_run_file(run_file)  # what it says is the file ddslurm loads


def test_check_json_prints_the_run_file_with_defaults(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(run_file), "--json"]) == 0

    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(msgspec.json.encode(load_run_file(run_file)))
    assert out["shards"] == 1 and out["submission"]["time_limit"] == "01:00:00"
    assert list(out) == sorted(out)


def test_check_profile_resolves_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("workspace: ws\npython_env: /env\n", encoding="utf-8")

    assert main(["check", "--kind", "profile", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workspace"] == str(tmp_path.resolve() / "ws")

    assert main(["check", "--kind", "profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"\nworkspace: {tmp_path.resolve() / 'ws'}\n" in out
    assert load_profile(path, text=out) == load_profile(path)


def test_check_reports_each_problem_at_its_line_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("name: demo\nrecipe: r.yaml\nnum_records: 0\nshards: x\n", encoding="utf-8")

    assert main(["check", str(path)]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"error: {path}:3:1: num_records: expected int >= 1\nerror: {path}:4:1: shards: expected int, got str\n"
    )


def test_check_json_reports_the_problems_as_an_error_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("name: demo\nrecipe: r.yaml\nnum_records: 0\n", encoding="utf-8")

    assert main(["check", str(path), "--json"]) == 2

    captured = capsys.readouterr()
    assert captured.err == f"error: {path}:3:1: num_records: expected int >= 1\n"
    problem = {"file": str(path), "line": 3, "col": 1, "field": "num_records", "message": "expected int >= 1"}
    message = f"{path}:3:1: num_records: expected int >= 1"
    error = {"code": "invalid_input", "message": message, "exit_code": 2, "problems": [problem]}
    assert json.loads(captured.out) == {"error": error}


def test_a_missing_file_is_an_error_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'nope.yaml'}: cannot read")


def test_a_command_line_that_does_not_parse_is_a_usage_error(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(run_file), "--kind", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Try 'ddslurm-config check --help' for help." in err
    assert "error: Invalid value for '--kind': 'nope' is not one of 'run', 'profile'." in err

    assert main(["check", "--kind", "nope", str(run_file), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "usage"


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["check", "-h"]])
def test_help_is_rich_with_no_restructured_text(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(argv) == 0

    out = capsys.readouterr().out
    assert "╭─ Options" in out  # Rich's panels, as ddslurm --help draws them
    assert "``" not in out and ":func:" not in out and ":class:" not in out
    if "check" in argv:
        assert "Examples:" in out
        assert "ddslurm-config check profile.yaml --kind profile --json" in out
        # a paragraph is one line wrapped by Rich, never the docstring's own line breaks
        assert "Every problem of the file is one line, error: FILE:LINE:COL: field: message" in " ".join(out.split())


def test_check_has_examples_and_each_parses() -> None:
    command = get_command(app)
    check = command.commands["check"]  # type: ignore[attr-defined]
    lines = examples(check.help)
    assert len(lines) >= 2
    for line in lines:
        prog, *argv = line.split()
        assert prog == "ddslurm-config" and argv[0] == "check", line
        parse_only(command, argv, prog=prog)
    with pytest.raises(typer.TyperException):  # the parse does refuse what the app refuses
        parse_only(command, ["check", "run.yaml", "--kind", "nope"], prog="ddslurm-config")


def test_help_text_joins_prose_and_keeps_the_examples() -> None:
    doc = """First line
    goes on.

    Second paragraph
    goes on too.

    Examples:
        # a comment
        tool run x

        tool run y
    """
    assert help_text(doc) == (
        "First line goes on.\n\nSecond paragraph goes on too.\n\n"
        "Examples:\n    # a comment\n    tool run x\n\n    tool run y"
    )
    assert examples(help_text(doc)) == ["tool run x", "tool run y"]
    # after a first paragraph alone, a blank line first (Typer's cleandoc would take the indentation away)
    assert help_text("One.\n\nExamples:\n    tool x\n") == "One.\n\n\nExamples:\n    tool x"
    assert inspect.cleandoc(help_text("One.\n\nExamples:\n    tool x\n").split("\n\n", 1)[1]) == "Examples:\n    tool x"
    assert examples("No examples.") == []


def test_python_m_runs_the_command(run_file: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ddslurm.config.cli", "check", str(run_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("name: demo\n")
