"""Steering a run: continue a submission that stopped part-way, retry shards without a winner, cancel shards,
accept short shards, find step logs.

What submits (``_submit`` and the planner) is imported by the functions that submit: ``cancel``, ``logs`` and
``wait`` (:func:`release_leftovers`) load neither."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ddslurm.config import (
    AttemptRecord,
    CancelRecord,
    FreshRecord,
    Plan,
    PlannedArray,
    QueuedJob,
    RunLayout,
    ShardCancelRecord,
    ShardLayout,
    SubmissionRecord,
    WinnerRecord,
    atomic_write,
    encode,
    publish_once,
    read_json,
    read_plan,
    read_regular,
)
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import LauncherError, SlurmError, UsageError
from ddslurm.launcher.runs._records import (
    attempt_records,
    cancel_record,
    shards_named,
    submission_progress,
    submissions,
)
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.runs._status_model import RunStatus, ShardStatus
from ddslurm.launcher.runs._status_scheduler import PENDING, query
from ddslurm.launcher.runs._status_shards import stopping

if TYPE_CHECKING:
    from ddslurm.launcher.runs._retry_why import Repeated, RetryPreview
    from ddslurm.launcher.submission._aliases import EndpointCheck
    from ddslurm.planner import SubmissionPlan

ACTIVE = {"running", "waiting", "draining", "pending", "unknown"}
_LIVE = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "RUNNING", "COMPLETING"}


def _start_fresh(shard: ShardLayout, now: datetime) -> None:
    """Exclude every attempt the shard has now from being resumed (their files stay where they are)."""
    excluded = {p.name for p in shard.attempts.glob("attempt-*")}
    if shard.fresh.is_file():
        excluded |= set(read_json(shard.fresh, FreshRecord).excluded)
    atomic_write(shard.fresh, encode(FreshRecord(excluded=tuple(sorted(excluded)), at=now.isoformat())))


@dataclass(frozen=True, slots=True)
class Retried:
    shards: tuple[int, ...]
    job_ids: tuple[str, ...]
    planned: SubmissionPlan | None = None
    """For ``dry_run``: the arrays the retry would submit and the limits they were checked against."""
    kept: tuple[int, ...] = ()
    """Shards asked for (``--shards``) that already have a result: a winner is never replaced, so not retried."""
    warnings: tuple[str, ...] = ()
    """What the retry should know of (``retry`` prints them as ``warning:``): shards it retries that would fail the
    same way, a provider it could not ask whether it takes the key now."""
    preview: tuple[RetryPreview, ...] = ()
    """For ``dry_run``: each shard's attempt, the rows it would resume and how it starts."""


def check_shard(shard: int, plan: Plan) -> int:
    """``shard`` if the run has it; else a :class:`UsageError` naming the range it has."""
    if not 0 <= shard < len(plan.shards):
        have = "shard 0" if len(plan.shards) == 1 else f"shards 0-{len(plan.shards) - 1}"
        raise UsageError(f"no shard {shard}: the run has {have}")
    return shard


def _pick_indices(wanted: list[int], plan: Plan) -> list[int]:
    return sorted(check_shard(s, plan) for s in wanted)


def _pick(status: RunStatus, wanted: list[int] | None, plan: Plan) -> list[int]:
    return _pick_indices(wanted, plan) if wanted is not None else [s.shard for s in status.shards]


