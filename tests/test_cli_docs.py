"""docs/cli.md lists exactly the commands, the exit codes and the JSON error codes ``ddslurm`` has, in Markdown
tables, and the panels of its ``--help``, and is linked."""

from __future__ import annotations

import re
from pathlib import Path

from ddslurm.launcher.cli import PANELS, app
from ddslurm.launcher.commands._output import ErrorCode, ExitCode
from tests.test_docs import table_cells

ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"


def _table(section: str | None) -> list[list[str]]:
    """The rows of the first table under ``## <section>`` in docs/cli.md (None: above the first ``##``), header and
    rule left out."""
    text = CLI_DOC.read_text()
    start = 0 if section is None else text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    lines = text[start : end if end != -1 else len(text)].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    count = next((i for i, line in enumerate(lines[first:]) if not line.startswith("|")), len(lines) - first)
    return [table_cells(row) for row in lines[first + 2 : first + count]]


def test_the_command_table_lists_every_command() -> None:
    """The page opens with a Markdown table (a code block of command lines wraps them on a phone): one row per
    command line, its synopsis in backticks (tests/test_docs.py parses each), every command of the app in it."""
    rows = _table(None)
    assert all(len(row) == 2 and re.fullmatch(r"`ddslurm [^`]+`", row[0]) and row[1] for row in rows), rows
    named = {row[0].strip("`").split()[1] for row in rows}
    commands = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    assert named == commands | {"--version"}
    intro = CLI_DOC.read_text().split("\n## ", 1)[0]
    assert "```" not in intro, "docs/cli.md lists its commands in a code block again"


def test_the_exit_code_table_is_the_exit_code_enum() -> None:
    documented = {int(code): name.strip("`") for code, name, _ in _table("Exit codes")}
    assert documented == {int(code): code.name.lower() for code in ExitCode}


def test_the_error_code_table_is_the_error_code_enum() -> None:
    documented = [code.strip("`") for code, *_ in _table("Errors")]
    assert sorted(documented) == sorted(str(code) for code in ErrorCode)
    assert len(documented) == len(set(documented))


def test_the_cli_document_is_linked() -> None:
    for doc in (ROOT / "README.md", ROOT / "docs" / "architecture.md"):
        assert re.search(r"\]\((docs/)?cli\.md\)", doc.read_text()), f"{doc} does not link docs/cli.md"


def test_the_panels_the_page_names_are_the_apps() -> None:
    """The page's "groups the commands by job: **Panel** (`a`, `b`), ..." is ``ddslurm --help``'s panels."""
    text = " ".join(CLI_DOC.read_text().split())
    start = text.index("groups the commands by job:")
    named = re.findall(r"\*\*([^*]+)\*\* \(([^)]*)\)", text[start : text.index(";", start)])
    assert [(title, [c.strip(" `") for c in names.split(",")]) for title, names in named] == [
        (title, [name for name, _ in commands]) for title, commands in PANELS
    ]
