"""Refusals about the recipe's content point at the field: a column's Jinja template (a syntax error, a variable
nothing provides) and a seed setting at the recipe file's line and column; a builder script's by script and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import RunLayout
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.submission._recipe_at import place_refusal
from ddslurm.launcher.submission._seed import capture_seed
from ddslurm.providers import load_recipe

RECIPE = """\
data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - name: q
    model_alias: writer
    column_type: llm-text
    system_prompt: "You write {{ topic }} questions."
    prompt: "Say {{ no_such_column }} about {{ topic }}"
  - {name: e, column_type: expression, expr: "{{ topic -x"}
"""
MISSING = "column 'q': The prompt template for 'q' references a column that does not exist: 'no_such_column'. Available"
SYNTAX = (
    "the recipe is not a valid Data Designer config: Encountered a syntax error in the provided Jinja2 template:\n"
    "unexpected end of template, expected 'end of print statement'."
)


def _at(text: str, needle: str, key: str) -> str:
    """``LINE:COL`` of ``key`` on the line of ``text`` that holds ``needle`` (counted here, from the text)."""
    number, line = next((i, line) for i, line in enumerate(text.splitlines(), 1) if needle in line)
    return f"{number}:{line.index(key) + 1}"


def test_a_missing_variable_points_at_the_template_that_uses_it(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)

    placed = place_refusal(MISSING, path, load_recipe(path))

    # the prompt, not the system prompt that is also a template of column q
    assert placed == f"{path}:{_at(RECIPE, 'no_such_column', 'prompt')}: data_designer.columns[1].prompt: {MISSING}"


def test_a_template_syntax_error_points_at_the_broken_template(tmp_path: Path) -> None:
    path = tmp_path / "recipe.json"  # JSON is YAML: placed alike
    path.write_text(RECIPE)

    placed = place_refusal(SYNTAX, path, load_recipe(path))

    assert placed == f"{path}:{_at(RECIPE, '{{ topic -x', 'expr:')}: data_designer.columns[2].expr: {SYNTAX}"


def test_a_builder_script_s_refusal_names_the_script_and_the_column(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    recipe = load_recipe(path)  # what a builder returned, as data
    script = tmp_path / "build.py"

    assert place_refusal(MISSING, script, recipe) == f"{script}: {MISSING}"
    assert place_refusal(SYNTAX, script, recipe) == f"{script}: column 'e' (expr): {SYNTAX}"
    made = {"q": f"{script}:12", "e": f"{tmp_path / 'helpers.py'}:3"}  # where the build saw each made
    assert place_refusal(MISSING, script, recipe, columns_at=made) == f"{script}:12: {MISSING}"
    assert (
        place_refusal(SYNTAX, script, recipe, columns_at=made)
        == f"{tmp_path / 'helpers.py'}:3: column 'e' (expr): {SYNTAX}"
    )


def test_a_variable_no_column_provides_gets_a_did_you_mean_among_the_columns_and_the_seed_s(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    recipe = load_recipe(path)
    one = "column 'q': The prompt template for 'q' references a column that does not exist: 'topc'."
    two = "column 'q': The prompt template for 'q' references 2 columns that do not exist: 'topc', 'custmer'."
    expression = "column 'e': Expression column 'e' references missing column 'tpic'."

    assert place_refusal(one, tmp_path / "build.py", recipe).endswith(": 'topc'; did you mean 'topic'?")
    assert place_refusal(two, tmp_path / "build.py", recipe, names=("customer",)).endswith(
        ": 'topc', 'custmer'; did you mean 'topic' for 'topc', 'customer' for 'custmer'?"
    )  # the seed dataset's columns are names a template can use
    assert place_refusal(expression, path, recipe).endswith(" column 'tpic'; did you mean 'topic'?")
    far = one.replace("topc", "zzz")
    assert place_refusal(far, tmp_path / "build.py", recipe) == f"{tmp_path / 'build.py'}: {far}"  # nothing close


def test_a_refusal_about_no_template_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.replace('"{{ topic -x"', '"{{ topic }}-x"'))
    other = "the recipe is not a valid Data Designer config: Encountered a syntax error in the provided Jinja2 template"

    assert place_refusal(other, path, load_recipe(path)) == other  # no template of it is broken
    assert place_refusal("column types unknown: x", path, load_recipe(path)) == "column types unknown: x"


SEEDED = """\
data_designer:
  seed_config:
    source:
      seed_type: local
      path: {path}
    sampling_strategy: {sampling}
  columns:
  - {{name: e, column_type: expression, expr: "{{{{ a }}}}"}}
"""


@pytest.mark.parametrize(
    ("path", "sampling", "needle", "key", "field", "words"),
    [
        pytest.param("seeds/*.csv", "ordered", "path:", "path", "seed_config.source.path", "no file matches"),
        pytest.param("rows.csv", "sideways", "sampling_strategy", "sampling_strategy", "seed_config.sampling_strategy",
                     "'sideways' is not ordered or shuffle", id="bad-sampling"),
        pytest.param("rows.csv", "ordered", "source:", "source", "seed_config.source",
                     "Data Designer cannot read the seed dataset", id="unreadable"),
    ],
)  # fmt: skip
def test_seed_errors_point_at_the_seed_setting(
    tmp_path: Path, path: str, sampling: str, needle: str, key: str, field: str, words: str
) -> None:
    (tmp_path / "seeds").mkdir()
    (tmp_path / "rows.csv").write_text("a\n1\n")
    text = SEEDED.format(path=path, sampling=sampling)
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(text)

    def unreadable(_: object) -> int:
        raise ValueError("not a CSV file")

    with pytest.raises(SubmitError) as info:
        capture_seed(load_recipe(recipe_path), recipe_path, RunLayout(tmp_path / "run"), count_rows=unreadable)

    assert str(info.value).startswith(f"{recipe_path}:{_at(text, needle, key)}: {field}: ")
    assert words in str(info.value)
