"""The documentation cannot drift from the code.

- docs/reference.md is what tools/gen_reference.py generates from the config Structs (and every field has a
  docstring to generate it from);
- docs/reasons.md lists exactly the reason codes the runtime and the launcher can write;
- the launcher box of docs/architecture.md lists exactly the commands of the Typer app, and its drawing has a box
  for every package, with its entry point, its subpackages and its floor;
- every ``ddslurm`` command line in a code block of README.md and docs/ parses against the Typer app, the
  ``make`` targets the docs name exist, and the commands the README walks through run as shown.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from types import ModuleType

import msgspec
import pytest

from ddslurm.launcher.cli import app, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the generated reference -----------------------------------------------------------------------------------


def test_the_reference_page_is_what_the_generator_writes() -> None:
    gen = _tool("gen_reference")
    assert (DOCS / "reference.md").read_text() == gen.render(), (
        "docs/reference.md is out of date: run `uv run python tools/gen_reference.py`"
    )


def test_every_field_of_the_config_structs_is_documented_in_the_code() -> None:
    gen = _tool("gen_reference")
    missing = []
    for _, cls, _ in gen.SECTIONS:
        docs = gen.attribute_docs(cls)
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        missing += [f"{cls.__name__}.{f.name}" for f in info.fields if not docs.get(f.name)]
    assert not missing, f"fields without an attribute docstring (the reference has no meaning for them): {missing}"


def test_the_reference_covers_every_struct_a_user_writes() -> None:
    """Every Struct reachable from RunFile and ClusterProfile has a section of its own."""
    gen = _tool("gen_reference")
    from ddslurm.config import ClusterProfile, RunFile

    reachable: set[type] = set()

    def walk(t: msgspec.inspect.Type) -> None:
        if isinstance(t, msgspec.inspect.StructType):
            if t.cls in reachable:
                return
            reachable.add(t.cls)
            for f in t.fields:
                walk(f.type)
        for inner in ("types", "item_type", "value_type"):
            value = getattr(t, inner, None)
            if isinstance(value, tuple):
                for u in value:
                    walk(u)
            elif value is not None:
                walk(value)

    walk(msgspec.inspect.type_info(RunFile))
    walk(msgspec.inspect.type_info(ClusterProfile))
    assert reachable == {cls for _, cls, _ in gen.SECTIONS}


def test_the_field_tables_of_run_files_name_only_real_fields() -> None:
    """docs/run-files.md explains the fields in its own tables: none of them may name a field the Structs lack
    (the complete list is the generated reference)."""
    from ddslurm.config import ClusterProfile, Deployment, RunFile, ServerSpec, Submission

    sections = {"## The run file": RunFile, "### `deployments[]`": Deployment, "### `submission`": Submission,
                "## The cluster profile": ClusterProfile}  # fmt: skip
    text = (DOCS / "run-files.md").read_text()
    stale = []
    for heading, cls in sections.items():
        start = text.index(f"\n{heading}\n")
        body = text[start + len(heading) + 2 :]
        table = re.search(r"(?:^\|.*\n)+", body, re.M)
        assert table is not None, heading
        for name in re.findall(r"^\| `([a-z_.]+)` \|", table.group(0), re.M):
            owner, field = (ServerSpec, name.removeprefix("server.")) if name.startswith("server.") else (cls, name)
            if field not in owner.__struct_fields__:
                stale.append(f"{heading}: {name}")
    assert not stale, f"docs/run-files.md names fields the config does not have: {stale}"


# --- reason codes ------------------------------------------------------------------------------------------------

RUNTIME_SRC = ROOT / "packages" / "runtime" / "src" / "ddslurm" / "runtime"
LAUNCHER_SRC = ROOT / "packages" / "launcher" / "src" / "ddslurm" / "launcher"
NOT_ATTEMPT_REASONS = {"_proxy.py", "_upstreams.py"}
"""Modules whose ``reason`` is something else: a proxy's upstream health."""


