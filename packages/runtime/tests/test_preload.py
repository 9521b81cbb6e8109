"""The client step started during the model load imports Data Designer's engine, not only its lazy packages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddslurm.runtime._engine import PRELOAD_MODULES, preload_engine


@pytest.mark.dd
def test_preload_imports_the_engine_modules_create_needs() -> None:
    # A fresh interpreter: this one may have imported Data Designer already.
    code = (
        "import json, sys\n"
        "from ddslurm.runtime._engine import PRELOAD_MODULES, preload_engine\n"
        "before = len(sys.modules)\n"
        "import gc\n"
        "skipped = preload_engine()\n"
        "from data_designer.config.config_builder import DataDesignerConfigBuilder as cls\n"
        "print(json.dumps({'skipped': skipped, 'missing': [m for m in PRELOAD_MODULES if m not in sys.modules],"
        " 'added': len(sys.modules) - before, 'gc': gc.isenabled(), 'frozen': gc.get_freeze_count(),"
        " 'builder_frozen': not any(o is cls for o in gc.get_objects())}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["skipped"] == [] and got["missing"] == []
    assert got["added"] > 500  # the engine itself (pandas, duckdb, the builders), not just lazy packages
    # what the imports built is frozen, out of every later collection's walk; the collector itself is on
    assert got["gc"] is True and got["builder_frozen"] is True
    assert got["frozen"] > 100_000  # Data Designer's classes and schemas, not a handful of objects


def test_preload_skips_a_module_another_data_designer_version_lacks() -> None:
    assert preload_engine(("json", "data_designer_no_such_module.x")) == ["data_designer_no_such_module.x"]
    assert "data_designer.interface.data_designer" in PRELOAD_MODULES


@pytest.mark.parametrize(
    ("argv", "modules"),
    [
        (["generate", "--run-dir", "/nonexistent-run", "--shard", "0"], ["ddslurm.runtime._generate_step"]),
        (["client", "--run-dir", "/nonexistent-run", "--shard", "0", "--attempt", "a"], ["ddslurm.runtime._engine"]),
    ],
)
def test_every_step_freezes_what_its_command_imports(argv: list[str], modules: list[str]) -> None:
    """The controller and the client (like the proxy and inspect) import their command's modules inside
    frozen_imports: after the command, those modules are in the permanent generation and the collector is on."""
    code = (
        "import gc, json, sys\n"
        "from ddslurm.runtime.cli import main\n"
        f"main({argv!r})\n"
        f"mods = [sys.modules[m] for m in {modules!r}]\n"
        "live = {id(o) for o in gc.get_objects()}\n"
        "print(json.dumps({'gc': gc.isenabled(), 'frozen': gc.get_freeze_count(),"
        " 'tracked': [id(m.__dict__) in live for m in mods]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["gc"] is True and got["frozen"] > 10_000
    assert got["tracked"] == [False] * len(modules)  # frozen: no collection walks the command's modules
