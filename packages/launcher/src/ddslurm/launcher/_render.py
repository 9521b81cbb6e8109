"""Batch scripts rendered from a plan. They hold paths and resource requests, never a secret value."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ddslurm.config import Plan, Resources, RunLayout, compact_ranges

TIME_LIMIT_WARNING_S = 90
SLURM_SIGNAL_SLACK_S = 60


def _directives(res: Resources) -> list[str]:
    lines = [f"--time={res.time_minutes}", f"--nodes={res.nodes}", "--ntasks=1", f"--cpus-per-task={res.cpus_per_task}"]
    for flag, value in (
        ("partition", res.partition),
        ("account", res.account),
        ("qos", res.qos),
        ("mem", res.memory),
        ("constraint", res.constraint),
        ("reservation", res.reservation),
    ):
        if value:
            lines.append(f"--{flag}={value}")
    lines.append(f"--gres={res.gres}")
    if res.gpus:
        lines.append(f"--gpus={res.gpus}")
    lines.extend(res.extra_sbatch)
    return lines


def _header(job_name: str, directives: list[str]) -> str:
    out = ["#!/bin/bash", f"#SBATCH --job-name={job_name}"]
    out.extend(f"#SBATCH {d}" for d in directives)
    return "\n".join(out)


_PRELUDE = """set -euo pipefail
# sbatch --export=<names> is inherited by every srun step through SLURM_EXPORT_ENV; undo that here.
unset SLURM_EXPORT_ENV
export PYTHONNOUSERSITE=1
umask 077"""


def tool(plan: Plan, name: str) -> str:
    return str(Path(plan.python_env) / "bin" / name)


def array_spec(count: int, throttle: int | None) -> str:
    """The ``--array=`` spec of an array of ``count`` tasks (ids 0 to count-1), ``%throttle`` appended."""
    spec = f"0-{count - 1}" if count > 1 else "0"
    return f"{spec}%{throttle}" if throttle else spec


def shard_expression(shards: list[int]) -> str:
    """Shell text that maps SLURM_ARRAY_TASK_ID to a shard index (a range, or a list for retries)."""
    if shards == list(range(shards[0], shards[0] + len(shards))):
        return f"$(({shards[0]} + SLURM_ARRAY_TASK_ID))" if shards[0] else "$SLURM_ARRAY_TASK_ID"
    return "${SHARDS[$SLURM_ARRAY_TASK_ID]}"


def render_generation(
    plan: Plan,
    layout: RunLayout,
    shards: list[int],
    *,
    after_failure_of: str | Sequence[str] | None = None,
    tasks: int | None = None,
    stage: int | None = None,
    after_any: Sequence[str] = (),
) -> str:
    """One array over ``shards`` (task i runs shards[i]), or, with ``tasks``, an array of that many allocations
    that pull shards of ``shards`` (the pool) until none is left; ``after_failure_of``: an automatic retry array
    that starts only if every one of those arrays (the one it follows and every earlier level of its chain) had a
    failed task, and is cancelled by Slurm otherwise. ``stage``: a two-stage
    run's GPU stage (0) or CPU stage (1: CPU-only allocations, ``plan.cpu_stage``, that pull shards whose GPU
    stage is done); ``after_any``: the arrays the CPU stage starts after, however they ended."""
    resources = plan.cpu_stage if stage == 1 and plan.cpu_stage is not None else plan.generation
    directives = [
        f"--array={array_spec(len(shards) if tasks is None else tasks, plan.max_concurrent)}",
        f"--output={layout.logs}/slurm-%A_%a.out",
        "--open-mode=append",
        f"--chdir={layout.root}",
        # A warning before the time limit, so the runtime stops its steps and records why it ended.
        f"--signal=B:USR1@{warning_seconds(resources.time_minutes)}",
        *_directives(resources),
    ]
    failures = (after_failure_of,) if isinstance(after_failure_of, str) else tuple(after_failure_of or ())
    if failures:
        # afternotok:A:B holds only when A and B both failed: a level that never ran (cancelled by Slurm because
        # the level before it succeeded) is not taken for a failure, since its predecessor did not fail either.
        directives += [f"--dependency=afternotok:{':'.join(failures)}", "--kill-on-invalid-dep=yes"]
    elif after_any:
        directives += [f"--dependency=afterany:{':'.join(after_any)}", "--kill-on-invalid-dep=yes"]
    runtime = shlex.quote(tool(plan, "ddslurm-runtime"))
    name = f"ddslurm-{plan.run_name}" + ("-cpu" if stage == 1 else "")
    header = f"{_header(name, directives)}\n\n{_PRELUDE}\n\n"
    staged = "" if stage is None else f" --stage {stage}"
    run_dir = shlex.quote(str(layout.root))
    if tasks is not None:
        pool = compact_ranges(shards)
        return f"{header}exec {runtime} generate --run-dir {run_dir} --pool {pool}{staged}\n"
    expr = shard_expression(shards)
    table = "" if "SHARDS" not in expr else "SHARDS=(" + " ".join(str(s) for s in shards) + ")\n"
    return f'{header}{table}exec {runtime} generate --run-dir {run_dir} --shard "{expr}"{staged}\n'


def warning_seconds(time_minutes: int) -> int:
    """How long before the time limit the runtime is warned: 90 s, less for short limits.

    Slurm may send the warning up to a minute earlier than asked, so a short limit gets a quarter of what is
    left after that minute (at least 10 s): 2 minutes → 15 s, so the warning comes 45 s in at the earliest.
    ``submission.time_limit`` below 2 minutes is refused at submit.
    """
    usable = time_minutes * 60 - SLURM_SIGNAL_SLACK_S
    return max(10, min(TIME_LIMIT_WARNING_S, usable // 4))


def render_collection(plan: Plan, layout: RunLayout, *, overwrite: bool) -> str:
    directives = [
        f"--output={layout.logs}/collect-%j.out",
        f"--chdir={layout.root}",
        *_directives(plan.collection),
    ]
    collect = shlex.quote(tool(plan, "ddslurm-collect"))
    flags = " --overwrite" if overwrite else ""
    return (
        f"{_header(f'ddslurm-collect-{plan.run_name}', directives)}\n\n{_PRELUDE}\n\n"
        f"exec {collect} {shlex.quote(str(layout.root))} --json{flags}\n"
    )