def _text(node: ast.expr | None) -> list[str]:
    """The reason strings an expression can evaluate to: constants, f-strings (values as ``N``), ``a or "b"``,
    conditional expressions."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(str(v.value) if isinstance(v, ast.Constant) else "N" for v in node.values)]
    if isinstance(node, ast.BoolOp):
        return [s for v in node.values for s in _text(v)]
    if isinstance(node, ast.IfExp):
        return [*_text(node.body), *_text(node.orelse)]
    return []


def _is_reason_target(target: ast.expr) -> bool:
    return isinstance(target, ast.Attribute) and target.attr == "reason"


def written_reasons() -> set[str]:
    """Every reason the runtime and the launcher can write into a record or derive in ``status``, read from their
    code: ``reason`` class attributes and assignments, ``reason=`` keywords, the values of ``*_REASONS`` tables
    and what ``slurm_reason`` / ``_requeued`` return."""
    found: set[str] = set()
    status = [LAUNCHER_SRC / "runs" / name for name in ("_status.py", "_status_scheduler.py", "_status_shards.py")]
    files = [*sorted(RUNTIME_SRC.glob("*.py")), *status, LAUNCHER_SRC / "runs" / "_steer.py"]
    for path in files:
        if path.name in NOT_ATTEMPT_REASONS:
            continue
        tree = ast.parse(path.read_text())
        for class_def in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in class_def.body:  # ``reason = "..."`` of a failure class
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "reason" for t in stmt.targets
                ):
                    found.update(_text(stmt.value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if _is_reason_target(target):
                        found.update(_text(node.value))
                    elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        for t, v in zip(target.elts, node.value.elts, strict=False):
                            if _is_reason_target(t):
                                found.update(_text(v))
                    elif (
                        isinstance(target, ast.Name)
                        and target.id.endswith("_REASONS")
                        and isinstance(node.value, ast.Dict)
                    ):
                        found.update(s for v in node.value.values for s in _text(v))
            elif isinstance(node, ast.keyword) and node.arg == "reason":
                found.update(_text(node.value))
            elif isinstance(node, ast.FunctionDef) and node.name in {"slurm_reason", "_requeued"}:
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and ret.value is not None:
                        value = ret.value.elts[0] if isinstance(ret.value, ast.Tuple) else ret.value
                        found.update(_text(value))
    # ``slurm_reason`` also returns ``state.state.lower()`` for Slurm's other failed end states.
    from ddslurm.launcher.runs import _status_scheduler, _status_shards

    found.update(s.lower() for s in _status_scheduler.FAILED - {"FAILED"} - _status_shards._SLURM_REASONS.keys())
    # Every RuntimeFailure's class-level reason, imported (the AST pass above sees the same, by name).
    from ddslurm.runtime import _controller, _serving, errors  # noqa: F401 (their classes register as subclasses)

    stack: list[type[errors.RuntimeFailure]] = [errors.RuntimeFailure]
    while stack:
        failure = stack.pop()
        found.add(failure.reason)
        stack.extend(failure.__subclasses__())
    return found - {""}


def documented_reasons() -> list[str]:
    rows = [line for line in (DOCS / "reasons.md").read_text().splitlines() if line.startswith("| `")]
    return [row.split("|")[1].strip().strip("`") for row in rows]


def test_the_reason_collector_finds_the_known_codes() -> None:
    """The collector itself works: it sees codes of each kind of source."""
    found = written_reasons()
    expected = {"rows_dropped", "output_exists", "not_claimed", "shard_cancelled", "winner_exists", "run_cancelled",
                "not_retried", "proxy_died", "killed (signal N)", "preempted", "winner_corrupt"}  # fmt: skip
    assert expected <= found


def test_every_reason_code_is_documented_once() -> None:
    documented = documented_reasons()
    assert len(documented) == len(set(documented)), "a reason is listed twice in docs/reasons.md"
    written = written_reasons()
    assert sorted(written - set(documented)) == [], "reasons the code writes that docs/reasons.md does not list"
    assert sorted(set(documented) - written) == [], "docs/reasons.md lists reasons the code no longer writes"


# --- the architecture's launcher box -----------------------------------------------------------------------------


def app_commands() -> set[str]:
    return {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}


def test_the_architecture_box_lists_every_command() -> None:
    """The launcher box's ``CLI: a, b, ...`` (continued in the same column on the lines below) is the app's
    commands."""
    lines = (DOCS / "architecture.md").read_text().splitlines()
    at = next((i for i, line in enumerate(lines) if "launcher  (ddslurm)" in line and "CLI: " in line), None)
    assert at is not None, "docs/architecture.md: the launcher box lost its `CLI: ...` line"
    column = lines[at].index("CLI: ") + len("CLI: ")
    text = lines[at][column:]
    for line in lines[at + 1 :]:
        more = line[column:].strip() if len(line) > column and not line[column - 1].strip() else ""
        if not re.fullmatch(r"[a-z-]+(, [a-z-]+)*,?", more):
            break
        text += " " + more
    listed = [c.strip() for c in text.split(",") if c.strip()]
    assert len(listed) == len(set(listed))
    assert set(listed) == app_commands()


def _drawing() -> list[str]:
    """The floor plan: the first code block under ``## Layers`` of docs/architecture.md."""
    text = (DOCS / "architecture.md").read_text()
    block = re.search(r"^## Layers\n+```\n(.*?)\n```", text, re.M | re.S)
    assert block is not None, "docs/architecture.md: no drawing under ## Layers"
    return block.group(1).splitlines()