def retry(
    layout: RunLayout,
    slurm: Slurm,
    env: Mapping[str, str],
    shards: list[int] | None = None,
    now: datetime | None = None,
    *,
    resume_cancelled: bool = False,
    fresh: bool = False,
    dry_run: bool = False,
    skip_busy: bool = False,
    force: bool = False,
    check_keys: EndpointCheck | None = None,
) -> Retried:
    """Submit new attempts, as one array, for shards that have no winner and nothing running or queued.

    Every API-key variable the run needs is checked again in this shell first; the new attempts resume from
    the batches of earlier attempts when the run's resume mode allows it. A run cancelled as a whole is
    retried only with ``resume_cancelled``, which moves its cancel record aside first. A shard whose winner no
    longer verifies is not retried (a new attempt could not replace the winner): see ``docs/attempts.md``.
    ``fresh``: the new attempts start from nothing; no later attempt continues the shards' earlier batches.
    ``dry_run``: decide the shards and plan the arrays (checked against the scheduler's limits), change nothing.
    ``skip_busy``: of ``shards``, those still running or queued are left out instead of refused.

    Before anything is submitted (a dry run too), why the shards failed is weighed (``_retry_why``): after
    ``key_refused`` each hosted provider of the run is asked with this shell's key (``check_keys``, default the
    providers' endpoint check), and a key still refused is a :class:`RetryRefusedError`; shards that failed in a way
    the frozen plan repeats (``FROZEN_PLAN``) are refused when they are all there is to retry, unless ``force``, and
    named in ``warnings`` otherwise.
    """
    from ddslurm.launcher.submission._arrays import check_environment, new_stamp, read_limits, refusals, submit_shards
    from ddslurm.planner import plan_submission, plural

    plan = read_plan(layout.plan)
    mark = cancel_record(layout)
    if mark is not None and not resume_cancelled:
        raise LauncherError(
            f"run {layout.run_id} was cancelled (ddslurm cancel, {mark.cancelled_at}); retry it with "
            "--resume-cancelled, which clears the cancel record"
        )
    progress = submission_progress(layout)
    if progress is not None and progress.incomplete:
        raise LauncherError(
            f"the submission of run {layout.run_id} is incomplete ({plural(len(progress.missing), 'array')} of its "
            f"plan not submitted): ddslurm submit --continue {layout.root} submits them first, or "
            f"ddslurm cancel {layout.root} cancels what was submitted"
        )
    status = run_status(layout, slurm)
    by_index = {s.shard: s for s in status.shards}
    chosen = _pick(status, shards, plan)
    busy = [s for s in chosen if by_index[s].state in ACTIVE or stopping(layout, by_index[s])]
    if shards is not None and busy and not skip_busy:
        raise LauncherError(
            f"shard(s) {', '.join(map(str, busy))} are still running or queued; cancel them first (a shard cancelled "
            "with cancel --shards: retry it once its allocation has stopped it, within seconds)"
        )
    corrupt = [s for s in chosen if by_index[s].state == "corrupt"]
    if shards is not None and corrupt:
        raise LauncherError(
            f"shard {corrupt[0]} has a winner that no longer verifies ({by_index[corrupt[0]].message}); a new "
            f"attempt cannot replace it: move {layout.shard(corrupt[0]).winner} aside, then retry the shard with "
            "--fresh (so that no attempt resumes from the changed batches)"
        )
    kept = tuple(s for s in chosen if by_index[s].state == "succeeded") if shards is not None else ()
    if kept and len(kept) == len(chosen):
        have = "has" if len(kept) == 1 else "have"
        why = " (--fresh starts over only shards without a result)" if fresh else ""
        raise LauncherError(
            f"{shards_named(kept)} {have} a result already: a published winner is never replaced, so there is "
            f"nothing to retry{why}; `ddslurm collect {layout.root}` uses it"
        )
    todo = [s for s in chosen if by_index[s].state not in ACTIVE | {"succeeded", "corrupt"} and s not in busy]
    if not todo:
        return Retried((), (), kept=kept)
    moment = now or datetime.now(UTC)
    check_environment(plan, env)
    warnings, repeated = _weigh_failures(
        layout, plan, env, [by_index[s] for s in todo], fresh=fresh, force=force, check=check_keys
    )
    if dry_run:
        from ddslurm.launcher.runs._retry_why import preview

        with refusals():
            planned = plan_submission(
                plan, layout, todo, read_limits(slurm, plan), kind="retry", stamp=new_stamp(moment)
            )
        shown = preview(layout, plan, todo, repeated, fresh=fresh)
        return Retried(tuple(todo), (), planned, kept, warnings, shown)
    if mark is not None:
        layout.cancelled.rename(layout.cleared_cancel(moment.strftime("%Y%m%dT%H%M%S%f")))
    for index in todo:
        shard = layout.shard(index)
        if os.path.lexists(shard.cancelled):  # cancel --shards: the shard may run again
            shard.cancelled.rename(shard.cleared_cancel(moment.strftime("%Y%m%dT%H%M%S%f")))
    if fresh:
        for index in todo:
            _start_fresh(layout.shard(index), moment)
            if layout.shard(index).stage(0).dir.is_dir():  # a two-stage run's GPU stage starts afresh too
                _start_fresh(layout.shard(index).stage(0), moment)
    gpu_done = [i for i in todo if plan.stages and layout.shard(i).stage(0).winner.exists()]
    job_ids = submit_shards(layout, plan, todo, slurm, env, moment, kind="retry", gpu_done=gpu_done)
    return Retried(tuple(todo), tuple(job_ids), kept=kept, warnings=warnings)


