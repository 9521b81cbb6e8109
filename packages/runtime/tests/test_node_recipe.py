"""The node's config builder: the stored config with the columns Data Designer's YAML round trip changes taken
from the builder's own objects; and the plugins a recipe uses, checked where it runs."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import data_designer.config as dd
import pytest

from ddslurm.config import PluginRecord, RecipeSource
from ddslurm.runtime._builder import rebuilt_columns
from ddslurm.runtime._node_recipe import node_builder, round_trip_changes
from ddslurm.runtime._plugins import check_plugins, unknown_types, used_plugins
from ddslurm.runtime.errors import RecipeError

pytestmark = pytest.mark.dd

SCRIPT = """\
import data_designer.config as dd


@dd.custom_column_generator(required_columns=["topic"])
def shout(row):
    row["loud"] = row["topic"].upper()
    return row


def load_config_builder():
    builder = dd.DataDesignerConfigBuilder()
    builder.add_column(
        dd.SamplerColumnConfig(name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a"]))
    )
    builder.add_column(dd.CustomColumnConfig(name="loud", generator_function=shout))
    return builder
"""


def _builder() -> dd.DataDesignerConfigBuilder:
    @dd.custom_column_generator(required_columns=["topic"])
    def shout(row: dict[str, Any]) -> dict[str, Any]:
        row["loud"] = row["topic"].upper()
        return row

    builder = dd.DataDesignerConfigBuilder(
        model_configs=[dd.ModelConfig(alias="judge", model="m", provider="p")],
    )
    builder.add_column(
        dd.SamplerColumnConfig(name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a"]))
    )
    builder.add_column(dd.CustomColumnConfig(name="loud", generator_function=shout))
    builder.add_column(
        dd.LLMJudgeColumnConfig(
            name="grade",
            model_alias="judge",
            prompt="Grade {{ loud }}",
            scores=[dd.Score(name="q", description="d", options={1: "bad", 2: "good"})],
        )
    )
    builder.add_column(dd.ExpressionColumnConfig(name="n", expr="{{ topic }}"))
    return builder


def _yaml(builder: dd.DataDesignerConfigBuilder, tmp_path: Path) -> str:
    builder.write_config(tmp_path / "recipe.yaml")
    return (tmp_path / "recipe.yaml").read_text()


def test_the_round_trip_names_exactly_the_columns_yaml_changes_and_what_it_changes(tmp_path: Path) -> None:
    builder = _builder()
    changes = round_trip_changes(builder, _yaml(builder, tmp_path))
    assert sorted(changes) == ["grade", "loud"]
    assert "cannot read it back" in changes["loud"], changes
    assert changes["grade"].startswith("scores ") and "1: 'bad'" in changes["grade"], changes
    assert "'1': 'bad'" in changes["grade"], changes


def test_the_node_builder_puts_the_builders_columns_back_with_the_stored_drop(tmp_path: Path) -> None:
    import yaml

    builder = _builder()
    recipe = yaml.safe_load(_yaml(builder, tmp_path))
    rebuilt = {c.name: c for c in builder.get_column_configs() if c.name in {"loud", "grade"}}
    recipe["data_designer"]["columns"][1]["drop"] = True  # what a stage may change in a stored column
    node = node_builder(recipe, rebuilt)
    by_name = {c.name: c for c in node.get_column_configs()}
    assert [c.name for c in node.get_column_configs()] == ["topic", "loud", "grade", "n"]
    assert by_name["loud"].generator_function is rebuilt["loud"].generator_function and by_name["loud"].drop
    assert by_name["grade"].scores[0].options == {1: "bad", 2: "good"}
    with pytest.raises(RecipeError, match="not a valid Data Designer config"):
        node_builder(recipe, {})  # without them, the stored custom column cannot be read


def test_the_node_runs_the_runs_copy_of_the_script_even_where_its_origin_is_gone(tmp_path: Path) -> None:
    copy = tmp_path / "inputs" / "recipe-source.py"
    copy.parent.mkdir()
    copy.write_text(SCRIPT)
    origin = tmp_path / "gone" / "build.py"  # the submit host's path, absent on this node
    source = RecipeSource(file=str(copy), sha256="-", builder=f"{origin}:load_config_builder", origin=str(origin))
    columns = rebuilt_columns(source, ["loud"])
    assert list(columns) == ["loud"] and callable(columns["loud"].generator_function)
    with pytest.raises(RecipeError, match="no column 'missing'"):
        rebuilt_columns(source, ["loud", "missing"])
    copy.write_text(SCRIPT.replace("def load_config_builder", "def renamed"))
    with pytest.raises(RecipeError, match="load_config_builder"):
        rebuilt_columns(source, ["loud"])


def test_types_no_plugin_provides_are_named_with_where_they_are() -> None:
    recipe = {
        "columns": [
            {"name": "a", "column_type": "sampler"},
            {"name": "b", "column_type": "no-such-column"},
        ],
        "processors": [{"name": "p", "processor_type": "no-such-processor", "column_names": ["a"]}],
        "seed_config": {"source": {"seed_type": "local", "path": "x.csv"}},
    }
    assert unknown_types(recipe) == [
        {"where": "column 'b'", "field": "column_type", "type": "no-such-column"},
        {"where": "processor 'p'", "field": "processor_type", "type": "no-such-processor"},
    ]
    assert used_plugins(recipe) == ()


def test_the_node_refuses_plugins_it_does_not_have_as_planned() -> None:
    version = importlib.metadata.version("data-designer")
    other = PluginRecord(name="x", plugin_type="column-generator", distribution="data-designer", version="0.0.1")
    with pytest.raises(RecipeError, match=f"data-designer 0.0.1 in python_env; here it is at version {version}"):
        check_plugins([other])
    gone = PluginRecord(name="x", plugin_type="column-generator", distribution="no-such-dist", version="1")
    with pytest.raises(RecipeError, match="here it is not installed"):
        check_plugins([gone])
    unloaded = PluginRecord(name="x", plugin_type="column-generator", distribution="data-designer", version=version)
    with pytest.raises(RecipeError, match="Data Designer did not load it"):
        check_plugins([unloaded])
    check_plugins([])
