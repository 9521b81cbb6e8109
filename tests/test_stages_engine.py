"""``stages: auto`` with the real Data Designer engine: a mixed recipe run in two stages (GPU stage, then a CPU
stage reading its Parquet output as the seed dataset) makes the dataset a single-stage run makes.

The oracle is a plain local ``DataDesigner.create`` of the whole recipe. Both sides talk to the vLLM stand-in,
whose replies are a pure function of the request, and draw the samplers from the same numpy seed in one row
group at a time, so every column is comparable row by row. In stage 2 the local model's provider points at a
closed port: stage 2 must not need the local model at all.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import final_columns, split_stages, stage_recipe
from ddslurm.runtime import recipe_columns
from ddslurm.runtime.testing import script_answer

pytestmark = pytest.mark.dd

DEAD_ENDPOINT = "http://127.0.0.1:9/v1"
SEED = Path(__file__).resolve().parent.parent / "examples" / "mixed" / "questions.csv"
RECORDS = 14  # more than the seed's 12 rows: Data Designer cycles through them (ORDERED)

# Runs Data Designer for every job on stdin ({"name", "recipe", "records", "providers"}; records null: the rows of
# the previous job's output; "numbered_seed": a path to write the previous job's rows to first, numbered as a CPU
# stage's seed file is) and prints {name: dataset directory}.
ENGINE = r"""
import json, os, sys, tempfile
home = tempfile.mkdtemp(); os.makedirs(home + "/managed-assets")
os.environ.update(DATA_DESIGNER_HOME=home, NEMO_TELEMETRY_ENABLED="false", HF_HUB_OFFLINE="1",
                  DISABLE_DATA_DESIGNER_PLUGINS="true")
from ddslurm.runtime._engine import _estimate_tokens_offline, preload_engine
preload_engine()  # as the client step imports it (frozen): no collection of the runs walks its classes
import numpy as np
import data_designer.config as dd
from data_designer.interface import DataDesigner
_estimate_tokens_offline()
artifacts, jobs = sys.argv[1], json.load(sys.stdin)
out, rows = {}, 0
for job in jobs:
    if job.get("numbered_seed"):
        import pyarrow.parquet as pq
        from ddslurm.runtime._shard_seed import numbered
        pq.write_table(numbered(pq.read_table(out[previous] + "/parquet-files")), job["numbered_seed"])
    previous = job["name"]
    providers = [dd.ModelProvider(name=name, endpoint=url, provider_type="openai", api_key=None)
                 for name, url in job["providers"].items()]
    designer = DataDesigner(artifact_path=artifacts, model_providers=providers,
                            managed_assets_path=home + "/managed-assets")
    # one row group at a time: the samplers draw from numpy's global state in the same order in every run
    designer.set_run_config(dd.RunConfig(buffer_size=5, max_concurrent_row_groups=1, otel_metrics_port=None))
    np.random.seed(1234)
    builder = dd.DataDesignerConfigBuilder.from_config(job["recipe"])
    result = designer.create(builder, num_records=job["records"] or rows, dataset_name=job["name"])
    rows = len(result.load_dataset())
    out[job["name"]] = str(result.artifact_storage.base_dataset_path)
print(json.dumps(out))
"""


def _recipe(seed: Path, *, local_reads_sampler: bool) -> dict[str, Any]:
    level = "({{ difficulty }}) " if local_reads_sampler else ""

    def model(alias: str, name: str, provider: str, temperature: float) -> dict[str, Any]:
        params = {"temperature": temperature, "top_p": 0.95, "max_tokens": 128, "max_parallel_requests": 8}
        return {"alias": alias, "model": name, "provider": provider, "inference_parameters": params}

    scores = [
        {
            "name": "Correctness",
            "description": "Does it answer?",
            "options": {"1": "wrong", "2": "partly", "3": "right"},
        },
        {"name": "Readability", "description": "Is it clear?", "options": {"1": "hard", "2": "fair", "3": "clear"}},
    ]
    return {
        "data_designer": {
            "model_configs": [
                model("generator", "local-8b", "local", 0.2),
                model("judge", "hosted-70b", "hosted", 0.0),
            ],
            "seed_config": {"source": {"seed_type": "local", "path": str(seed)}, "sampling_strategy": "ordered"},
            "columns": [
                {
                    "name": "difficulty",
                    "column_type": "sampler",
                    "sampler_type": "category",
                    "params": {"values": ["simple", "with a join", "with a window function"]},
                },
                # read only by the hosted judge: in the stage of the other sampler
                {
                    "name": "tone",
                    "column_type": "sampler",
                    "sampler_type": "category",
                    "params": {"values": ["strict", "lenient", "pedantic"]},
                },
                # dropped, read only by the local column: dropped in stage 1 already
                {"name": "context", "column_type": "expression", "expr": "Tables: {{ tables }}", "drop": True},
                {
                    "name": "sql",
                    "column_type": "llm-code",
                    "model_alias": "generator",
                    "code_lang": "sql:postgres",
                    "prompt": "{{ context }}\nWrite a query " + level + "that answers: {{ question }}",
                    "with_trace": "last_message",  # a nested side-effect column that passes through stage 2
                },
                # dropped, read by the hosted judge: stage 1 keeps it, stage 2 drops it
                {
                    "name": "notes",
                    "column_type": "llm-text",
                    "model_alias": "generator",
                    "prompt": "Explain this query in one sentence: {{ sql }}",
                    "drop": True,
                    "with_trace": "last_message",  # Data Designer drops the column, not its side effect
                },
                {
                    "name": "sql_quality",
                    "column_type": "llm-judge",
                    "model_alias": "judge",
                    "prompt": "Be {{ tone }}. Question: {{ question }}\nSQL:\n{{ sql }}\nNotes: {{ notes }}",
                    "scores": scores,
                },
                {"name": "sql_chars", "column_type": "expression", "dtype": "int", "expr": "{{ sql | length }}"},
                # depends on both stages' columns
                {
                    "name": "verdict",
                    "column_type": "expression",
                    "expr": "{{ sql_chars }} chars, {{ difficulty }}, correctness {{ sql_quality.Correctness.score }}",
                },
            ],
        }
    }


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One stand-in serving both models; the two providers ("local" and "hosted") are two names for it."""
    from fake_vllm.testing import start_server

    log = tmp_path_factory.mktemp("fake") / "server.log"
    with start_server("local-8b", args=["--served-model-name", "local-8b", "hosted-70b"], log_path=log) as server:
        yield server.base_url


