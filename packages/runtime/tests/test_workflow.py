"""A builder that returns a Data Designer workflow (``compose_workflow``): ``inspect``'s build answers the config of
the stage asked for, seeded as Data Designer's own ``CompositeWorkflow.run`` seeds it, and the workflow's shape;
what a stage adds that no sharded run can do as Data Designer does is refused with why; the node takes a stage's
``rebuild`` columns from that stage's builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ddslurm.config import BuildAnswer, BuildRequest, RecipeSource, WorkflowShape, WorkflowStage
from ddslurm.runtime._builder import build, rebuilt_columns
from ddslurm.runtime.errors import RecipeError

pytestmark = pytest.mark.dd

pytest.importorskip("data_designer.interface.composite_workflow", reason="this Data Designer has no workflows")

SCRIPT = """\
import data_designer.config as dd
from data_designer.interface import DataDesigner


@dd.custom_column_generator(required_columns=["topic"])
def shout(row):
    row["loud"] = row["topic"].upper()
    return row


def load_config_builder():
    first = dd.DataDesignerConfigBuilder()
    first.add_column(
        dd.SamplerColumnConfig(name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a"]))
    )
    second = dd.DataDesignerConfigBuilder()
    second.add_column(dd.CustomColumnConfig(name="loud", generator_function=shout))
    workflow = DataDesigner(artifact_path="artifacts").compose_workflow(name="chain")
    workflow.add_stage("topics", first, num_records=5)
    workflow.add_stage("shout", second, sampling_strategy=dd.SamplingStrategy.SHUFFLE{extra})
    return workflow
"""


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "", **request: Any) -> BuildAnswer:
    script = tmp_path / "build.py"
    script.write_text(SCRIPT.replace("{extra}", extra))
    monkeypatch.chdir(tmp_path)
    return build(BuildRequest(script=str(script), function="load_config_builder", run_dir=str(tmp_path), **request))


def test_the_first_stage_is_what_a_plain_build_answers_with_the_workflows_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = _build(tmp_path, monkeypatch)
    assert answer.ok, answer
    assert answer.workflow == WorkflowShape(
        name="chain",
        stages=(
            WorkflowStage(name="topics", num_records=5, allow_empty=False),
            WorkflowStage(name="shout", num_records=None, allow_empty=False),
        ),
    )
    config = yaml.safe_load(answer.yaml)["data_designer"]
    assert [c["name"] for c in config["columns"]] == ["topic"] and config["seed_config"] is None
    assert answer.rebuild == ()


def test_a_later_stage_is_seeded_from_the_stage_befores_dataset_as_data_designer_seeds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    pq.write_table(pa.table({"topic": ["a", "a"]}), dataset / "part-00000.parquet")
    answer = _build(tmp_path, monkeypatch, stage=1, seed=str(dataset))
    assert answer.ok, answer
    config = yaml.safe_load(answer.yaml)["data_designer"]
    assert config["seed_config"] == {
        "source": {"seed_type": "local", "path": f"{dataset}/*.parquet"},
        "sampling_strategy": "shuffle",
        "selection_strategy": None,
    }
    assert answer.rebuild == ("loud",)  # the stage's custom column: the node takes it from that stage's builder


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        (", on_success=lambda path: path", "on_success runs a function of yours over the stage's whole output"),
        (
            ", output_processors=[dd.DropColumnsProcessorConfig(name='d', column_names=['loud'])]",
            "output_processors run over the stage's whole output",
        ),
    ],
)
def test_a_stage_no_sharded_run_can_make_as_data_designer_does_is_refused_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str, refusal: str
) -> None:
    answer = _build(tmp_path, monkeypatch, extra=extra)
    assert not answer.ok
    assert answer.error.startswith("load_config_builder() workflow 'chain', stage 2 'shout': " + refusal), answer
    assert answer.file == str(tmp_path / "build.py") and answer.line == 11, answer


def test_a_builder_that_no_longer_returns_a_workflow_is_refused_for_a_later_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "build.py"
    script.write_text(
        "import data_designer.config as dd\n\ndef load_config_builder():\n    return dd.DataDesignerConfigBuilder()\n"
    )
    monkeypatch.chdir(tmp_path)
    answer = build(BuildRequest(script=str(script), function="load_config_builder", run_dir=str(tmp_path), stage=1))
    assert not answer.ok and "no longer returns a workflow" in answer.error, answer


def test_the_node_takes_a_stages_columns_from_that_stages_builder(tmp_path: Path) -> None:
    copy = tmp_path / "recipe-source.py"
    copy.write_text(SCRIPT.replace("{extra}", ""))
    source = RecipeSource(
        file=str(copy), sha256="-", builder=f"{copy}:load_config_builder", origin=str(copy), rebuild=("loud",), stage=1
    )
    columns = rebuilt_columns(source, ["loud"])
    assert list(columns) == ["loud"] and callable(columns["loud"].generator_function)
    first = RecipeSource(file=str(copy), sha256="-", builder=f"{copy}:load_config_builder", origin=str(copy), stage=0)
    with pytest.raises(RecipeError, match="no column 'loud'"):
        rebuilt_columns(first, ["loud"])