def _weigh_failures(
    layout: RunLayout,
    plan: Plan,
    env: Mapping[str, str],
    todo: list[ShardStatus],
    *,
    fresh: bool,
    force: bool,
    check: EndpointCheck | None,
) -> tuple[tuple[str, ...], list[Repeated]]:
    """Why the shards of ``todo`` failed, before a retry submits them: a key their provider still refuses and a
    failure the frozen plan repeats (of every shard, unless ``force``) are a :class:`RetryRefusedError`; else what a
    user should know (warnings) and the shards that would fail the same way."""
    from ddslurm.launcher.runs._retry_why import (
        check_refused_keys,
        key_refused_shards,
        refuse_repeated,
        repeated_failures,
    )

    warnings: list[str] = []
    refused = key_refused_shards(layout, plan, todo)
    if refused:
        if check is None:
            from ddslurm.providers import check_endpoints

            check = check_endpoints
        warnings += check_refused_keys(layout, env, refused, check)
    repeated = repeated_failures(layout, plan, todo, fresh=fresh)
    warnings += refuse_repeated(layout, repeated, [s.shard for s in todo], force=force)
    return tuple(warnings), repeated


@dataclass(frozen=True, slots=True)
class Continued:
    job_ids: tuple[str, ...]
    """The arrays submitted now."""
    adopted: tuple[str, ...]
    """Arrays found in the queue, submitted by an sbatch that was stopped before it answered: recorded, not
    submitted again."""
    shards: tuple[int, ...]
    """The shards of those arrays (each once)."""


def adopt_queued(
    layout: RunLayout,
    missing: Sequence[PlannedArray],
    submitted: dict[int, str],
    queue: Sequence[QueuedJob],
    now: datetime,
    *,
    record: bool = True,
) -> list[str]:
    """The planned arrays of ``missing`` that reached Slurm although their sbatch was stopped (a timeout): a job of
    ``queue`` (``squeue -t all``, ``%o``) submitted from the array's batch script. Each found is recorded
    (``submissions/<job>.json``, with its ``plan_index``) and added to ``submitted`` (plan index → job id); returns
    their job ids. ``record=False`` (another submitter holds the run's lock and records what it submits): found,
    not recorded. The one lookup behind ``submit --continue`` and ``cancel``."""
    adopted: list[str] = []
    for array in missing:
        found = sorted({j.array_job_id for j in queue if j.command == array.script}, key=int)
        if not found:
            continue
        if not record:
            adopted.append(found[0])
            continue
        entry = SubmissionRecord(
            array_job_id=found[0],
            shards=array.shards,
            tasks=array.tasks,
            submitted_at=now.isoformat(),
            script=array.script,
            kind=array.kind,
            after=None if array.after is None else submitted.get(array.after),
            plan_index=array.index,
            stage=array.stage,
            after_any=tuple(submitted[i] for i in array.after_any if i in submitted),
        )
        if publish_once(layout.submissions / f"{found[0]}.json", encode(entry)):
            submitted[array.index] = found[0]
            adopted.append(found[0])
    return adopted


