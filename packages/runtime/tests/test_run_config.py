"""The run file's ``run_config`` in the node's Data Designer: its ``RunConfig`` judges the fields (the submit's check
and the node use the same code), ddslurm's own settings win over the plan's, and a run_config the Data Designer
here refuses (``python_env`` changed since the submit) fails the attempt ``recipe_invalid``, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddslurm.config import CheckAnswer, CheckRequest, RunConfigProblem
from ddslurm.runtime import answer_inspect
from ddslurm.runtime._run_config import applied_run_config, engine_run_config, run_config_problems
from ddslurm.runtime.errors import RecipeError

pytestmark = pytest.mark.dd

RECIPE = {"data_designer": {"columns": [
    {"name": "topic", "column_type": "sampler", "sampler_type": "category",
     "params": {"sampler_type": "category", "values": ["a", "b"]}},
]}}  # fmt: skip


def test_the_fields_are_set_under_ddslurms_own_settings() -> None:
    config = engine_run_config(
        {"max_in_flight_tasks": 7, "jinja_rendering_engine": "native", "buffer_size": 999},  # a hand-made plan's
        buffer_size=3,
        otel_metrics_port=None,
        preserve_dropped_columns=False,
    )
    assert (config.max_in_flight_tasks, config.buffer_size, config.otel_metrics_port) == (7, 3, None)
    assert applied_run_config(config, {"max_in_flight_tasks": 7, "jinja_rendering_engine": "native"}) == {
        "max_in_flight_tasks": 7,
        "jinja_rendering_engine": "native",
    }


def test_a_run_config_the_data_designer_here_refuses_is_recipe_invalid_naming_the_field() -> None:
    with pytest.raises(RecipeError) as info:
        engine_run_config({"shutdown_error_rate": 2}, buffer_size=3, otel_metrics_port=None)
    assert info.value.reason == "recipe_invalid" and not info.value.retryable
    assert info.value.message == (
        "the Data Designer here refuses the run file's run_config: shutdown_error_rate: Input should be less than or "
        "equal to 1 (got 2)"
    )


def test_the_inspect_check_answers_what_runconfig_refuses_beside_the_recipes_check(tmp_path: Path) -> None:
    answer = answer_inspect(
        CheckRequest(recipe=RECIPE, providers=(), scratch=str(tmp_path),
                     run_config={"max_in_flight_tasks": 0, "disable_early_shutdown": True})
    )  # fmt: skip
    assert isinstance(answer, CheckAnswer), answer
    assert answer.run_config == (
        RunConfigProblem(field="max_in_flight_tasks", message="Input should be greater than or equal to 1 (got 0)"),
    )
    assert answer.columns is not None and answer.problems == ()  # the recipe was still checked
    assert run_config_problems({"disable_early_shutdown": True}) == []
    both = run_config_problems({"throttle": {}, "request_admission": {}})  # a check of two fields together
    assert [p.field for p in both] == [""] and "not both" in both[0].message