def _boxes(lines: list[str]) -> dict[str, tuple[int, str, str]]:
    """Each package box of the drawing: its name, the line its title is on, its entry point (the ``(script)`` after
    the name) and the text inside it (the title's line and the lines below, between the same two walls)."""
    boxes: dict[str, tuple[int, str, str]] = {}
    for row, line in enumerate(lines):
        for title in re.finditer(r"│ ([a-z]+)\s+\((ddslurm[a-z-]*)\)", line):
            left = title.start()
            right = line.index("│", title.end())
            inside = []
            for below in lines[row:]:
                if len(below) <= right or below[left] != "│" or below[right] != "│":
                    break
                inside.append(below[left + 1 : right])
            boxes[title.group(1)] = (row, title.group(2), " ".join(inside))
    return boxes


def _layers() -> list[set[str]]:
    """The layers of the ``layers`` contract in .importlinter, top first, as package names."""
    contracts = configparser.ConfigParser()
    contracts.read(ROOT / ".importlinter")
    lines = contracts["importlinter:contract:layers"]["layers"].split("\n")
    return [{p.strip().removeprefix("ddslurm.") for p in line.split("|")} for line in lines if line.strip()]


def test_the_floor_plan_draws_every_package_its_entry_point_and_its_rooms_on_its_floor() -> None:
    """docs/architecture.md's drawing has one box per package of packages/, titled with the package's entry point
    (``[project.scripts]``); every subpackage (``report/``) is named in its package's box, and nothing else with a
    slash is; the boxes stand floor by floor as the ``layers`` import contract orders the packages (a layer's
    boxes side by side, above the layers they may import)."""
    boxes = _boxes(_drawing())
    packages = {d.name for d in (ROOT / "packages").iterdir() if (d / "pyproject.toml").is_file()}
    assert set(boxes) == packages
    for name, (_, script, inside) in boxes.items():
        project = msgspec.toml.decode((ROOT / "packages" / name / "pyproject.toml").read_bytes())
        assert script in project["project"]["scripts"], (name, script)
        source = ROOT / "packages" / name / "src" / "ddslurm" / name
        rooms = {d.name for d in source.iterdir() if (d / "__init__.py").is_file()}
        drawn = set(re.findall(r"([a-z_]+)/", inside))
        assert drawn == rooms, f"the {name} box names {sorted(drawn)}; its subpackages are {sorted(rooms)}"
    floors = [{boxes[p][0] for p in layer} for layer in _layers()]
    assert all(len(rows) == 1 for rows in floors), floors  # a layer's boxes side by side
    assert [min(rows) for rows in floors] == sorted(min(rows) for rows in floors), floors
    assert {p for layer in _layers() for p in layer} == packages


# --- the status table ----------------------------------------------------------------------------------------------


