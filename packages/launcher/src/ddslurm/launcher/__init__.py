"""ddslurm.launcher: the ``ddslurm`` CLI: renders batch scripts, submits, status, wait, cancel, collect."""

from ddslurm.launcher._collect import collect_local, collect_with_slurm, wait_for_job
from ddslurm.launcher._init import ClusterInfo, InitResult, init_command, parse_sinfo, read_cluster, render_init
from ddslurm.launcher._recipe import LoadedRecipe, load_run_recipe
from ddslurm.launcher._render import render_collection, render_generation
from ddslurm.launcher._slurm import (
    Completed,
    Runner,
    SchedulerLimits,
    Slurm,
    SlurmTimeoutError,
    TaskState,
    parse_job_key,
    subprocess_runner,
)
from ddslurm.launcher._status import RunStatus, ShardStatus, find_run, run_state, run_status
from ddslurm.launcher._steer import continue_submission
from ddslurm.launcher._submit import (
    PartialSubmitError,
    Prepared,
    Submitted,
    plan_submission,
    prepare,
    submit,
    submit_shards,
    write_run_dir,
)
from ddslurm.launcher.errors import InitError, LauncherError, RecipeError, RunNotFoundError, SlurmError, SubmitError

__all__ = [
    "ClusterInfo",
    "Completed",
    "InitError",
    "InitResult",
    "LauncherError",
    "LoadedRecipe",
    "PartialSubmitError",
    "Prepared",
    "RecipeError",
    "RunNotFoundError",
    "RunStatus",
    "Runner",
    "SchedulerLimits",
    "ShardStatus",
    "Slurm",
    "SlurmError",
    "SlurmTimeoutError",
    "SubmitError",
    "Submitted",
    "TaskState",
    "collect_local",
    "collect_with_slurm",
    "continue_submission",
    "find_run",
    "init_command",
    "load_run_recipe",
    "parse_job_key",
    "parse_sinfo",
    "plan_submission",
    "prepare",
    "read_cluster",
    "render_collection",
    "render_generation",
    "render_init",
    "run_state",
    "run_status",
    "submit",
    "submit_shards",
    "subprocess_runner",
    "wait_for_job",
    "write_run_dir",
]