def _run(artifacts: Path, jobs: list[dict[str, Any]]) -> dict[str, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATA_DESIGNER")}
    return {k: Path(v) for k, v in script_answer(ENGINE, str(artifacts), input=json.dumps(jobs), env=env).items()}


@pytest.mark.parametrize(
    ("local_reads_sampler", "gpu_columns", "cpu_columns"),
    [
        # the samplers go to the GPU stage with the local column that reads one
        (True, ("difficulty", "tone", "context", "sql", "notes"), ("sql_quality", "sql_chars", "verdict")),
        # no local column reads a sampler: stage 2 draws them, next to its seed dataset
        (False, ("context", "sql", "notes"), ("difficulty", "tone", "sql_quality", "sql_chars", "verdict")),
    ],
)
def test_two_stages_make_the_single_stage_dataset(
    tmp_path: Path, endpoint: str, local_reads_sampler: bool, gpu_columns: tuple[str, ...], cpu_columns: tuple[str, ...]
) -> None:
    recipe = _recipe(SEED, local_reads_sampler=local_reads_sampler)
    split = split_stages(recipe, recipe_columns(recipe), {"generator"})
    assert split.split, split.reason
    gpu, cpu = split.stages
    assert (gpu.columns, gpu.keep, cpu.columns) == (gpu_columns, ("notes",), cpu_columns)

    artifacts = tmp_path / "artifacts"
    stage_seed = tmp_path / "stage-seed.parquet"  # stage 1's rows, numbered, as the node writes them
    both = {"local": endpoint, "hosted": endpoint}
    out = _run(
        artifacts,
        [
            {"name": "single", "recipe": recipe, "records": RECORDS, "providers": both},
            {"name": "stage1", "recipe": stage_recipe(recipe, split, 0), "records": RECORDS, "providers": both},
            {
                "name": "stage2",
                "recipe": stage_recipe(recipe, split, 1, seed_path=str(stage_seed)),
                "numbered_seed": str(stage_seed),
                "records": None,  # every row of stage 1, once
                "providers": {"local": DEAD_ENDPOINT, "hosted": endpoint},
            },
        ],
    )
    assert out["stage1"] == artifacts / "stage1"  # the seed path named the directory stage 1 wrote
    assert len(list((artifacts / "stage1" / "parquet-files").glob("*.parquet"))) == 3  # 14 rows, buffer 5

    with SEED.open(newline="") as fh:
        seed_rows = list(csv.DictReader(fh))
    seed_columns = list(seed_rows[0])
    order = final_columns(recipe, recipe_columns(recipe), seed_columns)
    assert order == (
        "question",
        "tables",
        "difficulty",
        "tone",
        "sql",
        "sql__trace",
        "sql_chars",  # one model call deep, as sql: Data Designer writes it before the deeper columns
        "notes__trace",
        "sql_quality",
        "verdict",
    )

    stage1_names = pq.read_schema(next((out["stage1"] / "parquet-files").glob("*.parquet"))).names
    # stage 1 outputs the kept dropped column and the seed columns; the dropped column only it reads is gone
    assert "notes" in stage1_names and "context" not in stage1_names and set(seed_columns) <= set(stage1_names)
    # the same columns; Data Designer's own order changes from run to run, so both are put in final_columns' order
    assert order is not None
    single_table, two_table = (pq.read_table(out[name] / "parquet-files") for name in ("single", "stage2"))
    assert set(single_table.column_names) == set(order) == set(two_table.column_names)
    single, two = (t.select(list(order)).to_pylist() for t in (single_table, two_table))
    assert len(single) == len(two) == RECORDS
    for i, (a, b) in enumerate(zip(single, two, strict=True)):
        seed = seed_rows[i % len(seed_rows)]
        assert {c: a[c] for c in seed_columns} == seed == {c: b[c] for c in seed_columns}, f"row {i}"
        assert list(a.items()) == list(b.items()), f"row {i}"  # every column, in order
    # the stand-in's replies differ per prompt: the comparison is not vacuous
    assert len({r["sql"] for r in single}) > 1 and len({json.dumps(r["sql_quality"]) for r in single}) > 1
    assert len({r["difficulty"] for r in single}) > 1 and len({r["tone"] for r in single}) > 1
