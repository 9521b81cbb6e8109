"""The commands ``ddslurm init`` prints after writing its files: from the files it wrote to a collected dataset.

Each step is one shell command line and why it is there, in the order a newcomer runs them in one shell
(``--json`` gives the same list). An API key never appears on a command line: on the embedded cluster the shell
makes one up for the stand-in (``export NAME="$(python3 -c ...)"``, the value never in an argument vector), the
stand-in reads it from its environment (``VLLM_API_KEY``); elsewhere ``read -rs`` asks for it without echo or
shell history. Paths are shown relative to the current directory when they are below it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ddslurm.launcher.init._starter import DD_HOME, HOSTED_MODEL, STAND_IN, Starter

RUN_DIR_OF_SUBMIT = """python3 -c 'import json, sys; print(json.load(sys.stdin)["run_dir"])'"""
"""Reads ``submit --json``'s answer and prints the run directory."""
MADE_UP_KEY = """python3 -c 'import secrets; print(secrets.token_hex(16))'"""
STAND_IN_LOG = "stand-in.log"


@dataclass(frozen=True, slots=True)
class Step:
    command: str
    comment: str

    def as_dict(self) -> dict[str, str]:
        return {"command": self.command, "comment": self.comment}


def shown(path: Path, cwd: Path) -> str:
    """``path`` for a command line: relative to ``cwd`` when it is below it, shell-quoted."""
    try:
        return shlex.quote(str(path.relative_to(cwd)))
    except ValueError:
        return shlex.quote(str(path))


def _absolute(path: Path, cwd: Path) -> str:
    """``path`` as an absolute value that survives a later ``cd``: ``"$PWD"/rel`` below ``cwd``."""
    try:
        return f'"$PWD"/{shlex.quote(str(path.relative_to(cwd)))}'
    except ValueError:
        return shlex.quote(str(path))


def next_steps(run_file: Path, profile: Path, starter: Starter | None, *, program: str, cwd: Path) -> list[Step]:
    """The commands after ``init``: ``program`` runs ddslurm (``ddslurm``, or ``uv run ddslurm`` under uv)."""
    run, prof = shown(run_file, cwd), shown(profile, cwd)
    steps: list[Step] = []
    if starter is not None:
        home = run_file.parent / DD_HOME
        hosted = starter.hosted
        key = hosted.api_key_env
        steps.append(
            Step(
                f"export DATA_DESIGNER_HOME={_absolute(home, cwd)}",
                f"Data Designer's provider settings for this run: provider hosted, its key in ${key}",
            )
        )
        if hosted.stand_in:
            runner = program.removesuffix("ddslurm")
            log = shown(run_file.parent / STAND_IN_LOG, cwd)
            where = f"port {hosted.port} (--port)" if hosted.given else "a free port"
            steps += [
                Step(
                    f'export {key}="$({MADE_UP_KEY})"',
                    "a key made up in this shell for the stand-in, never on a command line",
                ),
                Step(
                    f'VLLM_API_KEY="${key}" {runner}{STAND_IN} serve stand-in --host 127.0.0.1 --port {hosted.port} '
                    f"--served-model-name {HOSTED_MODEL} > {log} 2>&1 &",
                    f"the hosted provider: the vLLM stand-in on {where}, requiring the key (stop it: kill %1)",
                ),
            ]
        else:
            steps.append(
                Step(
                    f"read -rsp '{key}: ' {key} && export {key}",
                    "paste your key: not echoed, not on a command line, not in the shell's history",
                )
            )
    steps += [
        Step(
            f"export DDSLURM_PROFILE={_absolute(profile, cwd)}",
            "the cluster profile of the commands below (providers runs a builder script in its python_env)",
        ),
        Step(f"{program} providers {run}", "each model alias, its provider and key variable; exit 1: submit refuses"),
        Step(
            f"{program} submit {run} --profile {prof} --dry-run",
            "the bill: allocations, stages, every step's command line, CPU- and GPU-hours; nothing submitted",
        ),
        Step(
            f"RUN_DIR=$({program} submit {run} --profile {prof} --json | {RUN_DIR_OF_SUBMIT})",
            'submit the run; RUN_DIR is its directory (ddslurm status "$RUN_DIR" shows every shard)',
        ),
        Step(f'{program} wait "$RUN_DIR"', "until the run ends; exit 0 only if it succeeded"),
        Step(f'{program} collect "$RUN_DIR"', "one Parquet dataset: $RUN_DIR/dataset/"),
        Step(f'{program} report "$RUN_DIR"', "$RUN_DIR/report.html: timeline, rates, models, GPU-hours (offline)"),
    ]
    return steps


def todo(run_file: Path, starter: Starter | None, *, program: str, cwd: Path) -> str | None:
    """What to do by hand before the steps, None when nothing."""
    if starter is not None:
        return None
    here = shown(run_file.parent, cwd)
    return (
        f"write the recipe {shown(run_file.parent / 'recipe.yaml', cwd)} (a Data Designer config, as "
        "DataDesignerConfigBuilder.write_config writes it; or a builder script: recipe: build.py in the run file); "
        f"or start from a runnable one: {program} init --example hosted|mixed --dir {here} --force"
    )
