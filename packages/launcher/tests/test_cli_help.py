"""``ddslurm --help`` as Data Designer's CLI shows its own: the commands in panels by job, each command's help ending
with Examples whose command lines parse against the app, and prose that Rich wraps to the terminal (never a
docstring's line break in the middle of a sentence)."""

from __future__ import annotations

import inspect
import re

import pytest
import typer
from typer.main import get_command

from ddslurm.config.cli import examples
from ddslurm.config.testing import parse_only
from ddslurm.launcher.cli import app, main
from ddslurm.launcher.commands._output import ExitCode

GROUPS = {
    "Start a run": ["init", "doctor", "providers", "tune", "submit"],
    "Follow a run": ["status", "wait", "logs", "report", "list"],
    "Steer and collect": ["cancel", "retry", "accept-partial", "collect", "workflow"],
}
"""The panels of ``ddslurm --help``, in order, and the commands of each, in order."""


def _help(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, width: int) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(argv) == ExitCode.OK
    return capsys.readouterr().out


def _panels(text: str) -> dict[str, list[str]]:
    """Each panel of a Rich help page: its title and the names in its first column, in order."""
    panels: dict[str, list[str]] = {}
    rows: list[str] = []
    for line in text.splitlines():
        if title := re.match(r"╭─ (.+?) ─", line):
            rows = panels.setdefault(title.group(1), [])
        elif name := re.match(r"│ (\S+)", line):
            rows.append(name.group(1))
    return panels


def _commands() -> dict[str, typer.core.TyperCommand]:
    return get_command(app).commands  # type: ignore[attr-defined,no-any-return]


def test_the_help_groups_every_command_in_exactly_one_panel_by_job(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    panels = _panels(_help(["--help"], capsys, monkeypatch, 120))
    commands = {name: rows for name, rows in panels.items() if name not in {"Options", "Arguments"}}
    assert commands == GROUPS  # no flat "Commands" panel left
    listed = [name for rows in commands.values() for name in rows]
    assert sorted(listed) == sorted(_commands()) and len(listed) == len(set(listed))


def test_each_command_line_of_the_panels_is_its_first_paragraph_on_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first paragraph the docstring breaks over lines is one sentence in the panel (Typer's "rich" mode would keep
    the break: ``array task,`` and, on a line of its own, ``Slurm's state and why it failed.``)."""
    text = _help(["--help"], capsys, monkeypatch, 500)
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(r"^│ (\S+) +(.*?)│$", text, re.M)}
    for name, command in _commands().items():
        doc = inspect.getdoc(command.callback)
        assert doc is not None, name
        first = " ".join(doc.split("\n\n")[0].split())
        assert rows[name] == first, name


def test_every_command_has_examples_and_each_parses_against_the_app(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    group = get_command(app)
    for name, command in _commands().items():
        text = _help([name, "--help"], capsys, monkeypatch, 200)
        lines = examples(command.help)
        assert re.search(r"^ Examples: *$", text, re.M) and lines, f"{name} --help shows no Examples"
        for line in lines:
            shown = re.search(rf"^ {{5}}{re.escape(line)} *$", text, re.M)  # indented under its heading, as written
            assert shown, f"{name} --help does not show `{line}`"
            prog, *argv = line.split()
            assert prog == "ddslurm" and argv[0] == name, f"{name}: the example `{line}` runs another command"
            parse_only(group, argv, prog=prog)  # raises where an option, a value or an argument is wrong


def test_an_example_that_does_not_parse_is_refused() -> None:
    """What the examples are held to: an option the command lacks, a value of the wrong type, a missing argument."""
    group = get_command(app)
    for argv in (["status", "run-dir", "--bogus"], ["wait", "run-dir", "--timeout", "soon"], ["logs"]):
        with pytest.raises(typer.TyperException):
            parse_only(group, argv, prog="ddslurm")


def test_a_later_paragraph_is_wrapped_by_rich_not_by_the_docstring(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _help(["retry", "--help"], capsys, monkeypatch, 300)
    # the docstring breaks this sentence after "still"; wide enough, Rich prints it whole
    assert "and nothing is submitted while it still refuses it; a retry of only shards" in text
