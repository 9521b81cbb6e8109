"""The run file's ``run_config``: loaded as written, the fields ddslurm sets itself refused at their place with why,
carried in the plan (old plans, without it, still load)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ddslurm.config import RUN_CONFIG_SET_BY_DDSLURM, ConfigFileError, Plan, encode, load_run_file, read_plan
from ddslurm.config.testing import make_plan

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

MINIMAL = "name: demo\nrecipe: recipe.yaml\nnum_records: 10\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_run_config_is_loaded_as_written(tmp_path: Path) -> None:
    text = MINIMAL + (
        "run_config:\n"
        "  shutdown_error_rate: 0.9\n"
        "  max_in_flight_tasks: 64\n"
        "  jinja_rendering_engine: native\n"
        "  disable_early_shutdown: true\n"
        "  otel_extra: null\n"
        "  request_admission: {cooldown_seconds: 1.5, additive_increase_step: 2}\n"
    )
    run = load_run_file(_write(tmp_path, text))
    assert run.run_config == {
        "shutdown_error_rate": 0.9,
        "max_in_flight_tasks": 64,
        "jinja_rendering_engine": "native",
        "disable_early_shutdown": True,
        "otel_extra": None,  # not judged here: the Data Designer of python_env judges the fields at submit
        "request_admission": {"cooldown_seconds": 1.5, "additive_increase_step": 2},
    }
    assert load_run_file(_write(tmp_path, MINIMAL)).run_config == {}


def test_the_fields_ddslurm_sets_itself_are_refused_at_their_line_with_why(tmp_path: Path) -> None:
    text = MINIMAL + (
        "run_config:\n"
        "  max_in_flight_tasks: 64\n"
        "  buffer_size: 100\n"
        "  display_tui: true\n"
        "  otel_metrics_port: 9464\n"
        "  preserve_dropped_columns: false\n"
        "  async_trace: true\n"
        "  progress_bar: true\n"
        "  started: 2024-01-01\n"
    )
    path = _write(tmp_path, text)
    with pytest.raises(ConfigFileError) as info:
        load_run_file(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 7, lines  # every refusal at once; max_in_flight_tasks is not one
    assert lines[0] == (
        f"{path}:6:3: run_config.buffer_size: cannot be set in run_config: the run file's own buffer_size sets it "
        "(records per batch, the unit a shard saves its work in; unset, the planner chooses it): set buffer_size at "
        "the top level of the run file instead"
    )
    for line_no, (line, name) in enumerate(zip(lines[1:6], ["display_tui", "otel_metrics_port",
                                                            "preserve_dropped_columns", "async_trace",
                                                            "progress_bar"], strict=True), start=7):  # fmt: skip
        assert line.startswith(f"{path}:{line_no}:3: run_config.{name}: cannot be set in run_config: "), line
        assert line.endswith(RUN_CONFIG_SET_BY_DDSLURM[name]), line
    assert lines[6] == (
        f"{path}:12:3: run_config.started: date is not a value Data Designer's RunConfig reads: write a number, a "
        "string, true/false, null, or a list or mapping of them"
    )


def test_a_run_config_that_is_not_a_mapping_is_refused_at_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL + "run_config: [shutdown_error_rate]\n")
    with pytest.raises(ConfigFileError, match=rf"{path}:4:\d+: run_config: "):
        load_run_file(path)


def test_the_plan_carries_run_config_and_a_plan_made_before_it_loads(tmp_path: Path) -> None:
    plan = make_plan(run_config={"shutdown_error_rate": 0.9, "request_admission": {"cooldown_seconds": 1.5}})
    (tmp_path / "run.json").write_bytes(encode(plan))
    assert read_plan(tmp_path / "run.json").run_config == plan.run_config

    older = msgspec.json.decode(encode(make_plan()))
    del older["run_config"]  # as ddslurm wrote plans before run_config
    (tmp_path / "old.json").write_bytes(msgspec.json.encode(older))
    assert read_plan(tmp_path / "old.json").run_config == {}
    assert isinstance(read_plan(tmp_path / "old.json"), Plan)
