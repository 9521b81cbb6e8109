"""ddslurm.launcher: the ``ddslurm`` CLI, its Python API, and the operations behind both.

A program uses :mod:`ddslurm.launcher.api` (``docs/python-api.md``): its :class:`~ddslurm.launcher.api.Client`
submits, follows, steers and collects runs with typed results, and its names and their fields are what ddslurm
keeps stable (a test pins them). The commands of ``ddslurm`` (``ddslurm.launcher.cli``) read their options, call
that client (or, for what the API does not offer, one of the functions below) and render what it returns.

The names below are the launcher's operations as the API and the commands call them; they are internal (they may
change with any release): ``init``: :func:`init_command`; ``submit``: :func:`submit`, its dry run :func:`dry_run`,
``submit --continue``: :func:`continue_submission`; finding runs: :func:`open_run`, :func:`list_runs`; ``status``:
:func:`run_status`, :func:`follow_run`; ``wait``: :func:`wait_for_run`, :func:`release`; steering: :func:`cancel`,
:func:`retry`, :func:`accept_partial`; ``collect``: :func:`collect_run` (by a Slurm job or in this process),
:func:`collect_local` (the collector's merge, in this process, without the run's checks).

They are imported when first used (as ``ddslurm.runtime`` and Data Designer's own packages do):
``import ddslurm.launcher`` (and so every ``ddslurm`` command) loads none of them, and a command pays only for the
modules its work needs (``status`` never loads the planner, ``ddslurm.collector`` and pyarrow only where it
verifies a winner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddslurm.config import lazy_exports

if TYPE_CHECKING:
    from ddslurm.launcher._cluster import ClusterInfo, parse_sinfo, read_cluster
    from ddslurm.launcher._collect import collect_local, collect_run, wait_for_job
    from ddslurm.launcher._doctor import DoctorReport, doctor
    from ddslurm.launcher._doctor_checks import Check
    from ddslurm.launcher._dry_run import DryRun, dry_run
    from ddslurm.launcher._facts import Recorded, record_facts
    from ddslurm.launcher._follow import Released, SchedulerBusy, WaitTimeout, follow_run, release, wait_for_run
    from ddslurm.launcher._init import InitResult, init_command
    from ddslurm.launcher._init_render import render_init
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
    from ddslurm.launcher._status import run_state, run_status
    from ddslurm.launcher._status_model import RunStatus, ShardStatus, StageProgress
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
    from ddslurm.launcher._submit import PartialSubmitError, Submitted, prepare, submit, submit_shards
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

_LAZY_IMPORTS: dict[str, str] = {
    "Accepted": "ddslurm.launcher._steer",
    "AcceptedShard": "ddslurm.launcher._steer",
    "BuilderError": "ddslurm.launcher.errors",
    "Cancelled": "ddslurm.launcher._steer",
    "Check": "ddslurm.launcher._doctor_checks",
    "ClusterInfo": "ddslurm.launcher._cluster",
    "Completed": "ddslurm.launcher._slurm",
    "Continued": "ddslurm.launcher._steer",
    "DoctorReport": "ddslurm.launcher._doctor",
    "DryRun": "ddslurm.launcher._dry_run",
    "InitError": "ddslurm.launcher.errors",
    "InitResult": "ddslurm.launcher._init",
    "LauncherError": "ddslurm.launcher.errors",
    "ListedRun": "ddslurm.launcher._runs",
    "LoadedRecipe": "ddslurm.launcher._recipe",
    "PartialSubmitError": "ddslurm.launcher._submit",
    "Prepared": "ddslurm.launcher._run_dir",
    "Recorded": "ddslurm.launcher._facts",
    "Released": "ddslurm.launcher._follow",
    "Retried": "ddslurm.launcher._steer",
    "RunNotFoundError": "ddslurm.launcher.errors",
    "RunStatus": "ddslurm.launcher._status_model",
    "Runner": "ddslurm.launcher._slurm",
    "SchedulerBusy": "ddslurm.launcher._follow",
    "ShardStatus": "ddslurm.launcher._status_model",
    "Slurm": "ddslurm.launcher._slurm",
    "SlurmError": "ddslurm.launcher.errors",
    "SlurmTimeoutError": "ddslurm.launcher._slurm",
    "StageProgress": "ddslurm.launcher._status_model",
    "SubmitError": "ddslurm.launcher.errors",
    "Submitted": "ddslurm.launcher._submit",
    "TaskState": "ddslurm.launcher._slurm",
    "UsageError": "ddslurm.launcher.errors",
    "WaitTimeout": "ddslurm.launcher._follow",
    "WriteError": "ddslurm.launcher.errors",
    "accept_partial": "ddslurm.launcher._steer",
    "cancel": "ddslurm.launcher._steer",
    "collect_local": "ddslurm.launcher._collect",
    "collect_run": "ddslurm.launcher._collect",
    "continue_submission": "ddslurm.launcher._steer",
    "doctor": "ddslurm.launcher._doctor",
    "dry_run": "ddslurm.launcher._dry_run",
    "find_run": "ddslurm.launcher._run_records",
    "follow_run": "ddslurm.launcher._follow",
    "init_command": "ddslurm.launcher._init",
    "list_runs": "ddslurm.launcher._runs",
    "load_run_recipe": "ddslurm.launcher._recipe",
    "open_run": "ddslurm.launcher._runs",
    "parse_job_key": "ddslurm.launcher._slurm",
    "parse_sinfo": "ddslurm.launcher._cluster",
    "prepare": "ddslurm.launcher._submit",
    "read_cluster": "ddslurm.launcher._cluster",
    "record_facts": "ddslurm.launcher._facts",
    "release": "ddslurm.launcher._follow",
    "render_collection": "ddslurm.launcher._render",
    "render_generation": "ddslurm.launcher._render",
    "render_init": "ddslurm.launcher._init_render",
    "resolve_profile": "ddslurm.launcher._runs",
    "retry": "ddslurm.launcher._steer",
    "run_state": "ddslurm.launcher._status",
    "run_status": "ddslurm.launcher._status",
    "submit": "ddslurm.launcher._submit",
    "submit_shards": "ddslurm.launcher._submit",
    "subprocess_runner": "ddslurm.launcher._slurm",
    "wait_for_job": "ddslurm.launcher._collect",
    "wait_for_run": "ddslurm.launcher._follow",
    "workspace_of": "ddslurm.launcher._runs",
    "write_run_dir": "ddslurm.launcher._run_dir",
}
"""Each exported name and the module that defines it."""

__all__ = [
    "Accepted",
    "AcceptedShard",
    "BuilderError",
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
    "Recorded",
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
    "collect_run",
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
    "record_facts",
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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY_IMPORTS, __all__)
