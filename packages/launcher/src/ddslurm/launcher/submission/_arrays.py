"""The arrays of a submission: planned within the scheduler's limits (refused with the numbers otherwise), then
submitted in order under the run's submit lock, each recorded as it is submitted, so that a submission that stops
part-way is an explicit state of the run (:class:`PartialSubmitError`; ``ddslurm submit --continue`` finishes it);
the environment a job is given (the plan's secret names and a small allow-list, by name)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from ddslurm.config import (
    LockHeldError,
    Plan,
    PlannedArray,
    RunLayout,
    SchedulerLimits,
    SubmissionKind,
    SubmissionRecord,
    atomic_write,
    compact_ranges,
    encode,
    encode_pretty,
    exclusive_lock,
    publish_once,
)
from ddslurm.launcher.cluster._slurm import Slurm, SlurmTimeoutError
from ddslurm.launcher.errors import LauncherError, SlurmError, SubmitError
from ddslurm.launcher.submission._render import render_generation
from ddslurm.planner import (
    LimitError,
    SubmissionPlan,
    array_tasks,
    failure_chain,
    plan_submission,
    plural,
)
from ddslurm.providers import (
    missing_env,
)


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """What the planner refuses while planning a submission's arrays (they do not fit the scheduler's limits) is
    the launcher's :class:`SubmitError`, with the planner's numbers."""
    try:
        yield
    except LimitError as exc:
        raise SubmitError(str(exc)) from exc


def check_environment(plan: Plan, env: Mapping[str, str]) -> None:
    """Every variable the jobs get by name (API keys, ``server.env_from``) is set in the submitting shell."""
    missing = missing_env(list(plan.secret_env), env)
    if missing:
        raise SubmitError(
            f"API-key variable(s) {', '.join(missing)} are unset or empty in this shell; the run's providers "
            "need them (export them and try again)"
        )
    missing = missing_env(list(plan.server_secret_env), env)
    if missing:
        raise SubmitError(
            f"variable(s) {', '.join(missing)} named by server.env_from are unset or empty in this shell; the run's "
            "model servers need them (export them and try again)"
        )


def secret_warnings(slurm: Slurm, plan: Plan) -> tuple[str, ...]:
    """Where the cluster keeps the run's secret values beyond the job itself: with ``AccountingStoreFlags``
    holding ``job_env``, slurmdbd stores every batch job's environment, API keys included, in its database for as
    long as it keeps job records (Slurm keeps it in its state directory only while the job lives)."""
    names = sorted({*plan.secret_env, *plan.server_secret_env} - set(plan.secret_env_unscanned))
    try:
        stored = bool(names) and slurm.config().stores_job_env
    except SlurmError:
        return ()
    if not stored:
        return ()
    return (
        f"this cluster stores every batch job's environment in its accounting database (AccountingStoreFlags "
        f"includes job_env): the values of {', '.join(names)} will be kept there with the job records, readable by "
        "Slurm's administrators (and by anyone with sacct --env-vars rights); see docs/architecture.md#threat-model",
    )


def read_limits(slurm: Slurm, plan: Plan) -> SchedulerLimits:
    """The scheduler limits the run's generation jobs must fit in (its account, QOS and partition)."""
    res = plan.generation
    return slurm.limits(account=res.account, qos=res.qos, partition=res.partition)


def first_script(plan: Plan, layout: RunLayout, planned: SubmissionPlan) -> str:
    """The batch script of a submission's first array (what ``sbatch --test-only`` is asked about)."""
    first = planned.arrays[0]
    return render_generation(plan, layout, list(first.shards), tasks=first.tasks, stage=first.stage)


def new_stamp(now: datetime) -> str:
    """Names one submission's batch scripts (``generate-<stamp>-<NNNN>.sbatch``)."""
    return f"{now.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"


