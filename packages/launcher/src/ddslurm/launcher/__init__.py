"""ddslurm.launcher: the ``ddslurm`` CLI, and the operations behind its commands as a library.

Every command of ``ddslurm`` (``ddslurm.launcher.cli``) reads its options, calls one of the functions below and
renders what it returns (``--json`` or text); a program gets the same operations, the same typed results and the
same errors (:class:`LauncherError` and its subclasses) without the command line:

- ``init``: :func:`init_command` (:class:`InitResult`); ``submit``: :func:`submit` (:class:`Submitted`),
  ``submit --dry-run``: :func:`dry_run` (:class:`DryRun`), ``submit --continue``: :func:`continue_submission`;
- finding runs: :func:`open_run` (a directory, or a run id with the profile), :func:`list_runs` (``list``);
- ``status``: :func:`run_status`, ``status --watch``: :func:`follow_run`; ``wait``: :func:`wait_for_run`, then
  :func:`release`;
- steering: :func:`cancel`, :func:`retry` (also ``retry --dry-run``), :func:`accept_partial`;
- ``collect``: :func:`collect_local`, :func:`collect_with_slurm`.
"""

from ddslurm.launcher._cluster import ClusterInfo, parse_sinfo, read_cluster
from ddslurm.launcher._collect import collect_local, collect_with_slurm, wait_for_job
from ddslurm.launcher._doctor import DoctorReport, doctor
from ddslurm.launcher._doctor_checks import Check
from ddslurm.launcher._dry_run import DryRun, dry_run
from ddslurm.launcher._facts import Recorded, record_facts
from ddslurm.launcher._follow import Released, SchedulerBusy, WaitTimeout, follow_run, release, wait_for_run
from ddslurm.launcher._init import InitResult, init_command, render_init
from ddslurm.launcher._recipe import LoadedRecipe, load_run_recipe
from ddslurm.launcher._render import render_collection, render_generation
from ddslurm.launcher._run_dir import Prepared, write_run_dir
from ddslurm.launcher._run_records import find_run
from ddslurm.launcher._runs import ListedRun, list_runs, open_run, resolve_profile, workspace_of
from ddslurm.launcher._slurm import (
    Completed,
    Runner,
    Slurm,
    SlurmTimeoutError,
    TaskState,
    parse_job_key,
    subprocess_runner,
)
from ddslurm.launcher._status import RunStatus, ShardStatus, StageProgress, run_state, run_status
from ddslurm.launcher._steer import (
    Accepted,
    AcceptedShard,
    Cancelled,
    Continued,
    Retried,
    accept_partial,
    cancel,
    continue_submission,
    retry,
)
from ddslurm.launcher._submit import (
    PartialSubmitError,
    Submitted,
    prepare,
    submit,
    submit_shards,
)
from ddslurm.launcher.errors import (
    BuilderError,
    InitError,
    LauncherError,
    RunNotFoundError,
    SlurmError,
    SubmitError,
    UsageError,
    WriteError,
)

__all__ = [
    "Recorded",
    "record_facts",
    "Accepted",
    "AcceptedShard",
    "Cancelled",
    "Check",
    "ClusterInfo",
    "Completed",
    "Continued",
    "DoctorReport",
    "DryRun",
    "InitError",
    "InitResult",
    "LauncherError",
    "ListedRun",
    "LoadedRecipe",
    "PartialSubmitError",
    "Prepared",
    "BuilderError",
    "Released",
    "Retried",
    "RunNotFoundError",
    "RunStatus",
    "Runner",
    "SchedulerBusy",
    "ShardStatus",
    "Slurm",
    "SlurmError",
    "SlurmTimeoutError",
    "StageProgress",
    "SubmitError",
    "Submitted",
    "TaskState",
    "UsageError",
    "WaitTimeout",
    "WriteError",
    "accept_partial",
    "cancel",
    "collect_local",
    "collect_with_slurm",
    "continue_submission",
    "doctor",
    "dry_run",
    "find_run",
    "follow_run",
    "init_command",
    "list_runs",
    "load_run_recipe",
    "open_run",
    "parse_job_key",
    "parse_sinfo",
    "prepare",
    "read_cluster",
    "release",
    "render_collection",
    "render_generation",
    "render_init",
    "resolve_profile",
    "retry",
    "run_state",
    "run_status",
    "submit",
    "submit_shards",
    "subprocess_runner",
    "wait_for_job",
    "wait_for_run",
    "workspace_of",
    "write_run_dir",
]
