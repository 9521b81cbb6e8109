"""Progress within a batch: Data Designer's finished cells reach the runtime as they happen, so a shard's rows move
record by record instead of jumping once per batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddslurm.runtime._progress import CellProgress
from ddslurm.runtime.testing import script_answer

pytestmark = [pytest.mark.dd]

SCRIPT = """
import json, os, sys
from pathlib import Path
from ddslurm.config import ProviderSnapshot, SnapshotModel, SnapshotProvider
from ddslurm.runtime._engine import EngineRequest, engine_environment, run_engine

tmp, base_url = Path(sys.argv[1]), sys.argv[2]
os.environ.update(engine_environment(tmp / "home"))
writer = "demo/writer-8b"
recipe = {"data_designer": {
    "columns": [
        {"name": "topic", "column_type": "sampler", "sampler_type": "category",
         "params": {"sampler_type": "category", "values": ["a", "b"]}},
        {"name": "q", "column_type": "llm-text", "model_alias": "writer", "prompt": "Ask about {{ topic }}"},
        {"name": "a", "column_type": "llm-text", "model_alias": "writer", "prompt": "Answer {{ q }}"},
    ],
    "model_configs": [{"alias": "writer", "model": writer, "provider": "hosted"}],
}}
snapshot = ProviderSnapshot(
    providers=(SnapshotProvider(name="hosted", endpoint=base_url, api_key_env="HOSTED_KEY"),),
    models=(SnapshotModel(alias="writer", model=writer, provider="hosted", skip_health_check=True),),
)
cells = []
batches = []
result = run_engine(EngineRequest(
    recipe=recipe, snapshot=snapshot, endpoints={}, artifact_path=tmp / "out", scratch_home=tmp / "home",
    dataset_name="d", num_records=6, buffer_size=3, serving=None,
    on_batch_complete=lambda path: batches.append(len(cells)), on_cell=lambda: cells.append(1),
))
print(json.dumps({"rows": result.rows, "cells": len(cells), "cells_at_batches": batches}))
"""


def test_data_designers_finished_cells_reach_the_runtime(hosted_endpoint: Any, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOSTED_KEY": hosted_endpoint.api_key, "HOME": str(tmp_path)}
    seen = script_answer(SCRIPT, str(tmp_path), hosted_endpoint.base_url, env=env)
    assert seen["rows"] == 6
    assert seen["cells"] == 12  # 6 records x 2 LLM columns, each counted once
    # The cells of the first batch were reported before that batch was written, not after.
    assert seen["cells_at_batches"][0] >= 6


def test_cell_progress_estimates_the_batch_in_progress_and_never_a_whole_batch() -> None:
    now = [0.0]
    cells = CellProgress(2, 10, clock=lambda: now[0], interval=1.0)
    assert cells.cell_done() == (0, 0, 0)  # the first cell reports at once: 1 cell of 2 columns
    assert cells.cell_done() is None  # within the interval: nothing to report
    for _ in range(8):
        cells.cell_done()
    now[0] = 1.5
    assert cells.cell_done() == (0, 0, 5)  # 11 cells over 2 columns
    for _ in range(30):
        cells.cell_done()
    now[0] = 3.0
    assert cells.cell_done() == (0, 0, 9)  # capped one short of the batch: only a written batch is complete
    cells.batch_done(10, 1)
    now[0] = 4.5
    assert cells.cell_done() == (10, 1, 0)