class PartialSubmitError(LauncherError):
    """sbatch failed or timed out after some arrays of a submission were submitted: the run exists, part of it
    is queued, and the message says which shards were submitted, which were not, and how to go on."""

    def __init__(
        self,
        layout: RunLayout,
        *,
        submitted: list[tuple[PlannedArray, str]],
        missing: list[PlannedArray],
        cause: BaseException,
        planned: bool,
        maybe_submitted: bool = False,
    ) -> None:
        self.layout, self.submitted, self.missing, self.cause = layout, submitted, missing, cause
        self.planned, self.maybe_submitted = planned, maybe_submitted
        total = len(submitted) + len(missing)
        lines = [
            f"the submission of run {layout.run_id} stopped after {len(submitted)} of {total} array(s): "
            f"{cause or type(cause).__name__}"
        ]
        lines += [f"  submitted:     {_array_line(a, job)}" for a, job in submitted[:12]]
        if len(submitted) > 12:
            lines.append(f"                 ... and {len(submitted) - 12} more")
        lines += [f"  not submitted: {_array_line(a, None)}" for a in missing[:12]]
        if len(missing) > 12:
            lines.append(f"                 ... and {len(missing) - 12} more")
        root = layout.root
        if planned:
            lines += [
                "  The run's submission is incomplete (ddslurm status shows the unsubmitted shards). Either",
                f"    submit the rest:               ddslurm submit --continue {root}",
                f"    or cancel what was submitted:  ddslurm cancel {root}",
            ]
        else:
            lines += [
                "  The shards not submitted have no task queued. Either",
                f"    submit them again:             ddslurm retry {root}",
                f"    or cancel what was submitted:  ddslurm cancel {root}",
            ]
        if maybe_submitted:
            lines.append(
                "  (the last sbatch may have reached Slurm before it was stopped: --continue looks for its job in "
                "the queue by its batch script and records it instead of submitting it again)"
            )
        super().__init__("\n".join(lines))


def _array_line(array: PlannedArray, job: str | None) -> str:
    what = {"initial": "", "retry": "retry", "auto-retry": "automatic retry"}[array.kind]
    head = f"array job {job}: " if job else ""
    tasks = plural(array_tasks(array), "task" if array.tasks is None else "pulling allocation")
    if array.stage is not None:
        what = ", ".join(w for w in (what, "CPU stage" if array.stage == 1 else "GPU stage") if w)
    return f"{head}shards {compact_ranges(array.shards)} ({tasks}{', ' if what else ''}{what})"


class SubmitLockedError(LauncherError):
    """Another ddslurm holds the run's submit lock (it is submitting arrays of the run now)."""