def continue_submission(
    layout: RunLayout, slurm: Slurm, env: Mapping[str, str], now: datetime | None = None
) -> Continued:
    """Submit the arrays of the run's submission plan that were never submitted, exactly as planned (automatic
    retries after the arrays they follow), after checking that they fit in the scheduler's limits now.

    An array whose sbatch was stopped (a timeout) may have reached Slurm anyway: a job in the queue submitted
    from that array's batch script is recorded as that array instead of submitting it again. A run cancelled as
    a whole is not continued (``retry --resume-cancelled`` submits every shard without a result instead)."""
    from ddslurm.launcher.submission._arrays import check_environment, read_limits, refusals, submit_arrays, submit_lock
    from ddslurm.planner import array_tasks, plural, refuse_if_over

    plan = read_plan(layout.plan)
    moment = now or datetime.now(UTC)
    root = layout.root
    progress = submission_progress(layout)
    if progress is None:
        raise LauncherError(
            f"run {layout.run_id} has no submission plan ({layout.submit_plan.name}): it was submitted by an earlier "
            f"ddslurm; ddslurm retry {root} submits its shards that have no task"
        )
    if progress.closed:
        raise LauncherError(
            f"run {layout.run_id} was cancelled (ddslurm cancel), so the rest of its submission is not submitted: "
            f"ddslurm retry {root} --resume-cancelled submits every shard without a result"
        )
    with submit_lock(layout):
        progress = submission_progress(layout)  # again, under the lock: another submitter may have finished it
        missing = progress.missing if progress is not None else []
        if not missing:
            return Continued((), (), ())
        check_environment(plan, env)
        limits = read_limits(slurm, plan)
        submitted = dict(progress.submitted) if progress is not None else {}
        adopted = adopt_queued(layout, missing, submitted, limits.queue, moment)
        remaining = [a for a in missing if a.index not in submitted]
        tasks = sum(array_tasks(a) for a in remaining)
        with refusals():
            refuse_if_over(
                tasks,
                limits,
                f"the {plural(len(remaining), 'array')} left to submit hold {plural(tasks, 'array task')}",
                f"wait until queued jobs have finished and continue again, or cancel the run: ddslurm cancel {root}",
            )
        job_ids = submit_arrays(
            layout,
            plan,
            remaining,
            slurm,
            env,
            moment,
            submitted=submitted,
            plan_arrays=progress.plan.arrays if progress else (),
        )
    shards = sorted({s for a in missing for s in a.shards})
    return Continued(tuple(job_ids), tuple(adopted), tuple(shards))


@dataclass(frozen=True, slots=True)
class Cancelled:
    ids: tuple[str, ...]
    """What was passed to scancel: every array of the run (whole run), or array tasks (``--shards``)."""
    run: bool
    """Whether the whole run was cancelled (and its cancel record written)."""
    adopted: tuple[str, ...] = ()
    """Arrays found in the queue by their batch script, whose sbatch was stopped before it answered (a timeout):
    cancelled too, and recorded (:func:`adopt_queued`)."""
    shards: tuple[int, ...] = ()
    """``--shards``: the shards cancelled (each has its cancel record)."""
    finished: tuple[int, ...] = ()
    """Of ``shards``, those that already had their result: nothing of theirs was left to stop."""
    pulled: bool = False
    """``--shards``: the run has pulling arrays, whose allocations stop the shards themselves (no task of theirs
    is passed to scancel)."""


