"""The records of one Data Designer batch (the plan's ``buffer_size``): the unit a shard saves its work in.

A shard writes one Parquet file a batch; a new attempt resumes from the batches an earlier one completed, so a
cancel, a time limit or a crash loses at most the batch in progress. Data Designer's default (1000 records) is
more than most shards hold: such a shard saves nothing until it ends, and a time limit too short for it fails the
same way on every retry. So where the run file sets no ``buffer_size`` the planner chooses one that saves a shard's
work at least :data:`CHECKPOINTS_PER_SHARD` times and at least every :data:`CHECKPOINT_S` seconds of its predicted
generation. Rows do not depend on it: a record's values are the same whatever batch it falls in (a shard is
already a different split of the records than an unsharded run's batches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from ddslurm.config import Batching, Plan

CHECKPOINTS_PER_SHARD = 5
"""A shard of at least this many records saves its work at least this many times (the last when it ends), so a
cancel or a time limit loses at most about a fifth of it: a shard of 60 records has batches of 12, and one cancelled
at 60 % asks for at most 12 records again (what Data Designer has in flight when the batch is cut)."""
CHECKPOINT_S = 300.0
"""At most this many seconds of a shard's predicted generation go by between two of its saves."""
DD_DEFAULT_BUFFER_SIZE = 1000
"""Data Designer's own default ``buffer_size``: the largest batch the planner chooses (a batch is held in memory)."""


def plan_batches(
    buffer_size: int | None, shard_records: Sequence[int], shard_record_s: float | None
) -> tuple[int, Batching]:
    """The batch size of a run whose shards hold ``shard_records`` records, and how it was chosen: the run file's
    ``buffer_size`` (at most the run's records), else the planner's rule.
    ``shard_record_s``: the predicted seconds a shard's client takes per record (None: no prediction)."""
    largest = max(shard_records)
    predicted = shard_record_s if shard_record_s is not None and shard_record_s > 0 else None
    if buffer_size is not None:
        size = min(buffer_size, sum(shard_records))
        rule = f"buffer_size {buffer_size} from the run file"
        return size, _batching("run file", rule, size, largest, predicted)
    size = max(1, min(DD_DEFAULT_BUFFER_SIZE, largest // CHECKPOINTS_PER_SHARD))
    if size == DD_DEFAULT_BUFFER_SIZE:
        rule = (
            f"Data Designer's default, {size}: a shard of {largest} records saves {CHECKPOINTS_PER_SHARD} times or more"
        )
    else:
        rule = f"{CHECKPOINTS_PER_SHARD} batches or more a shard of {largest} records"
    if predicted is not None and size * predicted > CHECKPOINT_S:
        size = max(1, math.floor(CHECKPOINT_S / predicted))
        rule = (
            f"a batch at most every {CHECKPOINT_S / 60:g} min of a shard's predicted generation "
            f"({predicted:.2f} s a record)"
        )
    return size, _batching("planner", f"chosen by the planner: {rule}", size, largest, predicted)


def _batching(
    by: Literal["run file", "planner"], rule: str, size: int, largest: int, record_s: float | None
) -> Batching:
    return Batching(
        by=by,
        rule=rule,
        shard_records=largest,
        batches=math.ceil(largest / min(size, largest)),
        batch_s=None if record_s is None else min(size, largest) * record_s,  # a batch never outgrows its shard
    )


def wall_text(seconds: float) -> str:
    """A predicted duration: ``under 1 s``, ``45 s``, ``12.5 min``, ``3.2 h``."""
    if seconds < 1:
        return "under 1 s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def batch_text(plan: Plan) -> str:
    """The plan's batch size (``buffer_size``), why, and the work a cancel or a time limit can lose: the batch in
    progress of each shard, in minutes where the cost model predicts them."""
    batching = plan.batching
    if batching is None:  # a plan made before the planner chose batches
        return f"{plan.buffer_size} records a batch"
    saves = "once, when it ends" if batching.batches == 1 else f"{batching.batches} times"
    text = f"{plan.buffer_size} records a batch ({batching.rule}): a shard of {batching.shard_records} saves {saves}"
    if batching.batch_s is not None:
        lost = wall_text(batching.batch_s)
        return f"{text}; a cancel or a time limit loses at most a batch: {_about(lost)} of work"
    return f"{text}; a cancel or a time limit loses at most a batch"


def _about(duration: str) -> str:
    return duration if duration.startswith("under") else f"about {duration}"


def batch_warnings(plan: Plan) -> tuple[str, ...]:
    """What the run file's own ``buffer_size`` costs: shards of several batches' worth of records that are one batch
    each save nothing until they end. (A batch predicted to be saved only after the time limit is an overrun:
    :func:`ddslurm.planner._fit.overruns`.)"""
    batching = plan.batching
    if batching is None or batching.by != "run file":
        return ()
    if batching.batches == 1 and batching.shard_records > CHECKPOINTS_PER_SHARD:
        return (
            f"buffer_size {plan.buffer_size}: each shard ({batching.shard_records} records) is one batch, so it saves "
            "nothing until it ends: a cancel, a crash or its time limit loses all its work; leave buffer_size out "
            "and the planner chooses batches a shard saves its work in (docs/run-files.md)",
        )
    return ()
