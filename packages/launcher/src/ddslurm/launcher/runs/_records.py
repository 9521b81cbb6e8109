"""What a run directory records, read as every command reads it: the submissions and how far the submission plan
got, the attempts of each shard (and its stage), the claims of pulling arrays and the cancel record; and finding a
run directory by path or run id; shards as messages name them. No scheduler is asked (``_status`` adds what Slurm
says)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddslurm.config import (
    AttemptRecord,
    CancelRecord,
    ClaimRecord,
    ConfigError,
    Plan,
    PlannedArray,
    RunLayout,
    SubmissionRecord,
    SubmitPlanRecord,
    check_run_tree,
    compact_ranges,
    read_json,
)
from ddslurm.launcher.errors import RunNotFoundError


def submissions(layout: RunLayout) -> list[SubmissionRecord]:
    records = [read_json(p, SubmissionRecord) for p in sorted(layout.submissions.glob("*.json"))]
    return sorted(records, key=lambda r: int(r.array_job_id))


def read_submit_plan(layout: RunLayout) -> SubmitPlanRecord | None:
    """The run's submission plan (``submit-plan.json``); None for a run submitted before plans were written."""
    if not os.path.lexists(layout.submit_plan):
        return None
    return read_json(layout.submit_plan, SubmitPlanRecord)


def was_cancelled(layout: RunLayout) -> bool:
    """Whether the run is, or ever was, cancelled as a whole (``retry --resume-cancelled`` moves the record aside)."""
    return os.path.lexists(layout.cancelled) or any(layout.root.glob(layout.cleared_cancel("*").name))


@dataclass(frozen=True, slots=True)
class SubmissionProgress:
    """Which arrays of the run's submission plan were submitted (by their submission records)."""

    plan: SubmitPlanRecord
    submitted: dict[int, str]
    """Plan index → array job id."""
    closed: bool
    """The run was cancelled as a whole: the rest of the plan is never submitted (``retry --resume-cancelled``
    submits every shard without a result instead)."""

    @property
    def missing(self) -> list[PlannedArray]:
        return [a for a in self.plan.arrays if a.index not in self.submitted]

    @property
    def incomplete(self) -> bool:
        return not self.closed and any(a.index not in self.submitted for a in self.plan.arrays)


def submission_progress(layout: RunLayout, subs: list[SubmissionRecord] | None = None) -> SubmissionProgress | None:
    plan = read_submit_plan(layout)
    if plan is None:
        return None
    records = submissions(layout) if subs is None else subs
    submitted = {s.plan_index: s.array_job_id for s in records if s.plan_index is not None}
    return SubmissionProgress(plan, submitted, was_cancelled(layout))


def shard_stage(layout: RunLayout, plan: Plan, shard: int) -> int | None:
    """The stage a two-stage run's shard is in: 0 until its GPU stage has a result, then 1; None: one stage."""
    if len(plan.stages) < 2:
        return None
    top = layout.shard(shard)
    return 1 if top.stage(0).winner.exists() or top.winner.exists() else 0


def attempt_records(layout: RunLayout, shard: int, stage: int | None = None) -> list[AttemptRecord]:
    records: list[AttemptRecord] = []
    for path in layout.stage_shard(shard, stage).attempts.glob("attempt-*/attempt.json"):
        try:
            records.append(read_json(path, AttemptRecord))
        except (ConfigError, OSError):
            continue
    return sorted(records, key=lambda r: r.started_at)


def cancel_record(layout: RunLayout) -> CancelRecord | None:
    """The whole-run cancel record, if the run was cancelled (an unreadable one still counts)."""
    if not os.path.lexists(layout.cancelled):
        return None
    try:
        return read_json(layout.cancelled, CancelRecord)
    except (ConfigError, OSError, ValueError):
        return CancelRecord(cancelled_at="unknown", array_job_ids=())


def claimed_by(layout: RunLayout, shard: int, array_job_id: str, stage: int | None = None) -> int | None:
    """The task of pulling array ``array_job_id`` that claimed ``shard``, or None."""
    try:
        return read_json(layout.stage_shard(shard, stage).claim(array_job_id), ClaimRecord).task
    except (FileNotFoundError, ConfigError, OSError, ValueError):
        return None


def find_run(ref: str, workspace: Path | None) -> RunLayout:
    """A run directory given as a path, or a run id inside the workspace; one that only its owner can change
    (:func:`~ddslurm.config.check_run_tree`: another user's run, or one another user could have swapped, is
    refused by every command)."""
    candidate = Path(ref)
    found = RunLayout(candidate.resolve()) if (candidate / "run.json").is_file() else None
    if found is None and workspace is not None and RunLayout.in_workspace(workspace, ref).plan.is_file():
        found = RunLayout.in_workspace(workspace, ref)
    if found is not None:
        check_run_tree(found.root)
        return found
    where = f" or in {workspace / 'runs'}" if workspace else " (pass a run directory, or --profile to look up ids)"
    raise RunNotFoundError(f"no run {ref!r} found as a directory{where}")


def shards_named(shards: Sequence[int]) -> str:
    """``shard 2``, ``shards 1-3,5``: shards as messages name them."""
    return f"shard {shards[0]}" if len(shards) == 1 else f"shards {compact_ranges(shards)}"