@contextlib.contextmanager
def submit_lock(layout: RunLayout) -> Iterator[None]:
    """Held while arrays of the run are submitted: a second submitter of the same run is refused
    (:class:`SubmitLockedError`; :func:`~ddslurm.config.exclusive_lock`, tried once)."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(layout.submit_lock, wait_s=0))
        except LockHeldError:
            raise SubmitLockedError(
                f"another ddslurm is submitting arrays of run {layout.run_id} now ({layout.submit_lock}); "
                "wait for it to finish, then look at ddslurm status"
            ) from None
        yield


def submit_arrays(
    layout: RunLayout,
    plan: Plan,
    arrays: Sequence[PlannedArray],
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    submitted: Mapping[int, str] | None = None,
    planned: bool = True,
    plan_arrays: Sequence[PlannedArray] = (),
) -> list[str]:
    """sbatch ``arrays`` in order, recording each as it is submitted (``plan_index`` when ``planned``).
    ``submitted``: the plan's arrays submitted earlier (index → job id), for the dependencies of automatic
    retries; ``plan_arrays``: every array of the plan when ``arrays`` is only part of it (``submit --continue``),
    so that an automatic retry waits for every earlier level of its chain (:func:`failure_chain`). Stops before
    the next sbatch when the run was cancelled meanwhile. On a failure raises :class:`PartialSubmitError`, naming
    what was and was not submitted."""
    every = [*plan_arrays, *(a for a in arrays if a.index not in {p.index for p in plan_arrays})]
    ids: dict[int, str] = dict(submitted or {})
    before = [(a, ids[a.index]) for a in arrays if a.index in ids]
    done: list[tuple[PlannedArray, str]] = []
    todo = [a for a in arrays if a.index not in ids]
    for n, array in enumerate(todo):
        try:
            if os.path.lexists(layout.cancelled):
                raise LauncherError("the run was cancelled (ddslurm cancel) while it was being submitted")
            chain = failure_chain(every, array)
            for follows in (*chain, *array.after_any):
                if follows not in ids:
                    raise LauncherError(f"array {follows} of the plan, which array {array.index} follows, has no job")
            after_any = tuple(ids[i] for i in array.after_any)
            job_id = _sbatch(
                layout,
                plan,
                array,
                slurm,
                env,
                now,
                after_failure_of=tuple(ids[i] for i in chain),
                after_any=after_any,
                planned=planned,
            )
        except (LauncherError, OSError, KeyboardInterrupt) as exc:
            raise PartialSubmitError(
                layout,
                submitted=before + done,
                missing=todo[n:],
                cause=exc,
                planned=planned,
                maybe_submitted=isinstance(exc, SlurmTimeoutError | KeyboardInterrupt | _Unrecorded),
            ) from exc
        ids[array.index] = job_id
        done.append((array, job_id))
        if os.path.lexists(layout.cancelled):  # cancelled while this array was being submitted: it goes too
            slurm.scancel([job_id])
            raise PartialSubmitError(
                layout,
                submitted=before + done,
                missing=todo[n + 1 :],
                cause=LauncherError("the run was cancelled (ddslurm cancel) while it was being submitted"),
                planned=planned,
            )
    return [job for _, job in done]


class _Unrecorded(LauncherError):
    """sbatch submitted the array but its submission record could not be written."""


def submit_shards(
    layout: RunLayout,
    plan: Plan,
    shards: list[int],
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    kind: SubmissionKind = "initial",
    gpu_done: Collection[int] = (),
) -> list[str]:
    """Submit ``shards`` of a written run directory as arrays no larger than the cluster's MaxArraySize (for
    the initial submission, each followed by the plan's automatic retry arrays), after checking that they fit
    in the scheduler's limits (``ddslurm.planner.plan_submission``). The jobs get exactly the environment built
    here, never the user's login environment: the exported names and a minimal allow-list (``Slurm.sbatch``:
    ``--export=ALL`` from that environment). The initial submission writes its plan first (``submit-plan.json``).
    Returns the array ids."""
    check_environment(plan, env)
    with refusals():
        planned = plan_submission(
            plan, layout, shards, read_limits(slurm, plan), kind=kind, stamp=new_stamp(now), gpu_done=gpu_done
        )
    with submit_lock(layout):
        if kind == "initial" and not publish_once(layout.submit_plan, encode_pretty(planned.record(now))):
            raise LauncherError(f"run {layout.run_id} was submitted already ({layout.submit_plan} exists)")
        return submit_arrays(layout, plan, planned.arrays, slurm, env, now, planned=kind == "initial")


def exported_names(plan: Plan) -> tuple[str, ...]:
    """The variables a generation job gets from the submitting shell, by name (values never written anywhere):
    the hosted providers' API keys (for the client step) and ``server.env_from`` (for the server steps)."""
    return tuple(sorted({*plan.secret_env, *plan.server_secret_env}))


def job_variables(plan: Plan) -> tuple[str, ...]:
    """Every variable of the submitting environment a generation job gets besides ``_slurm.NODE_ENV_ALLOWED``
    (which has no ``HOME``: a container runtime that needs settings finds them in the cluster's configuration,
    or in ``server.env``)."""
    return exported_names(plan)


def _sbatch(
    layout: RunLayout,
    plan: Plan,
    array: PlannedArray,
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime,
    *,
    after_failure_of: tuple[str, ...] = (),
    after_any: tuple[str, ...] = (),
    planned: bool,
) -> str:
    """``after_failure_of``: an automatic retry's chain (the array it follows first, then every earlier level)."""
    shards = list(array.shards)
    script = render_generation(
        plan,
        layout,
        shards,
        after_failure_of=after_failure_of,
        tasks=array.tasks,
        stage=array.stage,
        after_any=after_any,
    )
    script_path = Path(array.script)
    atomic_write(script_path, script.encode(), mode=0o700)
    if not layout.script.exists():
        atomic_write(layout.script, script.encode(), mode=0o700)
    job_id = slurm.sbatch(str(script_path), export=job_variables(plan), env=env)
    record = SubmissionRecord(
        array_job_id=job_id,
        shards=array.shards,
        tasks=array.tasks,
        submitted_at=now.isoformat(),
        script=str(script_path),
        kind=array.kind,
        after=after_failure_of[0] if after_failure_of else None,
        plan_index=array.index if planned else None,
        stage=array.stage,
        after_any=after_any,
    )
    try:
        published = publish_once(layout.submissions / f"{job_id}.json", encode(record))
    except OSError as exc:
        raise _Unrecorded(f"array job {job_id} was submitted but its record could not be written: {exc}") from exc
    if not published:
        raise _Unrecorded(f"job {job_id} was submitted but {layout.submissions} already records that id")
    return job_id
