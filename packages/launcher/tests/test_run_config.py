"""The run file's ``run_config`` at submit: judged by the Data Designer of ``python_env`` (``ddslurm-runtime
inspect``'s check, the same request as the recipe's), refused at the run file's ``run_config.<field>`` in Data
Designer's own words, and carried in the plan when taken."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import pytest

from ddslurm.launcher import SubmitError, prepare
from ddslurm.launcher.testing import InProcessHost, write_unit_run

pytestmark = pytest.mark.dd

KEY = "sk-run-config-test-0123456789"


def _prepare(tmp_path: Path, run_config: str, host: InProcessHost) -> tuple[Path, object]:
    run, profile, env = write_unit_run(tmp_path, KEY, num_records=4, shards=2, run_extra="run_config:\n" + run_config)
    return run, prepare(run, profile, env, datetime.now(UTC), host=host)


def test_a_run_config_data_designer_takes_is_carried_in_the_plan_in_the_recipes_check(tmp_path: Path) -> None:
    host = InProcessHost()
    fields = "  shutdown_error_rate: 0.9\n  jinja_rendering_engine: native\n"
    fields += "  request_admission: {cooldown_seconds: 1.5}\n"
    _, prepared = _prepare(tmp_path, fields, host)
    assert prepared.plan.run_config == {  # type: ignore[attr-defined]
        "shutdown_error_rate": 0.9,
        "jinja_rendering_engine": "native",
        "request_admission": {"cooldown_seconds": 1.5},
    }
    assert host.asked["check"] == 1  # judged in the recipe's check: no other question, no other process


def test_what_data_designer_refuses_in_run_config_is_placed_at_the_field_in_its_own_words(tmp_path: Path) -> None:
    fields = (
        "  shutdwn_error_rate: 0.9\n"
        "  max_in_flight_tasks: 0\n"
        "  jinja_rendering_engine: jinja\n"
        "  request_admission:\n"
        "    cooldown_seconds: -1\n"
        "  disable_early_shutdown: true\n"
    )
    with pytest.raises(SubmitError) as info:
        _prepare(tmp_path, fields, InProcessHost())
    run = tmp_path / "run.yaml"
    dd = version("data-designer")
    assert sorted(str(info.value).splitlines()) == sorted(
        [
            f"{run}:6:3: run_config.shutdwn_error_rate: Extra inputs are not permitted (Data Designer {dd}'s "
            "RunConfig has no such field; did you mean 'shutdown_error_rate'?)",
            f"{run}:7:3: run_config.max_in_flight_tasks: Input should be greater than or equal to 1 (got 0)",
            f"{run}:8:3: run_config.jinja_rendering_engine: Input should be 'native' or 'secure' (got 'jinja')",
            f"{run}:10:5: run_config.request_admission.cooldown_seconds: Input should be greater than 0 (got -1)",
        ]
    )
    assert not (tmp_path / "work").exists()  # refused before anything is written


def test_a_misspelt_nested_field_names_the_nested_settings_fields(tmp_path: Path) -> None:
    with pytest.raises(SubmitError) as info:
        _prepare(tmp_path, "  request_admission:\n    cooldown_second: 2\n", InProcessHost())
    assert str(info.value) == (
        f"{tmp_path / 'run.yaml'}:7:5: run_config.request_admission.cooldown_second: Extra inputs are not permitted "
        f"(Data Designer {version('data-designer')}'s RunConfig has no such field; did you mean 'cooldown_seconds'?)"
    )
