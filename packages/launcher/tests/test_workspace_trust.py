"""Issue 37 in the launcher: a workspace another user can write is refused by ``doctor``, ``submit`` and its dry run
(sticky or not) at the profile's ``workspace``; a facts file that is not the user's own (another user's, one others
can write, a FIFO) is ignored with a warning in the dry run's output and never blocks it; a run's facts replace it
with the user's own; a held facts lock makes ``wait``/``report`` warn, never hang."""

from __future__ import annotations

import fcntl
import io
import json
import os
import stat
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from packages.config.tests.test_workspace_files import finishes
from packages.launcher.tests.test_doctor import HOST, Cluster
from packages.launcher.tests.test_facts import STAGED_SACCT, staged_in_workspace

from ddslurm.config import (
    Facts,
    ModelFact,
    ModelShape,
    facts_lock,
    facts_path,
    load_profile,
    read_facts,
    write_facts,
)
from ddslurm.launcher import Slurm, SubmitError, doctor, dry_run
from ddslurm.launcher.cli import main
from ddslurm.launcher.facts._workspace import record_after, record_facts
from ddslurm.launcher.submission._prepare import prepare
from ddslurm.launcher.testing import FakeSlurm, accept_every_recipe, accept_recipe, write_unit_run
from ddslurm.planner import PlanInputs

ROOT = os.geteuid() == 0
NOBODY = 65534
KEY = "sk-workspace-trust-0123456789"
RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: draft, column_type: llm-text, model_alias: gen, prompt: "Say {{ topic }}"}
  model_configs:
  - {alias: gen, model: m-2, provider: local}
"""
DEPLOY = "gpus: 4\ndeployments:\n  - {model_alias: gen, model: m-2, server: {cpus: 2}}\n"
PLANTED = Facts(
    models=(
        ModelFact(
            shape=ModelShape(model="m-2"), load_s=1.0, requests_per_s=0.01, capacity=256, measured_by="run",
            run_id="theirs", measured_at="2026-01-01T00:00:00+00:00",
        ),
    )
)  # fmt: skip
"""What another user plants: a load of a second and a crawling replica, which favour every GPU at once."""


def _files(tmp_path: Path) -> tuple[Path, Path, dict[str, str], Path]:
    """A run with a ``replicas: auto`` deployment under ``gpus: 4`` (the facts choose its layout), its profile and
    environment, and the profile's workspace (made as submit makes it: 0700)."""
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=RECIPE, num_records=40, shards=4, run_extra=DEPLOY)
    profile.write_text(
        profile.read_text() + f"gpus_per_node: 4\nvllm_executable: {Path(sys.executable).parent}/fake-vllm\n"
    )
    workspace = Path(load_profile(profile).workspace)
    workspace.mkdir(mode=0o700)
    return run, profile, env, workspace


def _plant(path: Path, facts: Facts = PLANTED) -> None:
    """``facts`` at ``path`` as another user leaves them: their file (as root), else one every user can write."""
    write_facts(path, facts)
    if ROOT:
        os.chown(path, NOBODY, NOBODY)
    else:
        path.chmod(0o666)


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch, planner_inputs: list[PlanInputs]) -> Iterator[list[PlanInputs]]:
    """What the planner is given (recipe checks answered here: Data Designer's own is tested elsewhere)."""
    accept_every_recipe(monkeypatch)
    yield planner_inputs