def release_leftovers(layout: RunLayout, slurm: Slurm, status: RunStatus) -> tuple[str, ...]:
    """Cancel the tasks of a succeeded run's arrays still waiting in the queue; returns what was cancelled.

    Every shard has its winner, so such a task can only start, find the winner and record ``superseded``: a job start
    (and for a pulling array, an allocation) spent on nothing. It happens when Slurm requeues a task after its
    shard was published (a node that fails between the winner and the task's end) or holds a two-stage run's
    CPU-stage array until its GPU array ends. Only pending tasks are cancelled; running ones end by themselves.
    """
    if status.state != "succeeded":
        return ()
    subs = submissions(layout)
    waiting = [t for t in slurm.squeue([s.array_job_id for s in subs]) if t.state in PENDING]
    ids = tuple(sorted({t.job_id if t.task is None else f"{t.job_id}_{t.task}" for t in waiting}))
    slurm.scancel(ids)
    return ids


def _find_unrecorded(layout: RunLayout, slurm: Slurm, moment: datetime) -> tuple[list[str], str | None]:
    """The arrays of the run's submission plan that have no record but reached Slurm (an sbatch stopped by its
    timeout), recorded now (or only found, while another submitter holds the lock), and why the queue could not
    be read (None when it could, or when no planned array lacks a record: then nothing is asked)."""
    progress = submission_progress(layout)
    if progress is None or not progress.missing:
        return [], None
    from ddslurm.launcher.submission._arrays import SubmitLockedError, submit_lock

    try:
        queue = slurm.queue()
    except SlurmError as exc:
        return [], str(exc)
    try:
        with submit_lock(layout):
            again = submission_progress(layout)  # under the lock: another submitter may have recorded some
            if again is None:
                return [], None
            return adopt_queued(layout, again.missing, dict(again.submitted), queue, moment), None
    except SubmitLockedError:  # a submitter is at work: it records (and cancels) what its sbatch calls submit
        return adopt_queued(layout, progress.missing, dict(progress.submitted), queue, moment, record=False), None


def cancel(layout: RunLayout, slurm: Slurm, shards: list[int] | None = None, now: datetime | None = None) -> Cancelled:
    """Cancel the whole run, or the queued and running tasks of ``shards``, in one scancel call.

    First, when arrays of the run's submission plan have no record, the queue is searched for them by their batch
    script (:func:`adopt_queued`, as ``submit --continue`` does): an sbatch stopped by its timeout may have reached
    Slurm, and such an array is recorded and cancelled with the others.
    The whole run: its cancel record is written first (once; a later cancel keeps the first record), so an
    array that starts anyway does no work, then every array of the run is cancelled, the pending automatic
    retries included (newest first, so no retry is released by the cancellation of the array it follows).
    Shards: every task that runs or will run them, in the run's arrays or in pending retry arrays.
    A queue that cannot be read is a :class:`LauncherError` after the recorded arrays were cancelled.
    """
    plan = read_plan(layout.plan)
    moment = now or datetime.now(UTC)
    adopted, unread = _find_unrecorded(layout, slurm, moment)
    subs = submissions(layout)
    newest_first = sorted(subs, key=lambda s: int(s.array_job_id), reverse=True)
    unrecorded = [job for job in adopted if job not in {s.array_job_id for s in subs}]  # found, not recorded
    if shards is None:
        arrays = tuple(sorted({*(s.array_job_id for s in subs), *unrecorded}, key=int, reverse=True))
        record = CancelRecord(cancelled_at=moment.isoformat(), array_job_ids=arrays)
        publish_once(layout.cancelled, encode(record))
        slurm.scancel(arrays)
        _refuse_unread(layout, unread)
        return Cancelled(arrays, run=True, adopted=tuple(adopted))
    chosen = set(_pick_indices(shards, plan))
    sched = query(slurm, subs)
    # Each chosen shard's cancel record first: a pulling allocation, which runs other shards too, stops this
    # shard's generation step itself (and claims it no more) when it sees it; and a task cancelled while
    # pending, which Slurm then forgets (neither squeue nor sacct lists it), still ends its shard `cancelled`.
    for shard in sorted(chosen):
        publish_once(layout.shard(shard).cancelled, encode(ShardCancelRecord(cancelled_at=moment.isoformat())))
    ids: list[str] = list(unrecorded)  # a submitter still at work on them: cancelled whole, not by task
    for sub in newest_first:
        if sub.tasks is not None:
            continue
        for task, shard in enumerate(sub.shards):
            if shard not in chosen:
                continue
            state = sched.state_of(sub.array_job_id, task)
            if state is None or state.state in _LIVE:  # unknown to both: just submitted (accounting lag)
                ids.append(f"{sub.array_job_id}_{task}")
    slurm.scancel(ids)
    _refuse_unread(layout, unread)
    finished = tuple(s for s in sorted(chosen) if os.path.lexists(layout.shard(s).winner))
    return Cancelled(
        tuple(ids),
        run=False,
        adopted=tuple(adopted),
        shards=tuple(sorted(chosen)),
        finished=finished,
        pulled=any(sub.tasks is not None for sub in subs),
    )


