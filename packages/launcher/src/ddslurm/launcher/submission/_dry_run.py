"""``ddslurm submit --dry-run`` without the terminal: everything a submission would do up to its first sbatch,
and nothing written or submitted.

:func:`dry_run` validates and compiles the run as ``submit`` does (``prepare``), reads the scheduler's limits,
plans the arrays exactly as the submission would (``plan_submission``), renders the first array's batch script and
makes the bill; it refuses what ``submit`` would refuse, with the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from ddslurm.config import Plan, ProviderSnapshot, RunLayout, SchedulerLimits
from ddslurm.launcher.cluster._doctor_checks import check_jobs, check_profile_first
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import SlurmError
from ddslurm.launcher.submission._aliases import EndpointCheck
from ddslurm.launcher.submission._arrays import first_script, new_stamp, read_limits, refusals, secret_warnings
from ddslurm.launcher.submission._bill import Bill, make_bill
from ddslurm.launcher.submission._inputs import SubmitInputs, read_inputs
from ddslurm.launcher.submission._prepare import prepare_on_cluster
from ddslurm.launcher.submission._run_dir import Prepared
from ddslurm.planner import SubmissionPlan, plan_submission, plan_warnings

DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's default ``MaxArraySize``: what the arrays assume when the scheduler's limits cannot be read."""


@dataclass(frozen=True, slots=True)
class DryRun:
    """What ``submit`` would do: the compiled run, the arrays it would submit and what they cost."""

    prepared: Prepared
    """The validated inputs and the compiled plan (its ``layout`` is where the run would be written)."""
    planned: SubmissionPlan
    """Every array the submission would make, and the limits they were checked against."""
    script: str
    """The batch script of the first array."""
    bill: Bill
    warnings: tuple[str, ...]
    """A workspace facts file that is not the user's own (ignored), how the run is predicted not to fit its time
    limit (``submit`` refuses it without ``--accept-overrun``: the bill's ``overruns``), what the run file's
    ``buffer_size`` costs, where the cluster would keep the run's secret values beyond the job itself."""

    @property
    def plan(self) -> Plan:
        return self.prepared.plan

    @property
    def layout(self) -> RunLayout:
        return self.prepared.layout


def scheduler_limits(slurm: Slurm, plan: Plan) -> SchedulerLimits:
    """The limits the run's jobs must fit in; without a scheduler to ask, Slurm's default ``MaxArraySize`` and a
    note that nothing else was checked."""
    try:
        return read_limits(slurm, plan)
    except SlurmError as exc:
        note = f"scheduler limits not read ({exc}); arrays assume MaxArraySize {DEFAULT_MAX_ARRAY_SIZE}"
        return SchedulerLimits(DEFAULT_MAX_ARRAY_SIZE, notes=(note,))


def compile_dry_run(
    inputs: SubmitInputs,
    *,
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime | None = None,
    check_endpoints: EndpointCheck | None = None,
    host: EngineHost = RUNTIME_PROCESS,
) -> tuple[Prepared, SubmissionPlan, str]:
    """The run (``inputs``: its run file and profile as read once) validated and compiled as ``submit`` does
    (``check_endpoints`` included), its arrays planned within
    the scheduler's limits, and the first array's batch script; nothing written, and the cluster's checks of the
    profile not run."""
    moment = now or datetime.now(UTC)
    prepared = prepare_on_cluster(inputs, slurm, env, moment, host=host, check_endpoints=check_endpoints)
    plan, layout = prepared.plan, prepared.layout
    limits = scheduler_limits(slurm, plan)
    with refusals():
        planned = plan_submission(plan, layout, [s.index for s in plan.shards], limits, stamp=new_stamp(moment))
    return prepared, planned, first_script(plan, layout, planned)


def dry_run(
    run_file: Path,
    profile: Path,
    *,
    slurm: Slurm,
    env: Mapping[str, str],
    now: datetime | None = None,
    check_endpoints: EndpointCheck | None = None,
    host: EngineHost = RUNTIME_PROCESS,
) -> DryRun:
    """Validate and compile ``run_file`` for the cluster of ``profile``, check the profile and the jobs against the
    cluster (``ddslurm doctor``'s checks, every problem at once), and plan its submission; write nothing, submit
    nothing. Raises what ``submit`` would raise for the same inputs (``check_endpoints`` included)."""
    inputs = read_inputs(run_file, profile)
    checked = check_profile_first(inputs, slurm, env, host)
    prepared, planned, script = compile_dry_run(
        inputs, slurm=slurm, env=env, now=now, check_endpoints=check_endpoints, host=host
    )
    plan = prepared.plan
    check_jobs(checked, plan, script)
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    bill = make_bill(plan, planned.arrays, prepared.aliases, snapshot)
    warnings = (*prepared.warnings, *plan_warnings(plan), *secret_warnings(slurm, plan))
    return DryRun(prepared, planned, script, bill, warnings)
