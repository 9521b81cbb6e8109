"""Issue 40, item 1: a time limit too short for the run, as the plan's prediction says (the workspace's facts of a
slow model), is a ``warning:`` line of the dry run naming the field and the value that fits (text and ``--json``),
and a refusal of ``submit`` (nothing written, nothing submitted) unless ``--accept-overrun`` (the API's
``accept_overrun=True``) confirms it. Every number the warnings show is recomputed here from the plan's prediction."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from msgspec import convert
from msgspec.structs import replace
from packages.launcher.tests.test_workspace_trust import PLANTED, RECIPE

from ddslurm.config import Facts, Prediction, facts_path, load_profile, write_facts
from ddslurm.launcher import Slurm, SubmitError
from ddslurm.launcher.api import Client
from ddslurm.launcher.cli import main
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, accept_every_recipe, write_unit_run

DEPLOY = 'deployments:\n  - {model_alias: gen, model: m-2, server: {cpus: 1, extra_args: ["--max-num-seqs", "8"]}}\n'
# 100 records on 5 shards of 20 with Data Designer's default batch: each shard is one batch (the case)
RUN = f"buffer_size: 1000\nsubmission:\n  time_limit: '00:10:00'\n  cpus: 2\n{DEPLOY}"
SLOW = Facts(models=(replace(PLANTED.models[0], load_s=60.0, requests_per_s=0.025, capacity=8, run_id="earlier"),))
"""A replica measured at 40 s a request: a shard of 20 records takes over 13 minutes."""
KEY = "sk-overrun-test-0123456789"
MARGIN = 0.8
"""The share of the time limit a fitting value keeps the prediction within."""


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, dict[str, str], Path]:
    """The run file, its profile, environment and workspace (holding :data:`SLOW` as the user's own facts)."""
    accept_every_recipe(monkeypatch)  # Data Designer's own recipe check is tested elsewhere
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=RECIPE, num_records=100, shards=5, run_extra=RUN)
    profile.write_text(
        profile.read_text() + f"gpus_per_node: 4\nvllm_executable: {Path(sys.executable).parent}/fake-vllm\n"
    )
    workspace = Path(load_profile(profile).workspace)
    workspace.mkdir(mode=0o700)
    write_facts(facts_path(workspace), SLOW)
    return run, profile, env, workspace


