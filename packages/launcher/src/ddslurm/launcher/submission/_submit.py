"""Submission: capture inputs, compile the plan, check the scheduler's limits, write the run directory, sbatch
the arrays.

Everything that can be wrong with the inputs, and whether the arrays fit in the scheduler's limits, is checked
before the run directory is created, so a refused submission changes nothing on disk. The arrays are written
(``submit-plan.json``) before the first sbatch and each is recorded as it is submitted, so a submission that
stops part-way is an explicit state of the run (``ddslurm submit --continue`` finishes it).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ddslurm.config import (
    Plan,
    PlannedArray,
    RunLayout,
    encode_pretty,
    publish_once,
)
from ddslurm.launcher.cluster._doctor_checks import check_jobs, check_profile_first
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import LauncherError, OverrunError, SubmitError, WriteError
from ddslurm.launcher.submission._aliases import EndpointCheck
from ddslurm.launcher.submission._arrays import (
    PartialSubmitError,
    check_environment,
    first_script,
    new_stamp,
    read_limits,
    refusals,
    secret_warnings,
    submit_arrays,
    submit_lock,
)
from ddslurm.launcher.submission._inputs import read_inputs
from ddslurm.launcher.submission._prepare import prepare_on_cluster
from ddslurm.launcher.submission._recipe import StageRequest
from ddslurm.launcher.submission._run_dir import NOTHING_LEFT, write_run_dir
from ddslurm.planner import (
    overruns,
    plan_submission,
    plan_warnings,
)
from ddslurm.providers import (
    AliasRow,
)


@dataclass(frozen=True, slots=True)
class Submitted:
    layout: RunLayout
    plan: Plan
    job_id: str
    aliases: tuple[AliasRow, ...]
    job_ids: tuple[str, ...] = ()
    arrays: tuple[PlannedArray, ...] = ()
    warnings: tuple[str, ...] = ()


def submit(
    run_path: Path,
    profile_path: Path,
    *,
    slurm: Slurm,
    env: Mapping[str, str],
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    home: Path | None = None,
    check_endpoints: EndpointCheck | None = None,
    calibration: bool = False,
    host: EngineHost = RUNTIME_PROCESS,
    stage: StageRequest | None = None,
    accept_overrun: bool = False,
) -> Submitted:
    """Validate and compile, read the scheduler's limits and plan the arrays within them (refusing, with the
    numbers, what does not fit), all before anything is written; then write the run directory and the
    submission plan, and submit the arrays. A failure before the first array was submitted removes the run
    directory again; a later one (or a timeout) raises :class:`PartialSubmitError` and leaves an incomplete run.
    The stages, each once: the run file and profile read (:func:`read_inputs`), the profile checked against the
    cluster, the inputs validated and the plan compiled (:func:`prepare_on_cluster`), the arrays planned within the
    scheduler's limits and the jobs checked, the run directory written, the arrays submitted.
    ``check_endpoints``: ask the hosted endpoints first (``--check-endpoints``); ``calibration``: ``ddslurm
    tune``'s run, planned with its calibration levels; ``host``: how the profile's ``python_env`` is asked about
    Data Designer (:mod:`ddslurm.launcher.cluster._engine_host`); ``stage``: a later stage of a Data Designer
    workflow (``ddslurm workflow``); ``accept_overrun``: submit a run the plan's prediction says will not fit its
    time limit (:func:`ddslurm.planner.overruns`), which is otherwise refused (:class:`OverrunError`) after every
    other check and before anything is written."""
    now = clock()
    inputs = read_inputs(run_path, profile_path)
    checked = check_profile_first(inputs, slurm, env, host)
    prepared = prepare_on_cluster(
        inputs,
        slurm,
        env,
        now,
        home,
        host=host,
        check_endpoints=check_endpoints,
        stage=stage,
        calibration=calibration,
    )
    layout, plan = prepared.layout, prepared.plan
    check_environment(plan, env)
    with refusals():
        planned = plan_submission(
            plan, layout, [s.index for s in plan.shards], read_limits(slurm, plan), stamp=new_stamp(now)
        )
    check_jobs(checked, plan, first_script(plan, layout, planned))
    if not accept_overrun and (found := overruns(plan)):
        raise OverrunError(found)
    write_run_dir(prepared)
    try:
        with submit_lock(layout):
            publish_once(layout.submit_plan, encode_pretty(planned.record(now)))
            job_ids = submit_arrays(layout, plan, planned.arrays, slurm, env, now)
    except PartialSubmitError as exc:
        if exc.submitted or exc.maybe_submitted:
            raise
        shutil.rmtree(layout.root, ignore_errors=True)  # nothing reached Slurm: leave nothing behind
        if isinstance(exc.cause, LauncherError):
            raise exc.cause from None
        if isinstance(exc.cause, OSError):
            raise WriteError(f"the batch script of run {layout.run_id}", exc.cause, NOTHING_LEFT) from exc.cause
        raise SubmitError(f"nothing was submitted: {exc.cause}") from exc.cause
    except OSError as exc:  # the submit lock or the submission plan, before any sbatch
        shutil.rmtree(layout.root, ignore_errors=True)
        raise WriteError(f"the submission plan of run {layout.run_id}", exc, NOTHING_LEFT) from exc
    warnings = (*prepared.warnings, *plan_warnings(plan), *secret_warnings(slurm, plan))
    return Submitted(layout, plan, job_ids[0], prepared.aliases, tuple(job_ids), planned.arrays, warnings)