def _dry_run_json(run: Path, profile: Path, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = main(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"], env=env,
                slurm=Slurm(Cluster(), user="alice"), stdout=out, stderr=io.StringIO())  # fmt: skip
    return code, json.loads(out.getvalue())


def test_facts_another_user_planted_are_ignored_and_the_dry_run_says_so(
    tmp_path: Path, compiled: list[PlanInputs]
) -> None:
    run, profile, env, workspace = _files(tmp_path)
    path = facts_path(workspace)
    write_facts(path, PLANTED)  # the user's own: what these numbers do to the layout when trusted
    own = dry_run(run, profile, slurm=Slurm(Cluster(), user="alice"), host=HOST, env=env)
    assert compiled[-1].facts == PLANTED and not any("ignored" in w for w in own.warnings)
    assert own.plan.prediction is not None and "run" in {f.origin for f in own.plan.prediction.facts}

    path.unlink()
    none = dry_run(run, profile, slurm=Slurm(Cluster(), user="alice"), host=HOST, env=env)
    assert none.plan.prediction is not None
    assert none.plan.prediction.chosen != own.plan.prediction.chosen  # the numbers do move the layout

    _plant(path)
    done = finishes(lambda: dry_run(run, profile, slurm=Slurm(Cluster(), user="alice"), host=HOST, env=env))
    assert compiled[-1].facts == Facts()  # the planner never saw them
    assert done.plan.prediction is not None
    assert done.plan.prediction.chosen == none.plan.prediction.chosen
    assert {f.origin for f in done.plan.prediction.facts} == {"default"}
    [warning] = [w for w in done.warnings if str(path) in w]
    assert "ignored" in warning and f"rm {path}" in warning, warning
    assert (f"belongs to uid {NOBODY}" if ROOT else "lets other users change it") in warning, warning
    code, document = _dry_run_json(run, profile, env)
    assert code == 0 and warning in document["warnings"], document["warnings"]


def test_a_fifo_in_place_of_the_facts_does_not_hang_the_dry_run(tmp_path: Path, compiled: list[PlanInputs]) -> None:
    run, profile, env, workspace = _files(tmp_path)
    fifo = facts_path(workspace)
    os.mkfifo(fifo, 0o600)
    try:
        done = finishes(lambda: dry_run(run, profile, slurm=Slurm(Cluster(), user="alice"), host=HOST, env=env))
    finally:  # a reader blocked on it (before the fix) ends
        os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
    assert compiled[-1].facts == Facts()
    assert any(w.startswith(f"{fifo}: is a FIFO, not a regular file") for w in done.warnings), done.warnings


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770])
def test_a_workspace_others_can_write_is_refused_by_doctor_submit_and_the_dry_run(
    tmp_path: Path, compiled: list[PlanInputs], mode: int
) -> None:
    run, profile, env, workspace = _files(tmp_path)
    workspace.chmod(mode)
    line = next(i for i, text in enumerate(profile.read_text().splitlines(), 1) if text.startswith("workspace:"))
    where = f"{profile}:{line}:1: workspace: {workspace}: mode {mode:04o} lets other users write in it"

    report = doctor(profile, slurm=Slurm(Cluster(), user="alice"), host=HOST, env=env)
    [problem] = [c for c in report.checks if c.status == "problem"]
    assert problem.message.startswith(where) and f"mkdir -m 700 {workspace}/" in problem.message, problem.message
    with pytest.raises(SubmitError) as refused:
        dry_run(run, profile, slurm=Slurm(Cluster(), user="alice"), host=HOST, env=env)
    assert where in str(refused.value), refused.value
    with pytest.raises(SubmitError) as refused:  # prepare on its own (tune, tests) refuses it too
        prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    assert str(refused.value).startswith(where), refused.value
    assert compiled == []  # refused before any facts were read or planned with
    assert list(workspace.iterdir()) == []  # and nothing written


def test_a_runs_facts_replace_a_planted_file_with_the_users_own_and_say_so(tmp_path: Path) -> None:
    workspace, layout = staged_in_workspace(tmp_path)
    path = facts_path(workspace)
    _plant(path, Facts(models=(*PLANTED.models,)))
    recorded = record_facts(workspace, layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)))
    [warning] = recorded.warnings
    assert warning.startswith(f"{path}: ") and "ignored" in warning
    st = path.stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    facts = read_facts(path)
    assert [m.run_id for m in facts.models] == [layout.run_id]  # theirs were not merged

    workspace2, layout2 = staged_in_workspace(tmp_path / "b")
    _plant(facts_path(workspace2))
    err = io.StringIO()
    record_after(layout2, Slurm(FakeSlurm(sacct=STAGED_SACCT)), err)
    assert f"warning: {facts_path(workspace2)}: " in err.getvalue(), err.getvalue()


def test_a_held_facts_lock_makes_wait_and_report_warn_not_hang(tmp_path: Path) -> None:
    workspace, layout = staged_in_workspace(tmp_path)
    lock = facts_lock(facts_path(workspace))
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process's hold
    try:
        err = io.StringIO()
        finishes(lambda: record_after(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)), err, lock_wait_s=0))
    finally:
        os.close(held)
    said = err.getvalue()
    assert said.startswith(f"warning: the run's facts were not recorded in {facts_path(workspace)}: {lock}: "), said
    assert f"still locked after 0 s: process {os.getpid()}" in said, said
    assert not facts_path(workspace).exists()
    record_after(layout, Slurm(FakeSlurm(sacct=STAGED_SACCT)), io.StringIO(), lock_wait_s=0)  # released: recorded
    assert [m.run_id for m in read_facts(facts_path(workspace)).models] == [layout.run_id]
