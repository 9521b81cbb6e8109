"""docs/cli.md documents exactly the exit codes and the JSON error codes ``ddslurm`` has, the panels of its
``--help``, and is linked."""

from __future__ import annotations

import re
from pathlib import Path

from ddslurm.launcher.cli import PANELS
from ddslurm.launcher.commands._output import ErrorCode, ExitCode

ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"


def _table(section: str) -> list[list[str]]:
    """The rows of the first table under ``## <section>`` in docs/cli.md (header and rule left out)."""
    text = CLI_DOC.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    lines = text[start : end if end != -1 else len(text)].splitlines()
    rows = [line for line in lines if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[2:]]


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
