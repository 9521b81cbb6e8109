"""Whether the run fits its time limit, as the plan's prediction says: the one judgement the dry run's bill warns
with and ``submit`` refuses by (unless the user confirms it, ``--accept-overrun``).

Two ways a run does not fit (:func:`overruns`), each naming the run file's field and the value that fits:

- ``submission.time_limit``: the chosen layout's longest allocation (``LayoutChoice.allocation_s``: its model load
  and start, then its shards) is predicted to outlast the limit; Slurm ends it with shards unfinished.
- ``buffer_size``: a shard's first batch is predicted to be saved only after the limit (the allocation's start
  plus one batch of the shard's records): every attempt of the shard ends before it saves anything, so neither the
  automatic retries nor ``ddslurm retry`` can resume it (Data Designer's default of 1000 records makes a shard of
  17-25 records one batch, saved only when the shard ends).

A plan without a prediction (hosted-only runs, layouts the run file fixes without ``gpus``) overruns nothing: there
is nothing to judge by. Pure: no files, no clock.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from ddslurm.config import Plan, Prediction
from ddslurm.planner._batches import batch_warnings, wall_text
from ddslurm.planner._choose import TIME_LIMIT_SHARE

ACCEPT = "submit with --accept-overrun to run it as it is"
"""How the user confirms a run that overruns (the Python API's ``accept_overrun=True``)."""


class Overrun(msgspec.Struct, frozen=True, kw_only=True):
    """One way the run is predicted not to fit its time limit."""

    field: Literal["submission.time_limit", "buffer_size"]
    """The run file's field the overrun is about."""
    predicted_s: float
    """``submission.time_limit``: the longest allocation's predicted seconds; ``buffer_size``: the predicted seconds
    from an allocation's start to a shard's first saved batch."""
    limit_s: int
    """``submission.time_limit`` in seconds."""
    fits: str
    """What to change, as the run file would say it: ``submission.time_limit: '00:47:00'``, ``buffer_size: 12``."""
    message: str
    """The warning, starting with the field's name: what is predicted, what it costs and what to change."""


def allocation_start_s(prediction: Prediction) -> float:
    """Seconds from an allocation's start to its first shard generating, as the cost model predicts: the slowest
    deployment's model load and the allocation's overhead (the facts it used, ``load_s`` and
    ``allocation_overhead_s``)."""
    load = max((f.value for f in prediction.facts if f.name == "load_s"), default=0.0)
    overhead = sum(f.value for f in prediction.facts if f.name == "allocation_overhead_s")
    return load + overhead


def slurm_minutes(minutes: int) -> str:
    """``minutes`` as the run file writes a time limit: ``'00:47:00'``, ``'1-02:00:00'``."""
    days, rest = divmod(minutes, 1440)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def fitting_minutes(seconds: float) -> int:
    """The time limit in whole minutes that holds ``seconds`` within :data:`TIME_LIMIT_SHARE` of it (the margin the
    layout search keeps for the prediction's error)."""
    return max(2, math.ceil(seconds / TIME_LIMIT_SHARE / 60))


def _facts_note(prediction: Prediction) -> str:
    if prediction.facts and all(f.origin == "default" for f in prediction.facts):
        return " (the cost model's defaults: nothing measured yet; ddslurm tune measures the model)"
    return ""


def _time_limit(plan: Plan, prediction: Prediction, limit_s: int) -> Overrun | None:
    allocation_s = prediction.chosen.allocation_s
    if allocation_s <= limit_s:  # 0: a plan from before the prediction had it
        return None
    minutes = fitting_minutes(allocation_s)
    fits = f"submission.time_limit: '{slurm_minutes(minutes)}'"
    start = allocation_start_s(prediction)
    message = (
        f"submission.time_limit ({plan.generation.time_minutes} min) is shorter than the predicted allocation, "
        f"{wall_text(allocation_s)} (the chosen layout's longest: {wall_text(start)} to load the models and start, "
        f"then its shards){_facts_note(prediction)}: Slurm ends it before its shards finish; set {fits} "
        f"({minutes} min, the prediction with a {1 - TIME_LIMIT_SHARE:.0%} margin) or more, or {ACCEPT}"
    )
    return Overrun(field="submission.time_limit", predicted_s=allocation_s, limit_s=limit_s, fits=fits, message=message)


def _batch(plan: Plan, prediction: Prediction, limit_s: int) -> Overrun | None:
    record_s = prediction.chosen.shard_record_s
    if record_s <= 0:  # a plan from before the prediction had it
        return None
    largest = max(s.num_records for s in plan.shards)
    records = min(plan.buffer_size, largest)
    start = allocation_start_s(prediction)
    saved_s = start + records * record_s
    if saved_s <= limit_s:
        return None
    whole = "the whole shard, " if records == largest else ""
    batch = wall_text(records * record_s)
    by = ", chosen by the planner" if plan.batching is not None and plan.batching.by == "planner" else ""
    said = (
        f"buffer_size ({plan.buffer_size} records a batch{by}): a shard's first batch ({whole}{records} records, "
        f"{batch} of generation) is predicted to be saved {wall_text(saved_s)} into its allocation "
        f"({wall_text(start)} to load the models and start first), after submission.time_limit "
        f"({plan.generation.time_minutes} min): every attempt of the shard ends before it saves a batch, so neither "
        "its automatic retries nor ddslurm retry can resume it (each starts again from nothing and ends the same way)"
    )
    most = math.floor((limit_s * TIME_LIMIT_SHARE - start) / record_s)
    if most < 1:
        fits = f"submission.time_limit: '{slurm_minutes(fitting_minutes(start + record_s))}'"
        change = f"no batch is saved before the limit whatever its size: set {fits} or more"
    else:
        fits = f"buffer_size: {most}"
        change = f"set {fits} or less (a batch saved within {TIME_LIMIT_SHARE:.0%} of the limit)"
        if plan.buffer_size >= largest:  # more shards make the shard, and so its one batch, smaller
            shards = math.ceil(plan.num_records / most)
            change += f", or shards: {shards} or more (about {most} records a shard, one batch each)"
    return Overrun(
        field="buffer_size", predicted_s=saved_s, limit_s=limit_s, fits=fits, message=f"{said}; {change}; or {ACCEPT}"
    )


def overruns(plan: Plan) -> tuple[Overrun, ...]:
    """How the plan's prediction says the run will not fit its time limit (module docstring); empty: it fits, or
    nothing predicts it."""
    prediction = plan.prediction
    if prediction is None:
        return ()
    limit_s = plan.generation.time_minutes * 60
    found = (_time_limit(plan, prediction, limit_s), _batch(plan, prediction, limit_s))
    return tuple(o for o in found if o is not None)


def plan_warnings(plan: Plan) -> tuple[str, ...]:
    """What the bill warns of the plan itself: each overrun, then what the run file's ``buffer_size`` costs
    (:func:`batch_warnings`) unless an overrun already says it."""
    found = overruns(plan)
    advice = () if any(o.field == "buffer_size" for o in found) else batch_warnings(plan)
    return (*(o.message for o in found), *advice)
