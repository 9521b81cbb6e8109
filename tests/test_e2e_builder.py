"""A run whose recipe is a Data Designer builder script (``recipe: build.py``), end to end on the real local Slurm
cluster and the real engine: the script runs once on the submit host, the nodes run the config it built."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ddslurm.config import RunLayout, read_plan
from ddslurm.launcher import Slurm, collect_local, run_status, submit

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

BUILD = """\
import data_designer.config as dd


def load_config_builder() -> dd.DataDesignerConfigBuilder:
    builder = dd.DataDesignerConfigBuilder(
        model_configs=[
            dd.ModelConfig(
                alias="writer",
                model="demo/writer-8b",
                provider="demo-hosted",
                inference_parameters=dd.ChatCompletionInferenceParams(max_parallel_requests=8, max_tokens=64),
            )
        ]
    )
    builder.add_column(
        dd.SamplerColumnConfig(
            name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["rain", "bread"])
        )
    )
    builder.add_column(dd.LLMTextColumnConfig(name="question", model_alias="writer", prompt="Ask about {{ topic }}."))
    builder.add_column(dd.ExpressionColumnConfig(name="n", expr="{{ question | length }}", dtype="int"))
    builder.with_seed_dataset(dd.LocalFileSeedSource(path="people.csv"))
    return builder
"""


def test_a_builder_script_run_generates_on_the_nodes(make_run_files: Any, scan_for_secret: Any) -> None:
    files = make_run_files("builder", num_records=4, shards=2, buffer_size=2)
    recipes = files.root / "recipes"
    recipes.mkdir()
    (recipes / "build.py").write_text(BUILD)
    (recipes / "people.csv").write_text("person\nada\ngrace\nalan\nedsger\n")
    files.run_file.write_text(files.run_file.read_text().replace("recipe: recipe.yaml", "recipe: recipes/build.py"))

    slurm = Slurm(env=files.env)
    done = submit(files.run_file, files.profile, slurm=slurm, env=files.env)
    layout = RunLayout(done.layout.root)
    assert layout.recipe_source.read_bytes() == (recipes / "build.py").read_bytes()
    plan = read_plan(layout.plan)
    assert plan.recipe_source is not None and plan.seed is not None and plan.seed.rows == 4

    deadline = time.monotonic() + 240
    status = run_status(layout, slurm)
    while status.state in {"pending", "running"} and time.monotonic() < deadline:
        time.sleep(2)
        status = run_status(layout, slurm)
    assert status.state == "succeeded", status
    collected = collect_local(layout, overwrite=False)
    assert collected.rows == 4
    import pyarrow.parquet as pq

    table = pq.read_table(collected.dataset)
    assert sorted(table.column("person").to_pylist()) == ["ada", "alan", "edsger", "grace"]  # seed beside build.py
    assert all(q for q in table.column("question").to_pylist())
    assert scan_for_secret(layout.root, files.env["DEMO_HOSTED_API_KEY"]) == []