def test_the_status_tables_shown_in_the_docs_have_the_real_columns() -> None:
    from ddslurm.launcher.commands._console import shard_table

    tables = [[str(c.header) for c in shard_table([], boxed=False, staged=staged).columns] for staged in (False, True)]
    shown = [
        (page.name, re.split(r"\s{2,}", line.strip()))
        for page in PAGES
        for line in page.read_text().splitlines()
        if line.startswith("SHARD ")
    ]
    assert shown, "no status table is shown in the docs"
    for name, header in shown:  # a single-stage run's table, or a two-stage run's
        assert header in tables, f"{name}: the status table's columns are {tables[0]} (two stages: {tables[1]})"


# --- command lines in the docs -----------------------------------------------------------------------------------

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_PREFIX = re.compile(r"^\s*(?:\$\s+)?(?:uv run (?:--frozen )?)?ddslurm(?=\s|$)")


def table_cells(row: str) -> list[str]:
    """The cells of a Markdown table row, as Python-Markdown splits it: at each ``|`` outside a code span."""
    cells, cell, code = [], "", False
    for char in row.strip().removeprefix("|").removesuffix("|"):
        if char == "`":
            code = not code
        if char == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
    return [*cells, cell.strip()]


def documented_command_lines() -> Iterator[tuple[str, str]]:
    """(page, line) for every line of a code block that runs ``ddslurm``, as written (comments, descriptions
    after a wide gap, pipes and redirections cut off), and every table cell that is one such command line in
    backticks (docs/cli.md's command table)."""
    for page in PAGES:
        text = page.read_text()
        for match in _FENCE.finditer(text):
            if match.group(1) not in {"", "bash", "sh", "console", "shell"}:
                continue
            for raw in match.group(2).splitlines():
                if not _PREFIX.match(raw):
                    continue
                line = re.split(r"\s#\s|\s{3,}|\s\|\s|\s&\s*$|\s>", raw)[0].strip()
                yield page.relative_to(ROOT).as_posix(), line
        for row in re.findall(r"^\|.*\|$", _FENCE.sub("", text), re.M):
            for cell in table_cells(row):
                code = re.fullmatch(r"`([^`]+)`", cell)
                if code is not None and _PREFIX.match(code.group(1)):
                    yield page.relative_to(ROOT).as_posix(), code.group(1)


def as_argv(line: str) -> list[str]:
    """A documented command line as the argument vector it stands for: ``[--opt X]`` taken as given, and the
    first of ``a|b|c`` alternatives."""
    words = shlex.split(_PREFIX.sub("", line).replace("[", " ").replace("]", " "))
    return [w.split("|")[0] if "|" in w and not w.startswith("-") else w for w in words]


def with_help(argv: list[str]) -> list[str]:
    """``--help`` right after the command name (or first, for top-level options): click then parses the whole
    line, options and their arity included, and prints the help before it converts or runs anything."""
    commands = app_commands()
    at = next((i + 1 for i, w in enumerate(argv) if w in commands), 0)
    return [*argv[:at], "--help", *argv[at:]]


DOCUMENTED = sorted(set(documented_command_lines()))


def test_the_docs_show_ddslurm_command_lines() -> None:
    assert len(DOCUMENTED) > 20
    shown = {a for _, line in DOCUMENTED for a in as_argv(line)[:1]}
    assert app_commands() <= shown | {"accept-partial"}, "a command is never shown in a code block"


