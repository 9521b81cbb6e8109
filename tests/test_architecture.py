"""Architecture rules that import-linter alone cannot see: home-directory access and runtime imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "packages"
DISCOVERY = PACKAGES / "providers" / "src" / "ddslurm" / "providers" / "discovery.py"
HOME_NAMES = {"HOME", "USERPROFILE", "XDG_CONFIG_HOME", "DATA_DESIGNER_HOME"}


def home_access(source: str, filename: str) -> list[str]:
    """``file:line: what`` for every way a module could reach the home directory."""
    found: list[str] = []
    tree = ast.parse(source, filename)
    # Setting a variable for a child (a key of a dict literal) is a write, not a read of the home directory.
    written = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys if k is not None}
    for node in ast.walk(tree):
        if id(node) in written:
            continue
        if isinstance(node, ast.Attribute) and node.attr in {"home", "expanduser"}:
            found.append(f"{filename}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id == "expanduser":
            found.append(f"{filename}:{node.lineno}: expanduser")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (node.value.startswith("~") or node.value in HOME_NAMES)
        ):
            found.append(f"{filename}:{node.lineno}: {node.value!r}")
    return found


def _sources(package: str) -> list[Path]:
    return sorted((PACKAGES / package / "src").rglob("*.py"))


@pytest.mark.parametrize("package", ["runtime", "collector", "config", "planner"])
def test_node_side_and_lower_packages_never_touch_the_home_directory(package: str) -> None:
    hits = [hit for path in _sources(package) for hit in home_access(path.read_text(), str(path.relative_to(REPO)))]
    assert hits == []


def test_only_discovery_touches_home_in_providers_and_launcher() -> None:
    paths = [p for pkg in ("providers", "launcher") for p in _sources(pkg) if p != DISCOVERY]
    hits = [hit for path in paths for hit in home_access(path.read_text(), str(path))]
    assert hits == []
    assert home_access(DISCOVERY.read_text(), "discovery.py"), "discovery is where home access is expected"


@pytest.mark.parametrize(
    "snippet",
    [
        pytest.param("from pathlib import Path\nPath.home()", id="path-home"),
        pytest.param("import os\nos.path.expanduser('~/.x')", id="expanduser"),
        pytest.param("import os\nos.environ['HOME']", id="env-home"),
        pytest.param("from os.path import expanduser\nexpanduser('x')", id="imported-expanduser"),
        pytest.param("x = '~/.data-designer'", id="tilde-string"),
    ],
)
def test_home_access_check_fires(snippet: str) -> None:
    assert home_access(snippet, "bad.py")


def _printed(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter (nothing imported before it)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_runtime_and_collector_do_not_load_higher_layers() -> None:
    code = (
        "import sys, ddslurm.runtime, ddslurm.runtime.cli, ddslurm.collector, ddslurm.collector.cli\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('ddslurm.planner', 'ddslurm.launcher', "
        "'ddslurm.providers')))\n"
        "print(','.join(bad))"
    )
    assert _printed(code) == ""


def test_importing_packages_has_no_heavy_side_effects() -> None:
    """Neither Data Designer nor the report's plotting library is loaded by importing a package or the CLI."""
    code = (
        "import sys, ddslurm.config, ddslurm.providers, ddslurm.planner, ddslurm.launcher, ddslurm.runtime\n"
        "import ddslurm.launcher.cli, ddslurm.launcher.report\n"
        "print(sorted(m for m in ('data_designer', 'plotly') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_only_the_config_command_line_loads_typer_of_the_node_side_packages() -> None:
    """``ddslurm.config.cli`` (``ddslurm-config``) is a Typer app; every other module of the config, and the runtime
    and the collector the nodes run, load neither Typer nor Rich (the ``cli-libraries`` import contract checks the
    direct imports, this what importing them loads)."""
    code = (
        "import importlib, pkgutil, sys, ddslurm.config\n"
        "for m in pkgutil.iter_modules(ddslurm.config.__path__):\n"
        "    if m.name != 'cli': importlib.import_module('ddslurm.config.' + m.name)\n"
        "import ddslurm.runtime, ddslurm.runtime.cli, ddslurm.collector, ddslurm.collector.cli\n"
        "before = sorted(m for m in ('typer', 'rich') if m in sys.modules)\n"
        "import ddslurm.config.cli\n"
        "print(before, 'typer' in sys.modules)"
    )
    assert _printed(code) == "[] True"


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint)], capture_output=True, text=True, cwd=REPO, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 6 kept, 0 broken." in out.stdout


