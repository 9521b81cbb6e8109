"""Batch scripts rendered from a plan. They hold paths and resource requests, never a secret value."""

from __future__ import annotations

import shlex
from pathlib import Path

from ddslurm.config import Plan, Resources, RunLayout

TIME_LIMIT_WARNING_S = 90


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


def render_generation(plan: Plan, layout: RunLayout, shards: list[int]) -> str:
    array = ",".join(str(s) for s in shards)
    directives = [
        f"--array={array}",
        f"--output={layout.logs}/slurm-%A_%a.out",
        "--open-mode=append",
        f"--chdir={layout.root}",
        # A warning before the time limit, so the runtime stops its steps and records why it ended.
        f"--signal=B:USR1@{TIME_LIMIT_WARNING_S}",
        *_directives(plan.generation),
    ]
    runtime = shlex.quote(tool(plan, "ddslurm-runtime"))
    return (
        f"{_header(f'ddslurm-{plan.run_name}', directives)}\n\n{_PRELUDE}\n\n"
        f"exec {runtime} generate --run-dir {shlex.quote(str(layout.root))}\n"
    )


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
