"""Whether the run fits its time limit (``ddslurm.planner._fit``, issue 40): the predicted allocation against
``submission.time_limit``, and a shard's first saved batch against it; each overrun names the field and the value
that fits, every number recomputed here from the plan's prediction."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    Facts,
    FactUse,
    LayoutChoice,
    ModelFact,
    ModelShape,
    Plan,
    Prediction,
    ProviderSnapshot,
    Resources,
    RunFile,
    RunLayout,
    ServerSpec,
    Submission,
)
from ddslurm.config.testing import make_plan
from ddslurm.planner import PlanInputs, compile_plan, overruns, plan_batches, plan_warnings

MARGIN = 0.8
"""The share of the limit a fitting value keeps the prediction within (the layout search's)."""


def _prediction(allocation_s: float, record_s: float, *, load_s: float = 180.0, overhead_s: float = 15.0,
                origin: str = "run") -> Prediction:  # fmt: skip
    facts = (
        FactUse(name="load_s", subject="gen:m", value=load_s, origin=origin, run_id="r0"),  # type: ignore[arg-type]
        FactUse(name="load_s", subject="judge:j", value=load_s / 2, origin=origin, run_id="r0"),  # type: ignore[arg-type]
        FactUse(name="allocation_overhead_s", subject="recipe", value=overhead_s, origin="default"),
    )
    chosen = LayoutChoice(
        allocations=1, replicas=(1,), client_workers=1, two_stage=False, gpus_at_once=1, wall_s=allocation_s,
        gpu_hours=allocation_s / 3600, gpu_busy=0.5, allocation_s=allocation_s, shard_record_s=record_s,
    )  # fmt: skip
    return Prediction(chosen=chosen, facts=facts)


def _plan(prediction: Prediction | None, shard_rows: tuple[int, ...], minutes: int, buffer_size: int | None) -> Plan:
    record_s = prediction.chosen.shard_record_s if prediction is not None else None
    size, batching = plan_batches(buffer_size, shard_rows, record_s)
    return make_plan(
        shard_rows=shard_rows, buffer_size=size, batching=batching, prediction=prediction,
        generation=Resources(time_minutes=minutes),
    )  # fmt: skip


def test_an_allocation_predicted_past_the_time_limit_is_an_overrun_naming_the_limit_that_fits() -> None:
    plan = _plan(_prediction(900.0, 0.5), (20,), minutes=10, buffer_size=None)
    [over] = overruns(plan)
    assert (over.field, over.predicted_s, over.limit_s) == ("submission.time_limit", 900.0, 600)
    minutes = math.ceil(900.0 / MARGIN / 60)  # 18.75 -> 19 minutes
    assert over.fits == f"submission.time_limit: '00:{minutes:02d}:00'" == "submission.time_limit: '00:19:00'"
    assert over.message.startswith(
        f"submission.time_limit (10 min) is shorter than the predicted allocation, {900 / 60:.1f} min (the chosen "
        f"layout's longest: {(180 + 15) / 60:.1f} min "
    )
    assert f"set {over.fits} ({minutes} min, the prediction with a 20% margin) or more" in over.message
    assert over.message.endswith("or submit with --accept-overrun to run it as it is")
    assert "defaults" not in over.message  # the load was measured
    assert plan_warnings(plan) == (over.message,)


def test_a_day_long_limit_is_written_with_its_days() -> None:
    allocation_s = 30 * 3600.0
    [over] = overruns(_plan(_prediction(allocation_s, 0.5), (20,), minutes=60, buffer_size=None))
    minutes = math.ceil(allocation_s / MARGIN / 60)  # 2250: 1 day, 13 h 30 min
    assert over.fits == f"submission.time_limit: '{minutes // 1440}-{minutes % 1440 // 60:02d}:{minutes % 60:02d}:00'"
    assert over.fits == "submission.time_limit: '1-13:30:00'"


def test_a_prediction_of_defaults_only_says_nothing_was_measured() -> None:
    [over] = overruns(_plan(_prediction(900.0, 0.5, origin="default"), (20,), minutes=10, buffer_size=None))
    assert "the cost model's defaults: nothing measured yet; ddslurm tune measures the model" in over.message


@pytest.mark.parametrize("allocation_s", [0.0, 300.0, 600.0])
def test_an_allocation_within_the_limit_or_no_prediction_is_no_overrun(allocation_s: float) -> None:
    assert overruns(_plan(_prediction(allocation_s, 0.5), (20,), minutes=10, buffer_size=None)) == ()
    assert overruns(_plan(None, (20,), minutes=2, buffer_size=1000)) == ()


def test_data_designers_default_batch_on_small_shards_is_never_saved_so_retry_cannot_resume() -> None:
    """The issue's case: buffer_size 1000 and shards of 17-25 records, each one batch, saved only when the shard
    ends, which its time limit never lets it."""
    rows = (25, 25, 17, 17, 17)
    record_s = 30.0
    start = 180.0 + 15.0  # the slowest model's load and the allocation's overhead, from the facts
    allocation_s = start + sum(rows) * record_s
    plan = _plan(_prediction(allocation_s, record_s), rows, minutes=10, buffer_size=1000)
    assert plan.buffer_size == sum(rows)  # capped at the run's records: still more than any shard
    limit, batch = overruns(plan)
    assert limit.field == "submission.time_limit"
    saved_s = start + 25 * record_s  # the largest shard is its own first batch
    assert (batch.field, batch.predicted_s, batch.limit_s) == ("buffer_size", saved_s, 600)
    most = math.floor((600 * MARGIN - start) / record_s)  # (480 - 195) / 30 -> 9 records a batch
    assert batch.fits == f"buffer_size: {most}" == "buffer_size: 9"
    assert batch.message.startswith(
        f"buffer_size ({sum(rows)} records a batch): a shard's first batch (the whole shard, 25 records, "
        f"{25 * record_s / 60:.1f} min of generation) is predicted to be saved {saved_s / 60:.1f} min into its "
        f"allocation ({start / 60:.1f} min to load the models and start first), after submission.time_limit (10 min)"
    )
    assert "neither its automatic retries nor ddslurm retry can resume it" in batch.message
    shards = math.ceil(sum(rows) / most)  # 101 / 9 -> 12
    assert f"set buffer_size: {most} or less" in batch.message
    assert f"or shards: {shards} or more (about {most} records a shard, one batch each)" in batch.message
    # the advice that each shard is one batch is not said twice
    assert plan_warnings(plan) == (limit.message, batch.message)


def test_a_batch_saved_before_the_limit_is_no_overrun_though_the_allocation_is() -> None:
    rows = (25,) * 4
    plan = _plan(_prediction(195.0 + 100 * 30.0, 30.0), rows, minutes=10, buffer_size=5)
    [limit] = overruns(plan)  # 195 + 5 x 30 = 345 s to the first save: the retries resume from the saved batches
    assert limit.field == "submission.time_limit"


def test_a_planner_chosen_batch_past_a_short_limit_is_named_as_the_planners() -> None:
    plan = _plan(_prediction(195.0 + 60 * 10.0, 10.0), (60,), minutes=5, buffer_size=None)
    assert plan.buffer_size == 12  # five batches of the shard of 60
    batch = next(o for o in overruns(plan) if o.field == "buffer_size")
    assert batch.predicted_s == 195.0 + 12 * 10.0
    assert batch.message.startswith("buffer_size (12 records a batch, chosen by the planner): a shard's first batch "
                                    "(12 records, 2.0 min of generation)")  # fmt: skip
    most = math.floor((300 * MARGIN - 195.0) / 10.0)  # 4
    assert batch.fits == f"buffer_size: {most}" and "or shards:" not in batch.message  # 12 < 60: not the shard


def test_when_the_load_alone_outlasts_the_limit_only_a_longer_limit_saves_a_batch() -> None:
    plan = _plan(_prediction(400.0 + 20 * 5.0, 5.0, load_s=400.0, overhead_s=15.0), (20,), minutes=5, buffer_size=4)
    batch = next(o for o in overruns(plan) if o.field == "buffer_size")
    minutes = math.ceil((415.0 + 5.0) / MARGIN / 60)  # 8.75 -> 9
    assert batch.fits == f"submission.time_limit: '00:{minutes:02d}:00'"
    assert f"no batch is saved before the limit whatever its size: set {batch.fits} or more" in batch.message


# --- through compile_plan: the prediction the layout search made ---

PROFILE = ClusterProfile(workspace="/ws", python_env="/venv", gpus_per_node=8, partition="gpu")


def _compiled(time_limit: str, buffer_size: int | None) -> Plan:
    dep = Deployment(model_alias="gen", model="m", server=ServerSpec(cpus=1, extra_args=("--max-num-seqs", "8")))
    run = RunFile(
        name="r", recipe="x.yaml", num_records=100, shards=5, deployments=(dep,), buffer_size=buffer_size,
        submission=Submission(cpus=4, time_limit=time_limit),
    )  # fmt: skip
    slow = ModelFact(
        shape=ModelShape(model="m"), load_s=60.0, requests_per_s=0.025, capacity=8, measured_by="run", run_id="r0",
        measured_at="2026-01-01T00:00:00Z",
    )  # fmt: skip
    return compile_plan(
        PlanInputs(
            run=run, profile=PROFILE, snapshot=ProviderSnapshot(), layout=RunLayout(Path("/ws/r")),
            recipe_sha256="-", snapshot_sha256="-", facts=Facts(models=(slow,)),
        )
    )  # fmt: skip


def test_a_compiled_plans_overruns_are_its_own_predictions() -> None:
    plan = _compiled("00:10:00", 1000)
    assert plan.prediction is not None
    chosen = plan.prediction.chosen
    found = {o.field: o for o in overruns(plan)}
    assert found["submission.time_limit"].predicted_s == chosen.allocation_s > 600
    start = 60.0 + 15.0  # the measured load and the default overhead
    assert chosen.shard_record_s > 0 and plan.buffer_size == 100  # 1000, capped at the run's records
    assert found["buffer_size"].predicted_s == pytest.approx(start + 20 * chosen.shard_record_s)
    assert found["buffer_size"].predicted_s > 600
    assert overruns(_compiled("04:00:00", None)) == ()