def _refuse_unread(layout: RunLayout, unread: str | None) -> None:
    if unread is not None:
        raise LauncherError(
            f"cancelled the recorded arrays of run {layout.run_id}, but arrays of its submission plan have no record "
            f"and the queue could not be searched for them (an sbatch stopped by its timeout may have reached "
            f"Slurm): {unread}; run ddslurm cancel {layout.root} again"
        )


@dataclass(frozen=True, slots=True)
class AcceptedShard:
    shard: int
    rows: int
    stage: Literal["gpu", "cpu"] | None
    """``gpu``: a two-stage shard's GPU-stage result (``stage-0/winner.json``), which its CPU stage still turns into
    the shard's result; ``cpu``: a two-stage shard's final result; None: a single-stage run's shard."""


@dataclass(frozen=True, slots=True)
class Accepted:
    accepted: tuple[AcceptedShard, ...]
    cpu_stage: tuple[int, ...] = ()
    """Shards accepted at their GPU stage whose CPU stage was submitted now (as ``retry`` submits it)."""
    job_ids: tuple[str, ...] = ()
    """The arrays submitted for them."""
    queued: tuple[int, ...] = ()
    """Shards accepted at their GPU stage that a CPU-stage array of the run already queued or running pulls."""


def _best_candidate(layout: RunLayout, shard: int, stage: int | None = None) -> WinnerRecord | None:
    """The partial attempt of ``shard`` (``stage`` 0: its GPU stage) with the most rows and a candidate."""
    best: WinnerRecord | None = None
    for record in attempt_records(layout, shard, stage):
        path = layout.stage_shard(shard, stage).attempt(record.attempt).candidate
        if record.state == "partial" and path.is_file():
            candidate = read_json(path, WinnerRecord)
            if best is None or candidate.rows > best.rows:
                best = candidate
    return best


