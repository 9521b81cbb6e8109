"""``stages: auto``'s pure pieces: which columns go to the GPU stage and which to the CPU stage, when a recipe
stays single-stage and why, the recipes each stage runs, and the column order of the final dataset."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ddslurm.config import STAGE_ROW, Stage, StageSplit, final_columns, split_stages, stage_recipe
from ddslurm.runtime import recipe_columns
from ddslurm.runtime.errors import RecipeError

# smoke: make test-isolated runs these with only the package's dependencies; dd: the split orders columns as Data
# Designer compiles them (make test-dd-range runs it under each supported version)
pytestmark = [pytest.mark.smoke, pytest.mark.dd]

MIXED = Path(__file__).resolve().parents[3] / "examples" / "mixed" / "recipe.yaml"
LOCAL = {"gen"}


def dd_split(r: dict[str, Any], local: set[str]) -> StageSplit:
    """The split of ``r`` on its columns as Data Designer reads them (what the submit host gives the planner)."""
    return split_stages(r, recipe_columns(r), local)


def dd_final_columns(r: dict[str, Any], seed_columns: Sequence[str]) -> tuple[str, ...] | None:
    return final_columns(r, recipe_columns(r), seed_columns)


def sampler(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "column_type": "sampler",
        "sampler_type": "category",
        "params": {"values": ["a", "b"]},
    } | extra


def llm(name: str, prompt: str, alias: str = "gen", column_type: str = "llm-text", **extra: Any) -> dict[str, Any]:
    return {"name": name, "column_type": column_type, "model_alias": alias, "prompt": prompt} | extra


def judge(name: str, prompt: str, alias: str = "judge", **extra: Any) -> dict[str, Any]:
    scores = [{"name": "Quality", "description": "How good?", "options": {"1": "bad", "2": "good"}}]
    return llm(name, prompt, alias, "llm-judge", scores=scores, **extra)


def expr(name: str, expression: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "column_type": "expression", "expr": expression} | extra


def recipe(*columns: dict[str, Any], **section: Any) -> dict[str, Any]:
    models = [
        {"alias": "gen", "model": "qwen3-8b", "provider": "local"},
        {"alias": "judge", "model": "judge-70b", "provider": "hosted"},
    ]
    seed = {"source": {"seed_type": "local", "path": "questions.csv"}, "sampling_strategy": "ordered"}
    return {"data_designer": {"model_configs": models, "seed_config": seed, "columns": list(columns)} | section}


def names(r: dict[str, Any]) -> list[str]:
    return [c["name"] for c in r["data_designer"]["columns"]]


def gpu_cpu(split: StageSplit) -> tuple[Stage, Stage]:
    assert split.split, split.reason
    gpu, cpu = split.stages
    assert (gpu.kind, cpu.kind) == ("gpu", "cpu") and cpu.keep == ()
    return gpu, cpu


# --- split_stages ---


def test_the_mixed_example_splits_into_the_local_generator_and_the_hosted_judge() -> None:
    mixed = yaml.safe_load(MIXED.read_text())
    split = dd_split(mixed, {"generator"})
    gpu, cpu = gpu_cpu(split)
    assert gpu == Stage("gpu", ("difficulty", "sql"))  # the local column and the sampler it reads
    assert cpu == Stage("cpu", ("sql_quality", "sql_chars"))  # the judge (local + seed columns) and an expression
    assert split.reason.startswith("two stages: GPU stage 2 column(s) ('difficulty', 'sql'); CPU stage 2 column(s)")


def test_shorthand_and_full_config_split_the_same_way() -> None:
    full = recipe(sampler("topic"), llm("draft", "{{ topic }}"), judge("score", "{{ draft }}"))
    assert dd_split(full["data_designer"], LOCAL) == dd_split(full, LOCAL)
    gpu, cpu = gpu_cpu(dd_split(full, LOCAL))
    assert (gpu.columns, cpu.columns) == (("topic", "draft"), ("score",))


def test_a_local_column_that_depends_on_a_hosted_column_keeps_the_recipe_in_one_stage() -> None:
    r = recipe(llm("outline", "{{ question }}", "judge"), llm("draft", "{{ outline }}"), judge("score", "{{ draft }}"))
    split = dd_split(r, LOCAL)
    assert split.stages == (Stage("gpu", ("outline", "draft", "score")),)
    assert "local column 'draft' depends on hosted column 'outline' (draft -> outline)" in split.reason


def test_the_reason_names_the_whole_chain_when_the_dependency_on_a_hosted_column_is_transitive() -> None:
    r = recipe(
        judge("rating", "{{ question }}"),
        expr("hint", "{{ rating.Quality.score }}"),
        llm("draft", "{{ hint }}"),
        judge("score", "{{ draft }}"),
    )
    split = dd_split(r, LOCAL)
    assert not split.split
    assert "local column 'draft' depends on hosted column 'rating' (draft -> hint -> rating)" in split.reason


def test_no_hosted_column_or_no_local_column_means_one_stage() -> None:
    all_local = recipe(sampler("topic"), llm("draft", "{{ topic }}"), judge("score", "{{ draft }}", "gen"))
    split = dd_split(all_local, LOCAL)
    assert split.stages == (Stage("gpu", ("topic", "draft", "score")),)
    assert "no column is hosted-only" in split.reason

    hosted_only = recipe(llm("draft", "{{ question }}", "judge"), judge("score", "{{ draft }}"))
    for local in (LOCAL, set()):
        split = dd_split(hosted_only, local)
        assert split.stages == (Stage("cpu", ("draft", "score")),)
        assert "no column uses a local model" in split.reason


def test_a_recipe_without_model_columns_is_one_cpu_stage() -> None:
    split = dd_split(recipe(sampler("topic"), expr("upper", "{{ topic | upper }}")), LOCAL)
    assert split.stages == (Stage("cpu", ("topic", "upper")),)


def test_a_dropped_column_the_cpu_stage_reads_is_kept_by_the_gpu_stage() -> None:
    r = recipe(
        expr("context", "{{ tables }}", drop=True),  # read only by the local column: stays dropped in stage 1
        llm("draft", "{{ context }} {{ question }}", drop=True),  # read by the hosted judge: kept
        llm("notes", "{{ draft }}"),
        judge("score", "{{ draft }} {{ notes }}"),
    )
    split = dd_split(r, LOCAL)
    gpu, cpu = gpu_cpu(split)
    assert gpu == Stage("gpu", ("context", "draft", "notes"), keep=("draft",))
    assert cpu.columns == ("score",)
    assert "keeps dropped column(s) 'draft' for the CPU stage" in split.reason


def test_an_expression_over_both_stages_and_one_over_local_columns_only_go_to_the_cpu_stage() -> None:
    r = recipe(
        llm("draft", "{{ question }}"),
        judge("score", "{{ draft }}"),
        expr("length", "{{ draft | length }}", dtype="int"),
        expr("summary", "{{ length }} {{ score.Quality.score }}"),
    )
    gpu, cpu = gpu_cpu(dd_split(r, LOCAL))
    assert gpu.columns == ("draft",)
    assert cpu.columns == ("score", "length", "summary")


def test_samplers_only_hosted_columns_read_go_to_the_cpu_stage() -> None:
    r = recipe(sampler("tone"), llm("draft", "{{ question }}"), judge("score", "{{ tone }} {{ draft }}"))
    gpu, cpu = gpu_cpu(dd_split(r, LOCAL))
    assert (gpu.columns, cpu.columns) == (("draft",), ("tone", "score"))


def test_samplers_stay_together_in_the_gpu_stage_when_a_local_column_reads_one() -> None:
    r = recipe(
        sampler("tone"),
        sampler("topic"),
        llm("draft", "{{ topic }}"),
        judge("score", "{{ tone }} {{ draft }}"),
        constraints=[{"target_column": "topic", "rhs": "tone", "operator": "ne"}],
    )
    split = dd_split(r, LOCAL)
    gpu, cpu = gpu_cpu(split)
    assert (gpu.columns, cpu.columns) == (("tone", "topic", "draft"), ("score",))
    first, second = stage_recipe(r, split, 0), stage_recipe(r, split, 1, seed_path="/s/*.parquet")
    assert first["data_designer"]["constraints"] == r["data_designer"]["constraints"]  # with their samplers
    assert second["data_designer"]["constraints"] is None


def test_model_columns_of_every_kind_are_placed_by_their_alias() -> None:
    r = recipe(
        llm("facts", "{{ question }}", column_type="llm-structured", output_format={"type": "object"}),
        {"name": "vector", "column_type": "embedding", "model_alias": "gen", "target_column": "question"},
        llm("code", "{{ question }}", column_type="llm-code", code_lang="python"),
        judge("score", "{{ code }} {{ vector }}"),
    )
    gpu, cpu = gpu_cpu(dd_split(r, LOCAL))
    assert gpu.columns == ("facts", "vector", "code")  # structured, embedding and code columns on a local alias
    assert cpu.columns == ("score",)


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        # a local judge's struct values may come back from Parquet with other keys
        ((judge("rating", "{{ question }}", "gen"), judge("score", "{{ rating }}")), "a llm-judge column"),
        (
            (llm("facts", "{{ q }}", column_type="llm-structured", output_format={}), judge("s", "{{ facts }}")),
            "a llm-structured column",
        ),
        (
            (sampler("who", sampler_type="person", params={}), llm("d", "{{ who }}"), judge("s", "{{ d }} {{ who }}")),
            "a person sampler column",
        ),
        ((llm("draft", "{{ q }}", with_trace="all_messages"), judge("s", "{{ draft__trace }}")), "side-effect"),
        # a skip does not travel through the seed dataset, directly or propagated
        (
            (llm("draft", "{{ q }}", skip={"when": "{{ q == '' }}"}), judge("s", "{{ draft }}")),
            "may be skipped",
        ),
        (
            (
                llm("draft", "{{ q }}", skip={"when": "{{ q == '' }}"}),
                llm("more", "{{ draft }}"),
                judge("s", "{{ more }}"),
            ),
            "may be skipped",
        ),
    ],
)
def test_a_value_that_cannot_cross_the_boundary_faithfully_keeps_one_stage(
    columns: tuple[dict[str, Any], ...], why: str
) -> None:
    split = dd_split(recipe(*columns), LOCAL)
    assert not split.split
    assert "CPU-stage column" in split.reason and "reads GPU-stage column" in split.reason and why in split.reason


def test_values_that_round_trip_cross_the_boundary() -> None:
    r = recipe(
        llm("draft", "{{ q }}", extract_reasoning_content=True),
        llm("gated", "{{ q }}", skip={"when": "{{ q == '' }}"}),  # skippable, but only read inside its stage
        llm("after", "{{ gated }}", propagate_skip=False),  # does not inherit the skip
        judge("score", "{{ draft }} {{ draft__reasoning_content }} {{ after }}"),
    )
    gpu, cpu = gpu_cpu(dd_split(r, LOCAL))
    assert (gpu.columns, cpu.columns) == (("draft", "gated", "after"), ("score",))


def test_processors_that_transform_records_and_profilers_keep_one_stage() -> None:
    base = (llm("draft", "{{ question }}"), judge("score", "{{ draft }}"))
    transform = [{"processor_type": "schema_transform", "name": "chat", "template": {"text": "{{ draft }}"}}]
    split = dd_split(recipe(*base, processors=transform), LOCAL)
    assert not split.split and "processor(s) 'chat'" in split.reason
    profilers = [{"column_profiler_type": "judge_score", "model_alias": "judge"}]
    split = dd_split(recipe(*base, profilers=profilers), LOCAL)
    assert not split.split and "profilers" in split.reason


def test_a_stage_whose_every_column_is_dropped_keeps_one_stage() -> None:
    r = recipe(llm("draft", "{{ question }}", drop=True), judge("score", "{{ question }}"))
    split = dd_split(r, LOCAL)
    assert not split.split and "every column of the GPU stage would be dropped" in split.reason
    r = recipe(llm("draft", "{{ question }}"), judge("score", "{{ draft }}", drop=True))
    split = dd_split(r, LOCAL)
    assert not split.split and "every column of the CPU stage would be dropped" in split.reason


@pytest.mark.parametrize(
    "column",
    [
        {"name": "x", "column_type": "no-such-type"},
        llm("x", "{{ unclosed "),  # DD's Jinja check raises its own error, not pydantic's
        expr("x", "  "),
    ],
)
def test_a_recipe_data_designer_refuses_is_a_recipe_error(column: dict[str, Any]) -> None:
    with pytest.raises(RecipeError, match="not valid Data Designer column configs"):
        dd_split(recipe(column), LOCAL)


# --- stage_recipe ---


def test_stage_recipes_of_the_mixed_example() -> None:
    mixed = yaml.safe_load(MIXED.read_text())
    original = copy.deepcopy(mixed)
    split = dd_split(mixed, {"generator"})
    first = stage_recipe(mixed, split, 0)
    second = stage_recipe(mixed, split, 1, seed_path="/run/stage-0/parquet-files/*.parquet")
    assert mixed == original  # never changed in place
    assert names(first) == ["difficulty", "sql"] and names(second) == ["sql_quality", "sql_chars"]
    assert first["data_designer"]["seed_config"] == mixed["data_designer"]["seed_config"]
    assert second["data_designer"]["seed_config"] == {
        "source": {"seed_type": "local", "path": "/run/stage-0/parquet-files/*.parquet"},
        "sampling_strategy": "ordered",
        "selection_strategy": None,
    }
    for stage in (first, second):  # model configs as they are; the rest of the file too
        assert stage["data_designer"]["model_configs"] == mixed["data_designer"]["model_configs"]
        assert stage["library_version"] == mixed["library_version"]
    assert first["data_designer"]["processors"] is None
    assert second["data_designer"]["processors"] == [  # the seed file's row numbers (what a fill matches on)
        {"processor_type": "drop_columns", "name": "ddslurm-stage-dropped", "column_names": [STAGE_ROW]}
    ]
    # each column exactly as the recipe has it
    by_name = {c["name"]: c for c in mixed["data_designer"]["columns"]}
    assert all(c == by_name[c["name"]] for s in (first, second) for c in s["data_designer"]["columns"])


def test_stage_recipes_keep_and_then_drop_what_the_cpu_stage_reads() -> None:
    r = recipe(
        expr("context", "{{ tables }}", drop=True),
        llm("draft", "{{ context }}", drop=True),
        judge("score", "{{ draft }}"),
        expr("scratch", "{{ score.Quality.score }}", drop=True),
    )
    split = dd_split(r, LOCAL)
    first = stage_recipe(r, split, 0)
    second = stage_recipe(r, split, 1, seed_path="/s/out.parquet")
    assert [(c["name"], c.get("drop")) for c in first["data_designer"]["columns"]] == [
        ("context", True),  # only the GPU stage reads it
        ("draft", False),  # kept for the CPU stage
    ]
    assert [(c["name"], c.get("drop")) for c in second["data_designer"]["columns"]] == [
        ("score", None),
        ("scratch", True),  # Data Designer drops the CPU stage's own dropped columns
    ]
    assert second["data_designer"]["processors"] == [  # one processor: Data Designer adds none of its own
        {
            "processor_type": "drop_columns",
            "name": "ddslurm-stage-dropped",
            "column_names": ["scratch", "draft", STAGE_ROW],
        }
    ]


def test_drop_processors_move_to_the_cpu_stage_without_the_columns_the_gpu_stage_dropped() -> None:
    processors = [
        {"processor_type": "drop_columns", "name": "tidy", "column_names": ["tables", "context", "draft", "x*"]},
        {"processor_type": "drop_columns", "name": "ddslurm-stage-dropped", "column_names": ["context", "question"]},
        {"processor_type": "drop_columns", "name": "only-gone", "column_names": ["context"]},
    ]
    r = recipe(
        expr("context", "{{ tables }}", drop=True),
        llm("draft", "{{ context }}", drop=True),
        judge("score", "{{ draft }}"),
        processors=processors,
    )
    split = dd_split(r, LOCAL)
    assert stage_recipe(r, split, 0)["data_designer"]["processors"] is None  # the seed columns reach stage 2
    # one processor: Data Designer writes each drop_columns processor's columns over the last one's in the batch's
    # preserved file, and the row numbers a fill reads must survive
    assert stage_recipe(r, split, 1, seed_path="/s/a.parquet")["data_designer"]["processors"] == [
        {
            "processor_type": "drop_columns",
            "name": "ddslurm-stage-dropped",
            "column_names": ["tables", "draft", "x*", "question", STAGE_ROW],
        },
    ]


def test_stage_recipes_keep_the_shorthand_form() -> None:
    r = recipe(llm("draft", "{{ question }}"), judge("score", "{{ draft }}"))["data_designer"]
    split = dd_split(r, LOCAL)
    second = stage_recipe(r, split, 1, seed_path="/s/*.parquet")
    assert "data_designer" not in second
    assert [c["name"] for c in second["columns"]] == ["score"]
    assert second["seed_config"]["source"]["path"] == "/s/*.parquet"


def test_a_single_stage_split_runs_the_recipe_unchanged() -> None:
    r = recipe(llm("draft", "{{ question }}", "judge"))
    split = dd_split(r, LOCAL)
    out = stage_recipe(r, split, 0)
    assert out == r and out is not r and out["data_designer"] is not r["data_designer"]
    with pytest.raises(IndexError, match="the split has 1 stage"):
        stage_recipe(r, split, 1, seed_path="/s/a.parquet")


def test_the_cpu_stage_needs_the_gpu_stage_output() -> None:
    r = recipe(llm("draft", "{{ question }}"), judge("score", "{{ draft }}"))
    with pytest.raises(ValueError, match="seed_path is required"):
        stage_recipe(r, dd_split(r, LOCAL), 1)


def test_data_designer_loads_both_stage_recipes(tmp_path: Path) -> None:
    from data_designer.config import DataDesignerConfigBuilder

    seed = tmp_path / "seed.parquet"
    pq.write_table(pa.table({"question": ["q"], "draft": ["d"], STAGE_ROW: [0]}), seed)
    r = recipe(sampler("topic"), llm("draft", "{{ topic }} {{ question }}", drop=True), judge("score", "{{ draft }}"))
    r["data_designer"]["seed_config"]["source"]["path"] = str(seed)
    split = dd_split(r, LOCAL)
    for index in (0, 1):
        config = DataDesignerConfigBuilder.from_config(stage_recipe(r, split, index, seed_path=str(seed))).build()
        assert [c.name for c in config.columns] == list(split.stages[index].columns)
    assert config.processors is not None and config.processors[0].column_names == ["draft", STAGE_ROW]


# --- final_columns ---


def test_final_columns_put_seed_columns_samplers_then_columns_by_the_model_calls_before_them() -> None:
    r = recipe(
        judge("score", "{{ draft }}"),  # listed before the column it reads; two model calls deep
        llm("draft", "{{ topic }}", with_trace="last_message", drop=True),  # dropped; its side effect stays
        sampler("topic"),
        expr("length", "{{ draft | length }}"),  # one call deep: Data Designer writes it before the judge
        expr("scratch", "{{ length }}"),
        processors=[{"processor_type": "drop_columns", "name": "p", "column_names": ["tables", "scr*"]}],
    )
    assert dd_final_columns(r, ["question", "tables"]) == ("question", "topic", "draft__trace", "length", "score")
    assert dd_final_columns(r["data_designer"], ()) == ("topic", "draft__trace", "length", "score")


def test_final_columns_of_the_mixed_example() -> None:
    mixed = yaml.safe_load(MIXED.read_text())
    expected = ("question", "tables", "difficulty", "sql", "sql_chars", "sql_quality")
    assert dd_final_columns(mixed, ["question", "tables"]) == expected


def test_final_columns_break_ties_in_data_designers_compile_order() -> None:
    """Columns written at the same modelled time come in Data Designer's compile order: samplers first, then its
    topological sort, breadth first (a column's dependents after every column that was ready before them)."""
    r = recipe(
        llm("a", "{{ question }}"),
        expr("a_len", "{{ a | length }}"),  # one call deep, as b: after b, which was ready first
        llm("b", "{{ question }}", alias="judge"),
        expr("echo", "{{ question }}"),  # no call: before both
        sampler("topic"),
    )
    assert dd_final_columns(r, ["question"]) == ("question", "topic", "echo", "a", "b", "a_len")


def test_final_columns_reasoning_content_follows_its_column() -> None:
    r = recipe(llm("draft", "{{ question }}", extract_reasoning_content=True), judge("score", "{{ draft }}"))
    assert dd_final_columns(r, ["question"]) == ("question", "draft", "draft__reasoning_content", "score")


def test_final_columns_are_unknown_where_a_plugins_processor_may_change_the_columns() -> None:
    kept = recipe(
        llm("draft", "{{ question }}"),
        processors=[{"processor_type": "schema_transform", "name": "t", "template": {"d": "{{ draft }}"}}],
    )
    assert dd_final_columns(kept, ["question"]) == ("question", "draft")  # its output is written beside them
    plugin = recipe(llm("draft", "{{ question }}"))
    plugin["data_designer"]["processors"] = [{"processor_type": "regex-filter", "name": "f"}]
    assert final_columns(plugin, recipe_columns(recipe(llm("draft", "{{ question }}"))), ["question"]) is None
