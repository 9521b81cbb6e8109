"""``gpus:`` and ``deadline:`` against the local cluster: ``ddslurm submit --dry-run --json`` of the budget example
shows the layout the cost model chose within them, its two runners-up and the facts it used; a fact recorded in
the workspace (a short model load, as an earlier run or ``ddslurm tune`` measures) changes the choice."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import Facts, ModelFact, ModelShape, facts_path, write_facts
from ddslurm.launcher.cli import main

ROOT = Path(__file__).resolve().parents[1]
MIXED = ROOT / "examples" / "mixed"

pytestmark = pytest.mark.slurm


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, dict[str, str]]:
    for name in ("recipe.yaml", "questions.csv", "run-budget.yaml"):
        shutil.copy(MIXED / name, tmp_path / name)
    profile = tmp_path / "profile.yaml"
    text = (ROOT / "examples" / "local-profile.yaml").read_text()
    for name in ("python_env", "vllm_executable"):  # relative to the example's folder: made absolute here
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{name}:"))
        text = text.replace(line, f"{name}: {(ROOT / 'examples' / line.split(':', 1)[1].strip()).resolve()}")
    line = next(ln for ln in text.splitlines() if ln.startswith("workspace:"))
    profile.write_text(text.replace(line, f"workspace: {tmp_path / 'work'}"))
    env = {
        "DATA_DESIGNER_HOME": str(ROOT / "examples" / "hosted-only" / "dd-home"),
        "DEMO_HOSTED_API_KEY": "a-demo-key-value",
        "PATH": "/usr/bin:/bin",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path / "run-budget.yaml", profile, env


def _bill(run: Path, profile: Path, env: dict[str, str]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"], env=env, stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert "a-demo-key-value" not in out.getvalue() + err.getvalue()
    return json.loads(out.getvalue())


def _prediction(data: dict[str, Any]) -> dict[str, Any]:
    found = data.get("bill", data).get("prediction")
    assert found is not None, sorted(data)
    return dict(found)


def test_the_budget_example_is_planned_within_its_gpus_and_a_recorded_fact_changes_the_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, profile, env = _setup(tmp_path, monkeypatch)
    before = _prediction(_bill(run, profile, env))
    chosen = before["chosen"]
    assert chosen["gpus_at_once"] <= 8 and before["budget_gpus"] == 8 and before["deadline_s"] == 7200
    assert len(before["runners_up"]) == 2
    assert {f["origin"] for f in before["facts"]} == {"default"}
    assert all(c["gpus_at_once"] <= 8 for c in before["runners_up"])
    # Nothing was written by a dry run but the facts stay as they were: none.
    assert not facts_path(tmp_path / "work").exists()

    # An earlier run measured this model on this cluster: it loads in 2 s and serves 1 request a second, so more
    # replicas cost almost no extra GPU-hours (a load is cheap) and finish far sooner: the choice uses the budget.
    shape = ModelShape(model="Qwen/Qwen3-8B", tensor_parallel=1)
    fast = ModelFact(shape=shape, load_s=2.0, requests_per_s=1.0, capacity=256, measured_by="run", run_id="earlier",
                     measured_at="2026-12-01T00:00:00+00:00", flags=("--max-model-len", "8192"))  # fmt: skip
    (tmp_path / "work").mkdir(parents=True, exist_ok=True)
    write_facts(facts_path(tmp_path / "work"), Facts(models=(fast,)))
    after = _prediction(_bill(run, profile, env))
    used = {(f["name"], f["origin"]) for f in after["facts"]}
    assert ("load_s", "run") in used and ("requests_per_s", "run") in used
    assert after["chosen"]["gpus_at_once"] > chosen["gpus_at_once"], (chosen, after["chosen"])
    layout = lambda c: (c["allocations"], tuple(c["replicas"]), c["client_workers"])  # noqa: E731
    assert layout(after["chosen"]) != layout(chosen), (chosen, after["chosen"])
