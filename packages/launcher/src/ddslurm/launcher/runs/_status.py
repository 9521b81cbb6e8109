"""Run and shard states from the run directory (``_records``) plus one squeue and one sacct call, whatever the
shard count: the run's state and totals over its shards (each shard's status: ``_status_shards``; what Slurm says:
``_status_scheduler``; the records returned: ``_status_model``)."""

from __future__ import annotations

from datetime import UTC, datetime

from ddslurm.config import ConfigError, Plan, ProviderSnapshot, RunLayout, SubmissionRecord, read_json, read_plan
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.runs._hosted_spend import Tally, hosted_spend
from ddslurm.launcher.runs._records import cancel_record, shard_stage, submission_progress, submissions
from ddslurm.launcher.runs._status_model import (
    STAGE_NAMES,
    KeyStatus,
    RunState,
    RunStatus,
    ShardStatus,
    StageProgress,
    Unreadable,
)
from ddslurm.launcher.runs._status_scheduler import Scheduler, covering_tasks, query
from ddslurm.launcher.runs._status_shards import read_winner, shard_status


def run_state(
    shards: list[ShardStatus], cancelled: bool = False, *, incomplete: bool = False, begun: bool = False
) -> RunState:
    """``begun``: some shard has had an attempt, or a result of an earlier stage (a two-stage run whose CPU stage
    waits), so a run whose shards all wait (for an automatic retry, a requeue, a CPU stage) is ``running``, not back
    to ``pending``."""
    states = {s.state for s in shards}
    if states == {"succeeded"}:
        return "succeeded"
    if incomplete and not cancelled:
        return "incomplete"
    if states & {"running", "waiting", "draining"}:
        return "running"
    if states & {"pending", "unknown"}:
        ended = states & {"succeeded", "failed", "partial", "cancelled", "corrupt"}
        return "running" if begun or ended else "pending"
    if cancelled:
        return "cancelled"
    if states & {"failed", "partial", "corrupt"}:
        return "failed"
    return "cancelled"


def _rows_done(s: ShardStatus) -> int:
    """The rows a shard's status counts as done: its result's, or its running attempt's progress."""
    return (s.rows or 0) if s.state in {"succeeded", "running", "draining"} else 0


def _stage_rows(layout: RunLayout, s: ShardStatus, stage: int) -> list[int]:
    """The rows done in each stage of a two-stage run's shard in ``stage``: in the GPU stage its status's; in the
    CPU stage its GPU-stage result's (its final result's without one) and its status's."""
    if stage == 0:
        return [_rows_done(s), 0]
    first, _ = read_winner(layout.stage_shard(s.shard, 0).winner)
    return [first.rows if first is not None else _rows_done(s), _rows_done(s)]


def _stages(plan: Plan, shards: list[ShardStatus]) -> list[StageProgress]:
    """Each stage of a two-stage run over its shards (none for a single-stage run)."""
    staged = [(s, s.stage_rows) for s in shards if s.stage_rows is not None]
    if not staged:
        return []
    done = (sum(s.stage == "cpu" for s, _ in staged), sum(s.state == "succeeded" for s, _ in staged))
    return [
        StageProgress(
            stage=name, rows_done=sum(rows[i] for _, rows in staged), records=plan.num_records, shards_done=done[i]
        )
        for i, name in enumerate(STAGE_NAMES)
    ]


def run_status(layout: RunLayout, slurm: Slurm, *, now: datetime | None = None) -> RunStatus:
    """The run and every shard, from its directory and one ``squeue`` and one ``sacct`` call."""
    plan, subs = read_plan(layout.plan), submissions(layout)
    return _run_status(layout, plan, subs, query(slurm, subs), now or datetime.now(UTC))


