"""The plan records the Data Designer of ``python_env`` at submit (``Plan.data_designer_version``); a node whose
``python_env`` holds another refuses the run before Data Designer runs, with ``recipe_invalid`` (never retried
automatically), naming both versions and what to do."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import (
    AttemptRecord,
    CheckAnswer,
    CheckRequest,
    Plan,
    VersionsAnswer,
    VersionsRequest,
    encode,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.runtime import EXIT_FAILED, EXIT_OK, EngineRequest, EngineResult, answer_inspect, load_inputs
from ddslurm.runtime._dd_version import check_data_designer
from ddslurm.runtime.errors import RecipeError
from ddslurm.runtime.testing import attempt_runner, write_run

pytestmark = pytest.mark.dd  # the Data Designer installed here (make test-dd-range: each supported version)

INSTALLED = version("data-designer")
OTHER = "0.8.1" if INSTALLED != "0.8.1" else "0.9.7"


class _Engine:
    """Writes a dataset of the records asked for, as Data Designer lays it out; keeps every request."""

    def __init__(self) -> None:
        self.requests: list[EngineRequest] = []

    def __call__(self, request: EngineRequest) -> EngineResult:
        self.requests.append(request)
        dataset = request.artifact_path / request.dataset_name
        (dataset / "parquet-files").mkdir(parents=True)
        pq.write_table(pa.table({"x": list(range(request.num_records))}), dataset / "parquet-files" / "b.parquet")
        (dataset / "metadata.json").write_text(json.dumps({"actual_num_records": request.num_records}))
        return EngineResult(dataset_dir=dataset, rows=request.num_records, requested=request.num_records)


def test_a_plan_made_before_the_field_loads_and_is_not_checked() -> None:
    plan = make_plan()
    old = msgspec.json.decode(encode(plan))
    del old["data_designer_version"]
    loaded = msgspec.json.decode(msgspec.json.encode(old), type=Plan)
    assert loaded.data_designer_version == ""
    check_data_designer(loaded.data_designer_version)  # nothing recorded: nothing to refuse
    check_data_designer(INSTALLED)


def test_another_version_is_refused_naming_both_and_what_to_do() -> None:
    with pytest.raises(RecipeError) as refused:
        check_data_designer(OTHER)
    message = refused.value.message
    assert f"planned with data-designer {OTHER}" in message and f"has data-designer {INSTALLED}" in message
    assert f"install data-designer=={OTHER} there and `ddslurm retry RUN`" in message
    assert f"submit the run again (its plan then records {INSTALLED})" in message
    assert refused.value.reason == "recipe_invalid" and not refused.value.retryable


def test_the_check_answer_says_which_data_designer_the_plan_records(tmp_path: Path) -> None:
    recipe = {"columns": [{"name": "x", "column_type": "sampler", "sampler_type": "uuid", "params": {}}]}
    answer = answer_inspect(CheckRequest(recipe=recipe, providers=(), scratch=str(tmp_path)))
    assert isinstance(answer, CheckAnswer) and answer.problems == (), answer
    assert answer.data_designer == INSTALLED
    versions = answer_inspect(VersionsRequest())
    assert isinstance(versions, VersionsAnswer) and versions.versions["data-designer"] == INSTALLED


@pytest.mark.parametrize(
    ("recorded", "state"), [(OTHER, "failed"), (INSTALLED, "succeeded")], ids=["another", "the-same"]
)
def test_an_attempt_under_another_data_designer_fails_before_it_runs(tmp_path: Path, recorded: str, state: str) -> None:
    layout = write_run(tmp_path / "run-1", (4,), data_designer_version=recorded)
    engine = _Engine()
    runner = attempt_runner(layout, engine, env={"T_KEY": "k" * 16}, scratch_home=tmp_path / "home")
    code = runner.run(load_inputs(layout), 0, "7", "n1")
    record = read_json(layout.shard(0).attempt("attempt-7").record, AttemptRecord)
    assert (code, record.state) == ((EXIT_OK, "succeeded") if state == "succeeded" else (EXIT_FAILED, "failed"))
    if state == "succeeded":
        assert len(engine.requests) == 1
        return
    assert engine.requests == []  # refused before Data Designer ran
    assert (record.reason, record.retryable) == ("recipe_invalid", False)
    message = record.message or ""
    assert f"data-designer {OTHER}" in message and f"data-designer {INSTALLED}" in message, message
