"""Batch scripts rendered from a plan. They hold paths and resource requests, never a secret value.

A ``#SBATCH`` line cannot be quoted the way a shell line can: sbatch splits it at whitespace, reads quotes,
backslashes and ``#`` in it, and a newline ends it (what follows runs as a shell command). The config package
refuses such values where the run file or profile gives them; the renderer refuses them again (a plan written by
an older version, a value built elsewhere), and quotes every value it puts into a shell line.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ddslurm.config import BATCH_OUTPUT_PATTERN, Plan, Resources, RunLayout, compact_ranges, digest
from ddslurm.launcher.errors import SubmitError
from ddslurm.planner import array_spec

TIME_LIMIT_WARNING_S = 90
SLURM_SIGNAL_SLACK_S = 60


def _directives(res: Resources) -> list[str]:
    """The job's resource lines. Several nodes: one task a node (``--ntasks-per-node=1``), so that
    ``--cpus-per-task``, ``--mem`` and the GPUs are what each node gets (``--gpus-per-node`` in ``gpus`` mode, as
    ``--gres`` is per node anyway)."""
    tasks = "--ntasks=1" if res.nodes == 1 else "--ntasks-per-node=1"
    lines = [f"--time={res.time_minutes}", f"--nodes={res.nodes}", tasks, f"--cpus-per-task={res.cpus_per_task}"]
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
        lines.append(f"--gpus={res.gpus}" if res.nodes == 1 else f"--gpus-per-node={res.gpus}")
    lines.extend(res.extra_sbatch)
    return lines


_SBATCH_SPECIAL = frozenset("'\"\\#")


def _directive(text: str) -> str:
    """``text`` as one ``#SBATCH`` line's option, or SubmitError when sbatch would read it as something else."""
    bad = next((ch for ch in text if ch.isspace() or not ch.isprintable() or ch in _SBATCH_SPECIAL), None)
    if bad is not None:
        raise SubmitError(
            f"cannot write {text!r} as one #SBATCH option: it has {bad!r} (sbatch would read whitespace, quotes, "
            "backslashes and '#' in it, and a newline would end the line)"
        )
    return f"#SBATCH {text}"


def _log_dir(layout: RunLayout) -> str:
    """The run's logs directory for ``--output``, where sbatch would expand a ``%`` of its own."""
    logs = str(layout.logs)
    if "%" in logs:
        raise SubmitError(f"cannot write {logs!r} into an #SBATCH --output line: sbatch expands its '%'")
    return logs


def _header(job_name: str, directives: list[str]) -> str:
    out = ["#!/bin/bash", _directive(f"--job-name={job_name}")]
    out.extend(_directive(d) for d in directives)
    return "\n".join(out)


_PRELUDE = """set -euo pipefail
# sbatch --export=<names> is inherited by every srun step through SLURM_EXPORT_ENV; undo that here.
unset SLURM_EXPORT_ENV
export PYTHONNOUSERSITE=1
umask 077"""


def tool(plan: Plan, name: str) -> str:
    return str(Path(plan.python_env) / "bin" / name)


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
        f"--output={_log_dir(layout)}/{BATCH_OUTPUT_PATTERN}",
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
    name = f"ddslurm-{plan.run_name}" + ("-cpu" if stage == 1 else "")
    header = f"{_header(name, directives)}\n\n{_PRELUDE}\n\n"
    staged = [] if stage is None else ["--stage", str(int(stage))]
    # The plan's digest: Slurm keeps its own copy of this script, so a run directory swapped while the job is
    # queued (another plan in its place) is refused by the job instead of receiving the run's secrets.
    runtime = tool(plan, "ddslurm-runtime")
    command = shlex.join(["exec", runtime, "generate", "--run-dir", str(layout.root), "--plan-sha256", digest(plan)])
    if tasks is not None:
        return f"{header}{command} {shlex.join(['--pool', compact_ranges(shards), *staged])}\n"
    # The one unquoted word: shell arithmetic on SLURM_ARRAY_TASK_ID, made of whole numbers only.
    expr = shard_expression(shards)
    table = "" if "SHARDS" not in expr else "SHARDS=(" + " ".join(str(int(s)) for s in shards) + ")\n"
    stage_words = f" {shlex.join(staged)}" if staged else ""
    return f'{header}{table}{command} --shard "{expr}"{stage_words}\n'


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
        f"--output={_log_dir(layout)}/collect-%j.out",
        f"--chdir={layout.root}",
        *_directives(plan.collection),
    ]
    command = [
        "exec",
        tool(plan, "ddslurm-collect"),
        str(layout.root),
        "--json",
        *(["--overwrite"] if overwrite else []),
    ]
    return f"{_header(f'ddslurm-collect-{plan.run_name}', directives)}\n\n{_PRELUDE}\n\n{shlex.join(command)}\n"
