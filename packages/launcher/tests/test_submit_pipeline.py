"""``submit`` as a staged pipeline (issue 39): each input file is read from disk once, whatever stage needs it (the
profile's checks, the recipe's loading, the plan, the run's copy); the planner sizes the clients once (what the
recipe check validates with) and compiles the plan once, and nothing amends the compiled plan before it is written.
The dry run and ``doctor`` read the same way."""

from __future__ import annotations

import builtins
import io
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import Plan, RunLayout, read_plan
from ddslurm.launcher import Slurm
from ddslurm.launcher.cluster._doctor import doctor
from ddslurm.launcher.submission import _dry_run as dry_run_module
from ddslurm.launcher.submission import _prepare as prepare_module
from ddslurm.launcher.submission._submit import submit
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, write_unit_run

KEY = "sk-pipeline-test-0000"
PLACEHOLDER = "HOSTED_PLACEHOLDER_KEY"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How often each file was opened, by its resolved path: every read of a file goes through ``open`` (pathlib's
    ``read_text``, ``read_bytes`` and ``open`` call ``io.open``, which is ``builtins.open``)."""
    counts: Counter[str] = Counter()
    real = builtins.open

    def counting(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | Path):
            counts[os.path.realpath(file)] += 1
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    yield counts


@pytest.fixture
def planner_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often ``submit`` (and the dry run, which share its stages) asked the planner to size and to compile."""
    calls: Counter[str] = Counter()
    for name in ("client_serving", "compile_plan"):
        real = getattr(prepare_module, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(prepare_module, name, counted)
    return calls


def _unit_run(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A run with one local deployment (the planner sizes its clients for the check) and a hosted alias."""
    deployment = "deployments:\n- {model_alias: local, model: org/local, replicas: 1}\n"
    recipe = (
        "data_designer:\n  columns:\n"
        "  - {name: q, column_type: llm-text, model_alias: writer, prompt: 'Say hi'}\n"
        "  - {name: a, column_type: llm-text, model_alias: local, prompt: 'Answer {{ q }}'}\n"
        "  model_configs:\n"
        "  - {alias: writer, model: m-1, provider: hosted}\n"
        "  - {alias: local, model: org/local, provider: local}\n"
    )
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=recipe, run_extra=deployment)
    profile.write_text(profile.read_text() + "gpus_per_node: 4\nvllm_executable: /bin/true\n")
    return run, profile, env


def test_submit_reads_each_input_once_and_compiles_the_plan_once_which_nothing_amends(
    tmp_path: Path, opened: Counter[str], planner_calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, profile, env = _unit_run(tmp_path)
    compiled: list[Plan] = []
    compile_plan = prepare_module.compile_plan

    def keep(*args: Any, **kwargs: Any) -> Plan:
        compiled.append(compile_plan(*args, **kwargs))
        return compiled[-1]

    monkeypatch.setattr(prepare_module, "compile_plan", keep)
    opened.clear()  # what writing the files counted
    done = submit(run, profile, slurm=Slurm(FakeSlurm(), user="alice"), env=env, host=InProcessHost())
    for path in (run, profile, tmp_path / "recipe.yaml"):
        assert opened[os.path.realpath(path)] == 1, (path.name, opened)
    assert planner_calls == Counter({"client_serving": 1, "compile_plan": 1})
    # The plan submitted and written is the compiled one, as compiled: nothing patched it afterwards.
    [plan] = compiled
    assert done.plan is plan
    assert read_plan(RunLayout(done.layout.root).plan) == plan
    assert (done.layout.inputs / "run.yaml").read_bytes() == run.read_bytes()  # the run's copy: the bytes read


def test_the_planner_decides_what_the_launcher_used_to_amend(tmp_path: Path, planner_calls: Counter[str]) -> None:
    """A key whose value is a placeholder is left unscanned by the compile itself (``secret_env_unscanned``), and a
    calibration run's levels come from the compile too (``ddslurm tune``): both were patched onto the plan."""
    run, profile, env = _unit_run(tmp_path)
    env["HOSTED_KEY"] = "EMPTY"
    done = submit(run, profile, slurm=Slurm(FakeSlurm(), user="alice"), env=env, host=InProcessHost(), calibration=True)
    assert done.plan.secret_env == ("HOSTED_KEY",) and done.plan.secret_env_unscanned == ("HOSTED_KEY",)
    assert done.plan.serving is not None
    capacity = done.plan.serving.deployments[0].capacity
    assert capacity and done.plan.calibrate[-1] == capacity and done.plan.calibrate[0] == 1
    assert planner_calls["compile_plan"] == 1


def test_the_dry_run_and_doctor_read_each_input_once(
    tmp_path: Path, opened: Counter[str], planner_calls: Counter[str]
) -> None:
    run, profile, env = _unit_run(tmp_path)
    slurm = Slurm(FakeSlurm(), user="alice")
    opened.clear()  # what writing the files counted
    planned = dry_run_module.dry_run(run, profile, slurm=slurm, env=env, host=InProcessHost())
    assert planned.plan.shards and planner_calls["compile_plan"] == 1
    for path in (run, profile):
        assert opened[os.path.realpath(path)] == 1, (path.name, opened)
    opened.clear()
    report = doctor(profile, run, slurm=slurm, env=env, host=InProcessHost())
    assert any(c.name == "run file" for c in report.checks), report.checks
    for path in (run, profile):
        assert opened[os.path.realpath(path)] == 1, (path.name, opened)


def test_a_run_file_that_changes_while_submit_runs_is_stored_as_it_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's copy of the run file is the text the plan was compiled from, not what the file holds later."""
    run, profile, env = _unit_run(tmp_path)
    as_read = run.read_bytes()
    compile_plan = prepare_module.compile_plan

    def edit_then_compile(*args: Any, **kwargs: Any) -> Plan:
        run.write_text(run.read_text().replace("num_records: 10", "num_records: 99"))
        return compile_plan(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "compile_plan", edit_then_compile)
    done = submit(run, profile, slurm=Slurm(FakeSlurm(), user="alice"), env=env, host=InProcessHost())
    assert (done.layout.inputs / "run.yaml").read_bytes() == as_read
    assert done.plan.num_records == 10
    assert msgspec.json.decode(msgspec.json.encode(done.plan), type=Plan) == done.plan
