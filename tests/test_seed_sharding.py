"""Sharding a seed dataset uses every seed row exactly as an unsharded Data Designer run does.

The oracle is the real engine: a plain ``DataDesigner.create`` of the same recipe and ``num_records``. The
sharded side is ddslurm's own path: the launcher counts the seed (``capture_seed``), the planner places the
shards (``plan_shards``) and the runtime gives each shard its block (``partition_seed``); every shard is then
a real ``create`` of ``num_records`` records, as on a node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import RunLayout, partition_seed
from ddslurm.launcher.submission._seed import capture_seed
from ddslurm.planner import plan_shards

pytestmark = pytest.mark.dd

# Runs Data Designer for every job on stdin ({"recipe", "records"}) and prints the seed ids each one used.
ENGINE = r"""
import json, os, sys, tempfile
home = tempfile.mkdtemp(); os.makedirs(home + "/managed-assets")
os.environ.update(DATA_DESIGNER_HOME=home, NEMO_TELEMETRY_ENABLED="false", HF_HUB_OFFLINE="1",
                  DISABLE_DATA_DESIGNER_PLUGINS="true")
from ddslurm.runtime._engine import preload_engine
preload_engine()  # as the client step imports it (frozen): no collection of the many runs walks its classes
import data_designer.config as dd
from data_designer.interface import DataDesigner
out = []
designer = DataDesigner(artifact_path=tempfile.mkdtemp(), managed_assets_path=home + "/managed-assets",
    model_providers=[dd.ModelProvider(name="none", endpoint="http://127.0.0.1:9/v1", provider_type="openai")])
designer.set_run_config(dd.RunConfig(buffer_size=4, otel_metrics_port=None))
for i, job in enumerate(json.load(sys.stdin)):
    builder = dd.DataDesignerConfigBuilder.from_config(job["recipe"])
    result = designer.create(builder, num_records=job["records"], dataset_name=f"job-{i}")
    out.append([int(v) for v in result.load_dataset()["seed_id"]])
print(json.dumps(out))
"""


def _run_engine(jobs: list[dict[str, Any]]) -> list[list[int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATA_DESIGNER")}
    done = subprocess.run(
        [sys.executable, "-c", ENGINE], input=json.dumps(jobs), capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[list[int]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _recipe(seed: Path, sampling: str, selection: dict[str, int] | None) -> dict[str, Any]:
    return {
        "data_designer": {
            "seed_config": {
                "source": {"seed_type": "local", "path": str(seed)},
                "sampling_strategy": sampling,
                "selection_strategy": selection,
            },
            "columns": [{"column_type": "expression", "name": "echo", "expr": "{{ seed_id }}"}],
        }
    }


CASES = [
    # rows, records, shards: the two cases, records > rows (DD cycles), shards > rows, one row per shard
    (60, 60, 7),
    (20, 20, 3),
    (10, 25, 4),
    (7, 30, 4),
    (10, 23, 9),
    (3, 10, 10),
    (50, 20, 6),
]
SELECTIONS = [None, {"start": 2, "end": 8}, {"index": 1, "num_partitions": 3}]


SAMPLINGS = ["ordered", "shuffle"]

Case = tuple[int, int, int, str]  # rows, records, shards, sampling


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[Case, list[tuple[list[int], list[list[int]]]]]:
    """Every case's runs in one Data Designer process (one engine import, not one per case): for each case, per
    seed selection, the seed ids the plain run used and those each shard used."""
    jobs: list[dict[str, Any]] = []
    layouts: dict[Case, list[tuple[int, int]]] = {}  # (first job, shard count) per selection
    for rows, records, shards in CASES:
        for sampling in SAMPLINGS:
            folder = tmp_path_factory.mktemp(f"seed-{rows}-{records}-{shards}-{sampling}")
            seed = folder / "seed.parquet"
            pq.write_table(pa.table({"seed_id": list(range(rows)), "text": [f"row {i}" for i in range(rows)]}), seed)
            case = layouts.setdefault((rows, records, shards, sampling), [])
            for selection in SELECTIONS if rows >= 9 else [None]:
                recipe = _recipe(seed, sampling, selection)
                captured = capture_seed(recipe, folder / "recipe.yaml", RunLayout(folder / "run"))
                assert captured is not None and captured.plan.rows == rows
                specs = plan_shards(records, shards, captured.plan.pool)
                case.append((len(jobs), len(specs)))
                jobs.append({"recipe": recipe, "records": records})  # the oracle: one plain run
                jobs += [{"recipe": partition_seed(recipe, spec), "records": spec.num_records} for spec in specs]
    used = _run_engine(jobs)
    return {
        case: [(used[first], used[first + 1 : first + 1 + count]) for first, count in runs]
        for case, runs in layouts.items()
    }


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize(("rows", "records", "shards"), CASES)
def test_shards_use_the_seed_rows_of_an_unsharded_run(
    engine_runs: dict[Case, list[tuple[list[int], list[list[int]]]]],
    rows: int,
    records: int,
    shards: int,
    sampling: str,
) -> None:
    for oracle, per_shard in engine_runs[(rows, records, shards, sampling)]:
        sharded = [row for shard in per_shard for row in shard]
        assert len(sharded) == records
        if sampling == "ordered":
            assert sharded == oracle  # the same rows for the same records, in the same order
        else:
            # SHUFFLE draws a random order (and, past whole cycles, a random subset): the same number of uses per
            # row, the same rows whenever every row is used.
            assert sorted(Counter(sharded).values()) == sorted(Counter(oracle).values())
            if records >= len(set(oracle)) and records >= (max(oracle) - min(oracle) + 1):
                assert set(sharded) == set(oracle)
