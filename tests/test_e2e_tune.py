"""``ddslurm tune`` on the real local Slurm cluster: the mixed example's generator (a stand-in of capacity 4)
calibrated in one allocation, its facts written to the workspace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import Calibration, ClientUsage, calibration_file, facts_path, read_facts, read_json
from tests.e2e import MIXED_RECIPE, generator, run_cli, vllm_stand_in

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

CAPACITY = 4
STAND_IN = {"FAKE_VLLM_LATENCY": "0.05", "FAKE_VLLM_STARTUP_DELAY": "1"}


def test_tune_records_the_generators_sweep_and_the_recipes_facts(make_run_files: Any, tmp_path: Path) -> None:
    deployment = generator(replicas=1, tensor_parallel=1, env=STAND_IN)
    deployment += f'      extra_args: ["--max-num-seqs", "{CAPACITY}"]\n'
    files = make_run_files(
        "mixed",
        num_records=40,
        shards=2,
        buffer_size=4,
        recipe=MIXED_RECIPE,
        extra_run=deployment,
        vllm_executable=vllm_stand_in(tmp_path),
    )
    done = run_cli("tune", str(files.run_file), "--profile", str(files.profile), "--records", "8", "--json",
                   env=files.env, timeout=300)  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    assert "tune: submitted the calibration run" in done.stderr
    out = json.loads(done.stdout)
    run_dir = Path(out["run_dir"])
    assert run_dir.name.startswith("mixed-tune-") or "-tune-" in run_dir.name

    facts = read_facts(facts_path(run_dir.parent.parent))
    (model,) = facts.models
    assert model.measured_by == "tune" and model.run_id == out["run_id"]
    assert (model.shape.model, model.shape.tensor_parallel, model.capacity) == ("Qwen/Qwen3-8B", 1, CAPACITY)
    assert [p.in_flight for p in model.sweep] == [1, 2, 4]
    assert model.requests_per_s == max(p.requests_per_s for p in model.sweep) > 0
    assert model.load_s >= 1.0  # the stand-in's startup delay, at least

    # The calibration the allocation wrote is what the facts say.
    serving = next(run_dir.glob("allocations/allocation-*"), None) or next(run_dir.glob("shards/*/attempts/*"))
    calibration = read_json(calibration_file(serving), Calibration)
    assert calibration.entries[0].sweep == model.sweep and calibration.entries[0].load_s == model.load_s

    (recipe,) = facts.recipes
    assert recipe.measured_by == "tune" and recipe.run_id == out["run_id"]
    # The mixed recipe asks the generator once per record (8 records), the hosted judge too.
    assert recipe.requests_per_record["generator"] == pytest.approx(1.0, abs=0.26)
    attempt = next(run_dir.glob("shards/shard-00000/attempts/attempt-*"))
    usage = read_json(attempt / "client-usage.json", ClientUsage)
    requests = round(recipe.requests_per_record["generator"] * 8)
    assert recipe.client_cpu_s_per_request == pytest.approx(usage.cpu_s / requests, rel=0.01)
    assert out["models"][0]["alias"] == "generator" and out["recipe"]["recipe_sha256"] == recipe.recipe_sha256
    # The proxy recorded the prompts, never the token.
    prompts = (serving / "prompts-generator.jsonl").read_text()
    assert prompts and "Bearer" not in prompts