@pytest.mark.parametrize(("page", "line"), DOCUMENTED, ids=[f"{p}: {line}" for p, line in DOCUMENTED])
def test_each_documented_command_line_parses(page: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = io.StringIO()
    code = main(with_help(as_argv(line)), env={}, stdout=io.StringIO(), stderr=err)
    assert code == 0, f"{page}: `{line}` does not parse: {err.getvalue()}"
    assert "Usage:" in capsys.readouterr().out  # Typer prints the help itself


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in [*sorted(app_commands()), ""]:
        assert main([command, "--help"] if command else ["--help"], env={}, stderr=io.StringIO()) == 0
        assert "Usage:" in capsys.readouterr().out


def test_every_help_the_docs_mention_succeeds() -> None:
    mentioned = set()
    for page in PAGES:
        for m in re.finditer(r"`(?:uv run )?ddslurm ((?:[a-z-]+ )?)--help`", page.read_text()):
            mentioned.add(m.group(1).strip())
    assert "" in mentioned
    for command in mentioned:
        argv = [command, "--help"] if command and command != "COMMAND" else ["--help"]
        assert main(argv, env={}, stdout=io.StringIO(), stderr=io.StringIO()) == 0, argv


# --- make targets ------------------------------------------------------------------------------------------------


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z%_-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_the_readme_set_up_commands_are_make_targets() -> None:
    blocks = [m.group(2) for m in _FENCE.finditer((ROOT / "README.md").read_text())]
    first = [line.split("#")[0].split() for block in blocks[:2] for line in block.splitlines() if line.strip()]
    assert first == [["make", "demo"], ["make", "test"]]
    assert {"demo", "test"} <= make_targets()


def test_the_docs_name_the_sync_make_bootstrap_runs() -> None:
    """Every ``uv sync`` the README and the docs show is the one ``make bootstrap`` runs (the README said
    ``uv sync --locked``, which leaves the workspace's other packages out)."""
    recipe = re.search(r"^bootstrap:.*\n(?:\t.*\n)*", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None
    ran = re.findall(r"\$\(UV\) (sync[^\n]*)", recipe.group(0))
    assert len(ran) == 1, recipe.group(0)
    shown = {
        (page.name, m.group(1).strip()) for page in PAGES for m in re.finditer(r"\buv (sync[^`#\n]*)", page.read_text())
    }
    assert {name for name, _ in shown} >= {"README.md"}
    assert {(name, sync) for name, sync in shown if sync != ran[0].strip()} == set()


def test_every_make_target_the_docs_name_exists() -> None:
    targets = make_targets()
    named = {m.group(1) for page in PAGES for m in re.finditer(r"(?:`|^)make ([a-z][a-z-]*)", page.read_text(), re.M)}
    assert named, "no make target named in the docs"
    missing = sorted(n for n in named if not any(fnmatch(n, t.replace("%", "*")) for t in targets))
    assert not missing, f"make targets the docs name that the Makefile lacks: {missing}"


def test_make_help_lists_docs() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert re.search(r"^\s+docs\s", out, re.M)


# --- user pages and the tests -------------------------------------------------------------------------------------

DEVELOPER_PAGES = {"architecture.md", "testing.md"}
"""The pages for people who change ddslurm; every other page of docs/ is for people who use it."""
EVIDENCE_COLUMNS = {"Test", "Reproduced by"}
"""Table columns that name the test behind each row (docs/recipes.md's types, docs/reliability.md's faults)."""
_TEST_FILE = re.compile(r"(?<![\w.-])(?:[\w.-]+/)*tests/[\w./-]*|\btest_\w+\.py\b")


def user_text(page: Path) -> Iterator[str]:
    """The lines of a user page as its reader sees them: no HTML comment, and a table's evidence columns left out."""
    header: list[str] | None = None
    for line in re.sub(r"<!--.*?-->", "", page.read_text(), flags=re.S).splitlines():
        if not line.startswith("|"):
            header = None
            yield line
            continue
        cells = table_cells(line)
        if header is None:
            header = cells
        yield " | ".join(c for c, h in zip(cells, header, strict=False) if h not in EVIDENCE_COLUMNS)


def test_the_user_pages_send_no_one_to_a_test_file() -> None:
    """A page for users says what was tested, not which test file did it (``packages/launcher/tests/...`` means
    nothing to someone running ddslurm); the test behind a row may stand in a table's evidence column."""
    pages = [page for page in DOCS.glob("*.md") if page.name not in DEVELOPER_PAGES]
    assert len(pages) > 10
    named = [
        f"{page.name}: {found.group(0)}"
        for page in sorted(pages)
        for line in user_text(page)
        for found in _TEST_FILE.finditer(line)
    ]
    assert named == [], named
    evidence = [line for page in pages for line in (page.read_text().splitlines()) if "`tests/test_" in line]
    assert evidence, "the evidence columns name no test: the check would see none"


# --- the examples ------------------------------------------------------------------------------------------------


def comment_blocks(text: str) -> list[list[str]]:
    """The runs of whole-line ``#`` comments of a YAML file, each line without its ``#``."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        comment = re.match(r"\s*#\s?(.*)", line)
        if comment is not None:
            blocks[-1].append(comment.group(1))
        elif blocks[-1]:
            blocks.append([])
    return [block for block in blocks if block]


def test_the_examples_comments_are_whole_sentences() -> None:
    """Each comment of the example files (which the docs link and users copy) begins a sentence and closes every
    parenthesis it opens: the mixed example's header once began its second line in the middle of a sentence whose
    start had been replaced."""
    files = sorted((ROOT / "examples").rglob("*.yaml"))
    assert len(files) > 5
    cut = [
        f"{path.relative_to(ROOT)}: {block[0]!r}"
        for path in files
        for block in comment_blocks(path.read_text())
        if not re.match(r"[A-Z\"`]", block[0]) or " ".join(block).count("(") != " ".join(block).count(")")
    ]
    assert cut == [], cut


# --- commands run as the README shows them -----------------------------------------------------------------------

HOSTED_RUN = "examples/hosted-only/run.yaml"
LOCAL_PROFILE = "examples/local-profile.yaml"


def _demo_env(key: str | None) -> dict[str, str]:
    env = {"DATA_DESIGNER_HOME": str(ROOT / "examples" / "hosted-only" / "dd-home"), "PATH": "/usr/bin:/bin"}
    if key is not None:
        env["DEMO_HOSTED_API_KEY"] = key
    return env


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, env=env, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_providers_as_the_readme_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ddslurm providers RUN.yaml`` prints each alias and whether its key variable is set (never the value):
    exit 0 when submit would accept the providers, 1 with the key unset (still the table, marked UNSET)."""
    monkeypatch.chdir(ROOT)
    for name, value in _demo_env("a-demo-key-value").items():
        monkeypatch.setenv(name, value)
    code, out, _ = _run(["providers", HOSTED_RUN], _demo_env("a-demo-key-value"))
    assert code == 0 and "DEMO_HOSTED_API_KEY (set)" in out and "a-demo-key-value" not in out
    monkeypatch.delenv("DEMO_HOSTED_API_KEY")
    code, out, err = _run(["providers", HOSTED_RUN], _demo_env(None))
    assert code == 1 and "DEMO_HOSTED_API_KEY (UNSET)" in out and "unset or empty" in err


def test_the_version_as_the_cli_page_shows_it() -> None:
    code, out, _ = _run(["--version"], {})
    assert code == 0 and out.startswith("ddslurm ")


def test_config_check_of_the_examples() -> None:
    for path, kind in ((HOSTED_RUN, "run"), ("examples/mixed/run.yaml", "run"), (LOCAL_PROFILE, "profile")):
        proc = subprocess.run(
            [sys.executable, "-m", "ddslurm.config.cli", "check", path, "--kind", kind],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("name: ") or "\nname: " in proc.stdout, proc.stdout  # the file, resolved


@pytest.mark.slurm
def test_submit_dry_run_of_the_example_against_the_local_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ddslurm submit examples/hosted-only/run.yaml --profile examples/local-profile.yaml --dry-run``, as
    getting-started.md shows it: the plan and the sbatch calls, nothing written."""
    monkeypatch.chdir(ROOT)
    env = _demo_env("a-demo-key-value")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runs = ROOT / ".ddslurm-work" / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    code, out, err = _run(["submit", HOSTED_RUN, "--profile", LOCAL_PROFILE, "--dry-run"], env)
    assert code == 0, err
    assert "sbatch" in out and "a-demo-key-value" not in out
    assert (set(runs.iterdir()) if runs.is_dir() else set()) == before


@pytest.mark.slurm
def test_init_as_getting_started_shows_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ddslurm init --dir my-run`` writes both files from this cluster's sinfo; they load as submit loads them,
    and a second init refuses to replace them."""
    monkeypatch.chdir(tmp_path)
    import os

    env = dict(os.environ)
    code, out, err = _run(["init", "--dir", "my-run"], env)
    assert code == 0, err
    assert (tmp_path / "my-run" / "run.yaml").is_file() and (tmp_path / "my-run" / "profile.yaml").is_file()
    assert "ddslurm submit" in out
    code, _, err = _run(["init", "--dir", "my-run"], env)
    assert code == 1 and "--force" in err


def _section(page: Path, start: str, end: str) -> list[str]:
    """The code blocks of ``page`` between the headings (or lines) ``start`` and ``end``."""
    text = page.read_text()
    return [m.group(2) for m in _FENCE.finditer(text[text.index(start) : text.index(end)])]


@pytest.mark.slurm
def test_using_it_is_what_init_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's "Using it" runs ``init --example mixed --dir my-run``, then exactly the commands and comments it
    prints under ``uv run`` on the embedded cluster (the port aside: a free one each time); getting-started.md shows
    the same commands."""
    import json
    import os

    monkeypatch.chdir(tmp_path)
    readme = _section(ROOT / "README.md", "## Using it", "`RUN_DIR` may also be")
    init = ["init", "--example", "mixed", "--dir", "my-run"]
    assert readme[0].split("#")[0].split() == ["uv", "run", "ddslurm", *init]
    code, out, err = _run([*init, "--json"], {**os.environ, "UV": "uv"})
    assert code == 0, err
    steps = json.loads(out)["next"]
    printed = [line for step in steps for line in (f"# {step['comment']}", step["command"])]

    def same(lines: list[str]) -> list[str]:
        return [re.sub(r"--port \d+", "--port N", line) for line in lines]

    assert same(readme[1].splitlines()) == same(printed)
    started = _section(DOCS / "getting-started.md", "## On the local cluster", "## On a real cluster")
    shown = [re.sub(r"\s+# .*$", "", line) for line in started[2].splitlines()]
    assert same(shown) == same([step["command"] for step in steps])


# --- the column and processor types table ------------------------------------------------------------------------


def _dd_types() -> set[str]:
    """Every column type, sampler family, processor type and profiler of the installed Data Designer, as the
    table's first column names them (``llm-text``, ``sampler category``, ``processor drop_columns``...)."""
    import typing

    from data_designer.config.analysis.column_profilers import ColumnProfilerType
    from data_designer.config.column_types import ColumnConfigT
    from data_designer.config.processor_types import ProcessorConfigT
    from data_designer.config.sampler_params import SamplerType

    columns = {cls.model_fields["column_type"].default for cls in typing.get_args(ColumnConfigT)}
    processors = {str(cls.model_fields["processor_type"].default.value) for cls in typing.get_args(ProcessorConfigT)}
    return (
        columns - {"sampler"}  # a row per sampler family instead
        | {f"sampler {t.value}" for t in SamplerType}
        | {f"processor {p}" for p in processors}
        | {f"profiler {t.value}" for t in ColumnProfilerType}
    )


def _type_rows() -> dict[str, str]:
    """The rows of docs/recipes.md's table: type -> the test cell."""
    text = (DOCS / "recipes.md").read_text()
    body = text[text.index("\n## The table\n") :]
    table = re.search(r"(?:^\|.*\n)+", body, re.M)
    assert table is not None
    rows: dict[str, str] = {}
    for line in table.group(0).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        kind = " ".join(re.findall(r"`([^`]+)`", cells[0]))
        assert kind not in rows, f"docs/recipes.md: {kind} has two rows"
        rows[kind] = cells[-1]
    return rows


def test_the_types_table_lists_every_data_designer_type() -> None:
    rows, types = _type_rows(), _dd_types()
    assert len(types) > 25  # the enumeration found Data Designer's unions
    assert not types - set(rows), f"docs/recipes.md lacks rows for {sorted(types - set(rows))}"
    assert not set(rows) - types, f"docs/recipes.md has rows for types Data Designer lacks: {set(rows) - types}"


def test_every_row_of_the_types_table_names_a_test_that_exists() -> None:
    missing = []
    for kind, cell in _type_rows().items():
        found = re.fullmatch(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([\w-]+)\])?`", cell)
        if found is None:
            missing.append(f"{kind}: {cell!r} names no test")
            continue
        path, name, param = ROOT / found.group(1), found.group(2), found.group(3)
        tree = ast.parse(path.read_text()) if path.is_file() else ast.Module(body=[], type_ignores=[])
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        if name not in functions or (param is not None and param not in strings):
            missing.append(f"{kind}: {cell} does not exist")
    assert not missing, missing