def test_the_private_modules_contract_finds_an_import_of_another_packages_private_module(tmp_path: Path) -> None:
    """The import-linter contract of ``.importlinter`` (``tools/import_contracts.py``) on a tree of its own: a
    package may import another's public modules and its own private ones, never another's private ones."""
    import grimp

    from tools.import_contracts import PrivateModulesContract  # the repository root is on pytest's pythonpath

    for name, files in {
        "low": {"__init__.py": "from low._impl import thing\n", "_impl.py": "thing = 1\n", "api.py": ""},
        "high": {"__init__.py": "", "ok.py": "import low\nimport low.api\nfrom high import _own\n", "_own.py": "",
                 "bad.py": "\n\nfrom low._impl import thing\n"},
    }.items():  # fmt: skip
        (tmp_path / name).mkdir()
        for filename, text in files.items():
            (tmp_path / name / filename).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("low", "high", cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    contract = PrivateModulesContract(
        name="private",
        session_options={"root_packages": ["low", "high"]},
        contract_options={"packages": ["low", "high"]},
    )
    check = contract.check(graph, verbose=False)
    assert not check.kept
    assert check.metadata["violations"] == [{"importer": "high.bad", "imported": "low._impl", "lines": [3]}]


def test_the_only_importers_contract_finds_an_import_of_plotly_outside_the_report(tmp_path: Path) -> None:
    """The ``plotly-in-report`` contract's type (``tools/import_contracts.py``) on a tree of its own: the report
    package (any module below it) may import the library, directly or lazily; no other module may, even one that
    only imports a submodule of it."""
    import grimp

    from tools.import_contracts import OnlyImportersContract

    (tmp_path / "app" / "report").mkdir(parents=True)
    for filename, text in {
        "app/__init__.py": "",
        "app/report/__init__.py": "from app.report._html import page\n",
        "app/report/_html.py": "def page() -> None:\n    import plotly.graph_objects\n",
        "app/cli.py": "from app.report import page\n",
        "app/bad.py": "import json\n\n\ndef chart() -> None:\n    from plotly.offline import get_plotlyjs\n",
    }.items():
        (tmp_path / filename).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("app", include_external_packages=True, cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    contract = OnlyImportersContract(
        name="plotly",
        session_options={"root_packages": ["app"], "include_external_packages": True},
        contract_options={"modules": ["plotly"], "importers": ["app.report"]},
    )
    check = contract.check(graph, verbose=False)
    assert not check.kept
    assert check.metadata["violations"] == [{"importer": "app.bad", "imported": "plotly", "lines": [5]}]


def test_log_events_one_package_reads_from_another_are_named_once_in_config() -> None:
    """The report reads the runtime's log events back: both sides use ``ddslurm.config``'s constants, so no
    library file spells such an event name itself (a rename on one side would silently blind the other)."""
    from ddslurm.config import _events

    names = {value for key, value in vars(_events).items() if key.isupper() and isinstance(value, str)}
    assert names
    spelled = [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for path in sorted(PACKAGES.glob("*/src/ddslurm/**/*.py"))
        if path.name != "_events.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and node.value in names
    ]
    assert spelled == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle a depth-first walk of ``edges`` meets (as the modules around it)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the walk's stack, 2: done

    def walk(module: str, stack: list[str]) -> None:
        state[module] = 1
        stack.append(module)
        for imported in sorted(edges[module]):
            if state.get(imported) == 1:
                found.append([*stack[stack.index(imported) :], imported])
            elif imported not in state:
                walk(imported, stack)
        stack.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            walk(module, [])
    return found


def test_no_package_has_an_import_cycle_not_even_through_a_function_level_import() -> None:
    """grimp counts every import, those inside functions too: a cycle hidden by a function-level import is found."""
    import grimp

    packages = [f"ddslurm.{p.name}" for p in sorted(PACKAGES.iterdir()) if (p / "src").is_dir()]
    graph = grimp.build_graph(*packages, cache_dir=None)
    cycles = []
    for package in packages:
        modules = {m for m in graph.modules if m == package or m.startswith(package + ".")}
        edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
        cycles += _cycles(edges)
    assert cycles == []
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]  # the walk itself finds one


def test_the_controller_loads_neither_pyarrow_nor_aiohttp() -> None:
    """The controller (``ddslurm-runtime generate``: one for every allocation, alive all its life) begins and watches
    attempts; pyarrow and aiohttp are the client's and the proxy's, imported by the functions that use them, so the
    controller does not pay their import (about half of its CPU before)."""
    code = (
        "import sys, ddslurm.runtime._generate_step\n"
        "print(sorted(m for m in ('pyarrow', 'aiohttp', 'data_designer') if m in sys.modules))"
    )
    assert _printed(code) == "[]"


def test_submit_and_the_manifest_reader_load_no_pyarrow() -> None:
    """``ddslurm submit`` (and its dry run) reads the workspace's facts, whose module reads collected manifests:
    the manifest is JSON (``collector._manifest``), so neither submit nor a manifest reader loads pyarrow and numpy
    (0.2 CPU-s of every submit before); the collector's merge, which writes Parquet, still does."""
    code = (
        "import sys, ddslurm.launcher.submission._submit\n"
        "from ddslurm.collector import Manifest, read_manifest\n"
        "print(sorted(m for m in ('pyarrow', 'numpy', 'pandas', 'data_designer') if m in sys.modules))"
    )
    assert _printed(code) == "[]"
    assert _printed("import sys\nfrom ddslurm.collector import collect\nprint('pyarrow' in sys.modules)") == "True"