def run_statuses(
    layouts: list[RunLayout], slurm: Slurm, *, now: datetime | None = None
) -> list[RunStatus | Unreadable]:
    """The status of every run of ``layouts`` (in that order) from one ``squeue`` and one ``sacct`` call for all
    of them together; a run whose plan or submission records cannot be read is :class:`Unreadable`."""
    read: list[tuple[RunLayout, Plan, list[SubmissionRecord]] | Unreadable] = []
    for layout in layouts:
        try:
            read.append((layout, read_plan(layout.plan), submissions(layout)))
        except (ConfigError, OSError) as exc:
            read.append(Unreadable(layout, str(exc)))
    sched = query(slurm, [sub for item in read if not isinstance(item, Unreadable) for sub in item[2]])
    moment = now or datetime.now(UTC)
    return [item if isinstance(item, Unreadable) else _run_status(*item, sched, moment) for item in read]


def _run_status(
    layout: RunLayout, plan: Plan, subs: list[SubmissionRecord], sched: Scheduler, moment: datetime
) -> RunStatus:
    covering = covering_tasks(subs, layout)
    progress = submission_progress(layout, subs)
    shards = []
    for spec in plan.shards:
        stage = shard_stage(layout, plan, spec.index)
        mine = [(sub, task) for sub, task in covering.get(spec.index, []) if stage is None or sub.stage == stage]
        status = shard_status(layout, plan, spec.index, mine, sched, moment, stage)
        if stage is not None:
            status.stage_rows = _stage_rows(layout, status, stage)
        shards.append(status)
    if progress is not None:
        for s in shards:
            if s.state == "pending" and not covering.get(s.shard):
                s.state = "unsubmitted"  # no array covers it: the submission stopped before it
    incomplete = progress is not None and progress.incomplete
    counts: dict[str, int] = {}
    for s in shards:
        counts[s.state] = counts.get(s.state, 0) + 1
    done = sum(_rows_done(s) for s in shards if s.stage != "gpu")  # the final stage's rows: the run's records
    stages = _stages(plan, shards)
    work = sum(s.records for s in stages) if stages else plan.num_records
    cancelled = cancel_record(layout)
    return RunStatus(
        run_id=plan.run_id,
        run_dir=str(layout.root),
        state=run_state(
            shards,
            cancelled is not None,
            incomplete=incomplete,
            begun=any(s.stage == "cpu" or s.attempts for s in shards),
        ),
        stages=stages,
        progress=round(min(1.0, (sum(s.rows_done for s in stages) if stages else done) / work), 4) if work else 0.0,
        shards=shards,
        records_requested=plan.num_records,
        records_done=done,
        counts=counts,
        cancelled_at=cancelled.cancelled_at if cancelled else None,
        submission_incomplete=incomplete,
        unsubmitted_arrays=len(progress.missing) if progress is not None and incomplete else 0,
        name=plan.run_name,
        submitted_at=min((s.submitted_at for s in subs), default=None),
        hosted=key_statuses(layout, plan),
    )


def key_statuses(layout: RunLayout, plan: Plan) -> list[KeyStatus]:
    """Per hosted key of the run, its requests, 429s, tokens and cost over every attempt so far
    (:func:`~ddslurm.launcher.runs._hosted_spend.hosted_spend`); none when the snapshot cannot be read."""
    try:
        snapshot = read_json(layout.snapshot, ProviderSnapshot)
    except (ConfigError, OSError):
        return []
    spend = hosted_spend(layout, plan, snapshot)
    out = []
    for key in spend.keys:
        models = [m for m in spend.models if m.key == key.key]
        total = sum((m.spent for m in models), Tally())
        costs = [m.spent_cost for m in models if m.spent_cost is not None]
        out.append(
            KeyStatus(
                provider=key.provider,
                key_env=key.key_env,
                requests=total.requests,
                limited=total.limited,
                failed=total.failed,
                unanswered=total.unanswered,
                unreached=total.unreached,
                input_tokens=total.input_tokens,
                output_tokens=total.output_tokens,
                cost=sum(costs) if costs else None,
                currency=spend.currency,
                requests_per_minute=key.requests_per_minute,
                in_flight=key.in_flight,
            )
        )
    return out
