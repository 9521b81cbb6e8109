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
    from ddslurm.launcher.cluster._cluster import ClusterInfo, parse_sinfo, read_cluster
    from ddslurm.launcher.cluster._doctor import DoctorReport, doctor
    from ddslurm.launcher.cluster._doctor_checks import Check
    from ddslurm.launcher.cluster._slurm import (
        Completed,
        Runner,
        Slurm,
        SlurmTimeoutError,
        TaskState,
        parse_job_key,
        subprocess_runner,
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
    from ddslurm.launcher.facts._workspace import Recorded, record_facts
    from ddslurm.launcher.init._command import InitResult, init_command
    from ddslurm.launcher.init._render import render_init
    from ddslurm.launcher.runs._collect import collect_local, collect_run, wait_for_job
    from ddslurm.launcher.runs._find import ListedRun, list_runs, open_run, resolve_profile, workspace_of
    from ddslurm.launcher.runs._follow import Released, SchedulerBusy, WaitTimeout, follow_run, release, wait_for_run
    from ddslurm.launcher.runs._records import find_run
    from ddslurm.launcher.runs._status import run_state, run_status
    from ddslurm.launcher.runs._status_model import RunStatus, ShardStatus, StageProgress
    from ddslurm.launcher.runs._steer import (
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
    from ddslurm.launcher.submission._arrays import PartialSubmitError, submit_shards
    from ddslurm.launcher.submission._dry_run import DryRun, dry_run
    from ddslurm.launcher.submission._prepare import prepare
    from ddslurm.launcher.submission._recipe import LoadedRecipe, load_run_recipe
    from ddslurm.launcher.submission._render import render_collection, render_generation
    from ddslurm.launcher.submission._run_dir import Prepared, write_run_dir
    from ddslurm.launcher.submission._submit import Submitted, submit

_LAZY_IMPORTS: dict[str, str] = {
    "Accepted": "ddslurm.launcher.runs._steer",
    "AcceptedShard": "ddslurm.launcher.runs._steer",
    "BuilderError": "ddslurm.launcher.errors",
    "Cancelled": "ddslurm.launcher.runs._steer",
    "Check": "ddslurm.launcher.cluster._doctor_checks",
    "ClusterInfo": "ddslurm.launcher.cluster._cluster",
    "Completed": "ddslurm.launcher.cluster._slurm",
    "Continued": "ddslurm.launcher.runs._steer",
    "DoctorReport": "ddslurm.launcher.cluster._doctor",
    "DryRun": "ddslurm.launcher.submission._dry_run",
    "InitError": "ddslurm.launcher.errors",
    "InitResult": "ddslurm.launcher.init._command",
    "LauncherError": "ddslurm.launcher.errors",
    "ListedRun": "ddslurm.launcher.runs._find",
    "LoadedRecipe": "ddslurm.launcher.submission._recipe",
    "PartialSubmitError": "ddslurm.launcher.submission._arrays",
    "Prepared": "ddslurm.launcher.submission._run_dir",
    "Recorded": "ddslurm.launcher.facts._workspace",
    "Released": "ddslurm.launcher.runs._follow",
    "Retried": "ddslurm.launcher.runs._steer",
    "RunNotFoundError": "ddslurm.launcher.errors",
    "RunStatus": "ddslurm.launcher.runs._status_model",
    "Runner": "ddslurm.launcher.cluster._slurm",
    "SchedulerBusy": "ddslurm.launcher.runs._follow",
    "ShardStatus": "ddslurm.launcher.runs._status_model",
    "Slurm": "ddslurm.launcher.cluster._slurm",
    "SlurmError": "ddslurm.launcher.errors",
    "SlurmTimeoutError": "ddslurm.launcher.cluster._slurm",
    "StageProgress": "ddslurm.launcher.runs._status_model",
    "SubmitError": "ddslurm.launcher.errors",
    "Submitted": "ddslurm.launcher.submission._submit",
    "TaskState": "ddslurm.launcher.cluster._slurm",
    "UsageError": "ddslurm.launcher.errors",
    "WaitTimeout": "ddslurm.launcher.runs._follow",
    "WriteError": "ddslurm.launcher.errors",
    "accept_partial": "ddslurm.launcher.runs._steer",
    "cancel": "ddslurm.launcher.runs._steer",
    "collect_local": "ddslurm.launcher.runs._collect",
    "collect_run": "ddslurm.launcher.runs._collect",
    "continue_submission": "ddslurm.launcher.runs._steer",
    "doctor": "ddslurm.launcher.cluster._doctor",
    "dry_run": "ddslurm.launcher.submission._dry_run",
    "find_run": "ddslurm.launcher.runs._records",
    "follow_run": "ddslurm.launcher.runs._follow",
    "init_command": "ddslurm.launcher.init._command",
    "list_runs": "ddslurm.launcher.runs._find",
    "load_run_recipe": "ddslurm.launcher.submission._recipe",
    "open_run": "ddslurm.launcher.runs._find",
    "parse_job_key": "ddslurm.launcher.cluster._slurm",
    "parse_sinfo": "ddslurm.launcher.cluster._cluster",
    "prepare": "ddslurm.launcher.submission._prepare",
    "read_cluster": "ddslurm.launcher.cluster._cluster",
    "record_facts": "ddslurm.launcher.facts._workspace",
    "release": "ddslurm.launcher.runs._follow",
    "render_collection": "ddslurm.launcher.submission._render",
    "render_generation": "ddslurm.launcher.submission._render",
    "render_init": "ddslurm.launcher.init._render",
    "resolve_profile": "ddslurm.launcher.runs._find",
    "retry": "ddslurm.launcher.runs._steer",
    "run_state": "ddslurm.launcher.runs._status",
    "run_status": "ddslurm.launcher.runs._status",
    "submit": "ddslurm.launcher.submission._submit",
    "submit_shards": "ddslurm.launcher.submission._arrays",
    "subprocess_runner": "ddslurm.launcher.cluster._slurm",
    "wait_for_job": "ddslurm.launcher.runs._collect",
    "wait_for_run": "ddslurm.launcher.runs._follow",
    "workspace_of": "ddslurm.launcher.runs._find",
    "write_run_dir": "ddslurm.launcher.submission._run_dir",
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
