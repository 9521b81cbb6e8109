"""ddslurm.launcher: the ``ddslurm`` CLI: renders batch scripts, submits, status, wait, cancel, collect."""

from ddslurm.launcher._collect import collect_local, collect_with_slurm, wait_for_job
from ddslurm.launcher._init import ClusterInfo, InitResult, init_command, parse_sinfo, read_cluster, render_init
from ddslurm.launcher._recipe import LoadedRecipe, load_run_recipe
from ddslurm.launcher._render import render_collection, render_generation
from ddslurm.launcher._run_dir import Prepared, write_run_dir
from ddslurm.launcher._slurm import (
    Completed,
    Runner,
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
    Submitted,
    prepare,
    submit,
    submit_shards,
)
from ddslurm.launcher.errors import BuilderError, InitError, LauncherError, RunNotFoundError, SlurmError, SubmitError

__all__ = [
    "ClusterInfo",
    "Completed",
    "InitError",
    "InitResult",
    "LauncherError",
    "LoadedRecipe",
    "PartialSubmitError",
    "Prepared",
    "BuilderError",
    "RunNotFoundError",
    "RunStatus",
    "Runner",
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