def accept_partial(
    layout: RunLayout,
    shards: list[int],
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime | None = None,
) -> Accepted:
    """Publish the best short result of each shard as its winner, marked partial, with no replacing (once).

    A two-stage shard whose GPU stage ended partial (and has no result of its own) gets that stage's best
    candidate as its GPU-stage result (``stage-0/winner.json``, partial), and then its CPU stage runs, submitted
    exactly as ``retry`` submits it for shards whose GPU stage is done; a shard that a CPU-stage array already
    queued or running will pull is left to it. Every shard is checked before anything is published."""
    plan = read_plan(layout.plan)
    staged = len(plan.stages) > 1
    chosen: list[tuple[int, WinnerRecord, int | None]] = []
    for shard in _pick_indices(shards, plan):
        top = layout.shard(shard)
        best, stage = _best_candidate(layout, shard), None
        if best is None and staged and not top.winner.exists():
            best, stage = _best_candidate(layout, shard, 0), 0
            if best is not None and top.stage(0).winner.exists():
                raise LauncherError(
                    f"shard {shard} already has a result of its GPU stage; its CPU stage has no partial result to "
                    f"accept (ddslurm retry {layout.root} --shards {shard} runs its CPU stage)"
                )
        if best is None:
            raise LauncherError(f"shard {shard} has no partial result to accept")
        if top.winner.exists():
            raise LauncherError(f"shard {shard} already has a winner")
        chosen.append((shard, best, stage))
    accepted: list[AcceptedShard] = []
    for shard, best, stage in chosen:
        where = layout.stage_shard(shard, stage)
        if not publish_once(where.winner, read_regular(where.attempt(best.attempt).candidate)):
            raise LauncherError(f"shard {shard} already has a {'GPU-stage result' if stage == 0 else 'winner'}")
        label: Literal["gpu", "cpu"] | None = ("gpu" if stage == 0 else "cpu") if staged else None
        accepted.append(AcceptedShard(shard, best.rows, label))
    gpu = [a.shard for a in accepted if a.stage == "gpu"]
    if not gpu:
        return Accepted(tuple(accepted))
    try:
        done = retry(layout, slurm, env, gpu, now, skip_busy=True)  # their GPU stage is done: a CPU-stage array
    except LauncherError as exc:
        listed = ",".join(map(str, gpu))
        raise LauncherError(
            f"the GPU stage's partial result of shard(s) {listed} was accepted (stage-0/winner.json), but the CPU "
            f"stage was not submitted: {exc}\n  ddslurm retry {layout.root} --shards {listed} submits it"
        ) from exc
    queued = tuple(s for s in gpu if s not in done.shards)
    return Accepted(tuple(accepted), done.shards, done.job_ids, queued)


STEP_GLOBS = {
    "client": ("client.out", "client.log"),
    "server": ("server-*.log",),
    "proxy": ("proxy-*.log", "proxy-*.out"),
}


def pick_attempt(layout: RunLayout, shard: int, attempt: str | None = None) -> AttemptRecord | None:
    """The shard's attempt ``attempt`` (its id, with or without the ``attempt-`` prefix), else its latest; None
    while it has none. An id the shard does not have is a :class:`UsageError` that lists the ones it has."""
    records = sorted(
        [*attempt_records(layout, shard), *attempt_records(layout, shard, 0)], key=lambda r: r.started_at
    )  # a two-stage run's GPU-stage attempts (stage-0/) too
    if attempt is None:
        return records[-1] if records else None
    wanted = attempt if attempt.startswith("attempt-") else f"attempt-{attempt}"
    found = next((r for r in records if r.attempt == wanted), None)
    if found is None:
        have = ", ".join(r.attempt.removeprefix("attempt-") for r in records) or "none yet"
        raise UsageError(f"shard {shard} has no attempt {attempt!r} (its attempts: {have})")
    return found


def log_files(layout: RunLayout, shard: int, step: str, attempt: AttemptRecord | None = None) -> list[Path]:
    """The log files of one step of ``attempt`` (default: the shard's latest) that exist now; ``slurm``: the
    array task's batch output."""
    record = attempt if attempt is not None else pick_attempt(layout, shard)
    if record is None:
        return []
    if step == "slurm":
        return [Path(record.slurm_log)] if record.slurm_log and Path(record.slurm_log).is_file() else []
    attempt_dir = layout.shard(shard).attempt(record.attempt).dir
    if not attempt_dir.is_dir():  # a two-stage run's GPU-stage attempt
        attempt_dir = layout.shard(shard).stage(0).attempt(record.attempt).dir
    if step != "client" and record.allocation:  # a pulling allocation's servers and proxies serve all its shards
        attempt_dir = Path(record.allocation)
    return [p for pattern in STEP_GLOBS[step] for p in sorted(attempt_dir.glob(pattern))]
