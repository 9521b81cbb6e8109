"""The node's config builder: the stored config with the columns Data Designer's YAML round trip changes taken
from the builder's own objects; and the plugins a recipe uses, checked where it runs."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import data_designer.config as dd
import pytest
from pydantic import BaseModel, Field

from ddslurm.config import BuildRequest, PluginRecord, RecipeSource, UnknownType, read_yaml, to_builtins
from ddslurm.runtime._builder import build, rebuilt_columns
from ddslurm.runtime._node_recipe import node_builder, request_difference, round_trip_changes
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


class Verdict(BaseModel):
    """An output schema whose fields are out of alphabetical order (Data Designer's write_config sorts them)."""

    verdict: str = Field(description="yes or no")
    reason: str = Field(description="why, in one sentence")
    confidence: int = Field(description="from 0 to 9")


ORDER = ["verdict", "reason", "confidence"]


STRUCTURED_SCRIPT = """\
import data_designer.config as dd
from pydantic import BaseModel, Field


class Verdict(BaseModel):
    verdict: str = Field(description="yes or no")
    reason: str = Field(description="why, in one sentence")
    confidence: int = Field(description="from 0 to 9")


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
    builder.add_column(
        dd.LLMStructuredColumnConfig(name="answer", model_alias="m", prompt="{{ loud }}?", output_format=Verdict)
    )
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
    builder.add_column(
        dd.LLMStructuredColumnConfig(
            name="answer", model_alias="judge", prompt="Is {{ n }} loud?", output_format=Verdict
        )
    )
    return builder


def _yaml(builder: dd.DataDesignerConfigBuilder, tmp_path: Path, *, sort_keys: bool = False) -> str:
    """The builder's config as ddslurm writes it (``sort_keys=False``) or as Data Designer's default does."""
    builder.write_config(tmp_path / "recipe.yaml", sort_keys=sort_keys)
    return (tmp_path / "recipe.yaml").read_text()


def _as_the_node_reads(text: str) -> dict[str, Any]:
    return dict(to_builtins(read_yaml(Path("recipe.yaml"), text=text)))


def test_the_round_trip_names_exactly_the_columns_yaml_changes_and_what_it_changes(tmp_path: Path) -> None:
    builder = _builder()
    changes = round_trip_changes(builder, _yaml(builder, tmp_path))
    assert sorted(changes) == ["grade", "loud"]
    assert "cannot read it back" in changes["loud"], changes
    assert changes["grade"] == "scores[0].options: keys 1, 2 read back as '1', '2'", changes


def test_every_column_on_the_node_sends_what_the_builders_sends(tmp_path: Path) -> None:
    """The YAML ddslurm writes keeps the output schema's field order and descriptions; with the columns it does
    not carry taken from the builder, the node's config equals the builder's column by column, field by field
    (mappings compared in order, keys by type)."""
    builder = _builder()
    text = _yaml(builder, tmp_path)
    recipe = _as_the_node_reads(text)
    written = next(c for c in recipe["data_designer"]["columns"] if c["name"] == "answer")
    assert list(written["output_format"]["properties"]) == ORDER
    assert written["output_format"]["properties"]["reason"]["description"] == "why, in one sentence"
    made = {c.name: c for c in builder.get_column_configs()}
    rebuilt = {name: made[name] for name in round_trip_changes(builder, text)}
    node = node_builder(recipe, rebuilt)
    assert [c.name for c in node.get_column_configs()] == list(made)
    for column in node.get_column_configs():
        assert request_difference(made[column.name], column) is None, column.name
    assert list(made["answer"].output_format["properties"]) == ORDER


def test_a_structured_column_whose_yaml_sorts_its_fields_is_named_and_taken_from_the_builder(tmp_path: Path) -> None:
    """Data Designer's default write_config sorts the output schema's fields, which are in the prompt the column
    sends: the comparison names that column (dict equality alone would not) and its rebuilt config is the
    builder's, field order included."""
    builder = _builder()
    text = _yaml(builder, tmp_path, sort_keys=True)
    changes = round_trip_changes(builder, text)
    assert sorted(changes) == ["answer", "grade", "loud"], changes
    assert changes["answer"] == (
        "output_format.properties: its keys in the order 'verdict', 'reason', 'confidence' read back in the order "
        "'confidence', 'reason', 'verdict'"
    )
    recipe = _as_the_node_reads(text)
    made = {c.name: c for c in builder.get_column_configs()}
    read = {c.name: c for c in node_builder(recipe, {n: made[n] for n in ("grade", "loud")}).get_column_configs()}
    assert read["answer"].output_format == made["answer"].output_format  # equal as dicts: order is not compared
    assert list(read["answer"].output_format["properties"]) != ORDER
    node = node_builder(recipe, {name: made[name] for name in changes})
    assert list(node.get_column_configs()[-1].output_format["properties"]) == ORDER


def test_the_comparison_is_ordered_and_typed_and_names_where_the_columns_differ() -> None:
    def shout(row: dict[str, Any]) -> dict[str, Any]:
        return row

    def other(row: dict[str, Any]) -> dict[str, Any]:
        return row

    assert request_difference({"b": 1, "a": 2}, {"a": 2, "b": 1}) == (
        "the column: its keys in the order 'b', 'a' read back in the order 'a', 'b'"
    )
    assert request_difference({"x": {1: "no"}}, {"x": {"1": "no"}}) == "x: keys 1 read back as '1'"
    assert request_difference({"x": [1, 2]}, {"x": [1, 2.0]}) == "x[1]: 2 (int) reads back as 2.0 (float)"
    assert request_difference({"x": (1,)}, {"x": [1]}) == "x: (1,) (tuple) reads back as [1] (list)"
    assert request_difference({"x": [1, 2]}, {"x": [1]}) == "x: 2 items read back as 1"
    assert request_difference({"f": shout}, {"f": shout}) is None
    assert (request_difference({"f": shout}, {"f": other}) or "").startswith("f: <function")
    assert request_difference({"f": shout}, {"f": "shout"}) is not None
    assert request_difference(float("nan"), float("nan")) is None
    score = dd.Score(name="q", description="d", options={"a": "A"})
    changed = dd.Score(name="q", description="e", options={"a": "A"})
    assert request_difference(score, score.model_copy()) is None
    assert request_difference([score], [changed]) == "[0].description: 'd' reads back as 'e'"
    sampler = dd.SamplerColumnConfig(name="t", sampler_type="category", params=dd.CategorySamplerParams(values=["a"]))
    # Data Designer keeps an enum's value (use_enum_values) but a default as the member: the same request
    assert request_difference(sampler, sampler.model_validate(sampler.model_dump(mode="json"))) is None


def test_the_builder_writes_the_configs_own_key_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``inspect``'s build: the YAML keeps the output schema's field order, so the structured column is not among
    the columns the node takes from the script; those it is are named with why."""
    script = tmp_path / "build.py"
    script.write_text(STRUCTURED_SCRIPT)
    monkeypatch.chdir(tmp_path)
    answer = build(BuildRequest(script=str(script), function="load_config_builder", run_dir=str(tmp_path)))
    assert answer.ok, answer
    columns = _as_the_node_reads(answer.yaml)["data_designer"]["columns"]
    assert list(columns[-1]["output_format"]["properties"]) == ORDER
    assert answer.rebuild == ("loud",) and "cannot read it back" in answer.changes["loud"], answer


def test_the_build_records_the_line_that_made_each_column_and_model_and_leaves_data_designer_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``inspect``'s build answers where the script made each column (its ``add_column`` line) and each model config
    (its ``ModelConfig(...)`` line), the lines counted here from the script; Data Designer's classes are restored."""
    script = tmp_path / "build.py"
    text = STRUCTURED_SCRIPT.replace(
        "dd.DataDesignerConfigBuilder()",
        "dd.DataDesignerConfigBuilder(\n"
        '        model_configs=[dd.ModelConfig(alias="m", model="x", provider="p")]\n'
        "    )",
    )
    script.write_text(text)
    monkeypatch.chdir(tmp_path)
    add_column, init = dd.DataDesignerConfigBuilder.add_column, dd.ModelConfig.__dict__.get("__init__")
    answer = build(BuildRequest(script=str(script), function="load_config_builder", run_dir=str(tmp_path)))
    lines = text.splitlines()

    def line(needle: str) -> int:
        return next(i for i, t in enumerate(lines, 1) if needle in t)

    assert answer.ok, answer
    assert {at.file for at in answer.columns_at.values()} == {str(script)}
    made = {name: at.line for name, at in answer.columns_at.items()}
    assert made["loud"] == line('name="loud"') and set(made) == {"topic", "loud", "answer"}
    for name in ("topic", "answer"):  # a call over two lines: its first (the interpreter's choice), or its config's
        assert made[name] in (line(f'name="{name}"') - 1, line(f'name="{name}"')), (name, made)
    assert {a: (at.file, at.line) for a, at in answer.models_at.items()} == {"m": (str(script), line('alias="m"'))}
    assert dd.DataDesignerConfigBuilder.add_column is add_column and dd.ModelConfig.__dict__.get("__init__") is init


def test_the_node_builder_puts_the_builders_columns_back_with_the_stored_drop(tmp_path: Path) -> None:
    import yaml

    builder = _builder()
    recipe = yaml.safe_load(_yaml(builder, tmp_path))
    rebuilt = {c.name: c for c in builder.get_column_configs() if c.name in {"loud", "grade"}}
    recipe["data_designer"]["columns"][1]["drop"] = True  # what a stage may change in a stored column
    node = node_builder(recipe, rebuilt)
    by_name = {c.name: c for c in node.get_column_configs()}
    assert [c.name for c in node.get_column_configs()] == ["topic", "loud", "grade", "n", "answer"]
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
    assert unknown_types(recipe) == (
        UnknownType(where="column 'b'", field="column_type", type="no-such-column"),
        UnknownType(where="processor 'p'", field="processor_type", type="no-such-processor"),
    )
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