def _cli(args: list[str], env: dict[str, str], runner: FakeSlurm | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(args, env=env, slurm=Slurm(runner or FakeSlurm()), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _expected(prediction: Prediction) -> dict[str, str]:
    """Each overrun's numbers as the warnings must show them, from the prediction alone."""
    chosen = prediction.chosen
    facts = {f.name: f.value for f in prediction.facts}
    start = facts["load_s"] + facts["allocation_overhead_s"]  # 60 s measured + 15 s default
    minutes = math.ceil(chosen.allocation_s / MARGIN / 60)
    saved_s = start + 20 * chosen.shard_record_s  # a shard of 20 records is its own first batch
    most = math.floor((600 * MARGIN - start) / chosen.shard_record_s)
    return {
        "allocation": f"{chosen.allocation_s / 60:.1f} min",
        "limit_fits": f"submission.time_limit: '{minutes // 60:02d}:{minutes % 60:02d}:00'",
        "saved": f"{saved_s / 60:.1f} min",
        "batch_fits": f"buffer_size: {most}",
        "shards": f"shards: {math.ceil(100 / most)} or more",
    }


def _runs(workspace: Path) -> list[Path]:
    return sorted((workspace / "runs").glob("*")) if (workspace / "runs").exists() else []


def test_the_dry_run_warns_naming_each_field_and_what_fits(files: tuple[Path, Path, dict[str, str], Path]) -> None:
    run, profile, env, workspace = files
    code, out, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"], env)
    assert code == 0
    data: dict[str, Any] = json.loads(out)
    prediction = data["plan"]["prediction"]
    expected = _expected(convert(prediction, Prediction))
    chosen = prediction["chosen"]
    assert chosen["allocation_s"] > 600  # the facts at work: this run does not fit 10 minutes
    limit, batch = data["bill"]["overruns"]
    assert (limit["field"], limit["predicted_s"], limit["limit_s"]) == ("submission.time_limit", chosen["allocation_s"],
                                                                        600)  # fmt: skip
    assert limit["fits"] == expected["limit_fits"] and batch["fits"] == expected["batch_fits"]
    assert batch["field"] == "buffer_size" and batch["limit_s"] == 600
    assert data["warnings"][:2] == [limit["message"], batch["message"]]
    assert not any("each shard (20 records) is one batch" in w for w in data["warnings"])  # said once, as an overrun

    code, text, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run"], env)
    assert code == 0
    warned = [line for line in text.splitlines() if line.startswith("warning: ")]
    [time_line] = [w for w in warned if w.startswith("warning: submission.time_limit ")]
    assert f"shorter than the predicted allocation, {expected['allocation']}" in time_line
    assert f"set {expected['limit_fits']} (" in time_line and "--accept-overrun" in time_line
    [batch_line] = [w for w in warned if w.startswith("warning: buffer_size ")]
    assert f"is predicted to be saved {expected['saved']} into its allocation" in batch_line
    assert "ddslurm retry can resume it" in batch_line and "neither its automatic retries nor" in batch_line
    assert f"set {expected['batch_fits']} or less" in batch_line and expected["shards"] in batch_line
    assert _runs(workspace) == []


def test_submit_refuses_it_without_the_flag_and_submits_it_with(
    files: tuple[Path, Path, dict[str, str], Path],
) -> None:
    run, profile, env, workspace = files
    runner = FakeSlurm()
    code, out, err = _cli(["submit", str(run), "--profile", str(profile), "--json"], env, runner)
    assert code == 2
    error = json.loads(out)["error"]
    assert (error["code"], error["exit_code"]) == ("submit_refused", 2)
    assert [o["field"] for o in error["overruns"]] == ["submission.time_limit", "buffer_size"]
    assert err.startswith("error: the run is predicted not to fit its time limit; nothing was written or submitted")
    for overrun in error["overruns"]:
        assert f"  {overrun['message']}" in err and overrun["fits"] in err
    assert "--accept-overrun" in err
    assert _runs(workspace) == [] and runner.commands("sbatch") == []

    code, out, _ = _cli(["submit", str(run), "--profile", str(profile), "--accept-overrun"], env, runner)
    assert code == 0, out
    assert [line for line in out.splitlines() if line.strip().startswith("warning: submission.time_limit ")]
    assert len(_runs(workspace)) == 1 and len(runner.commands("sbatch")) == 1


def test_the_api_takes_the_same_confirmation(files: tuple[Path, Path, dict[str, str], Path]) -> None:
    run, profile, env, workspace = files
    runner = FakeSlurm()
    client = Client(profile=profile, env=env, slurm=Slurm(runner, env=env), notes=io.StringIO(),
                    engine_host=InProcessHost())  # fmt: skip
    planned = client.submit(run, dry_run=True)
    assert any(w.startswith("submission.time_limit ") for w in planned.warnings)
    with pytest.raises(SubmitError, match=r"predicted not to fit its time limit"):
        client.submit(run)
    assert _runs(workspace) == []
    done = client.submit(run, accept_overrun=True)
    assert done.run.run_dir.is_dir() and any(w.startswith("buffer_size ") for w in done.warnings)


def test_the_values_the_warnings_name_make_the_run_fit(files: tuple[Path, Path, dict[str, str], Path]) -> None:
    run, profile, env, workspace = files
    code, out, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"], env)
    limit, batch = json.loads(out)["bill"]["overruns"]
    fixed = run.read_text().replace("time_limit: '00:10:00'", limit["fits"].removeprefix("submission."))
    run.write_text(fixed.replace("buffer_size: 1000", batch["fits"]))
    code, out, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"], env)
    assert code == 0 and json.loads(out)["bill"]["overruns"] == []
    code, _, err = _cli(["submit", str(run), "--profile", str(profile)], env)
    assert code == 0, err
    assert len(_runs(workspace)) == 1


def test_without_a_prediction_nothing_is_refused(files: tuple[Path, Path, dict[str, str], Path]) -> None:
    """Allocations the run file fixes (no ``gpus``): the cost model predicts nothing, so nothing overruns."""
    run, profile, env, workspace = files
    run.write_text(run.read_text() + "allocations: 5\n")
    code, out, _ = _cli(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"], env)
    data = json.loads(out)
    assert code == 0 and data["plan"]["prediction"] is None and data["bill"]["overruns"] == []
    code, _, err = _cli(["submit", str(run), "--profile", str(profile)], env)
    assert code == 0, err
    assert len(_runs(workspace)) == 1
