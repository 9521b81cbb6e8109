"""Data Designer's own check of a recipe, on the submit host, before anything is written or submitted.

A recipe that Data Designer refuses (a Jinja reference to a column that does not exist, a column config it
cannot read, a column type no plugin provides) would otherwise fail on the node after the allocation started.
The check runs in the profile's ``python_env``, the Data Designer, plugins and packages the nodes run
(``<python_env>/bin/ddslurm-runtime inspect``, :mod:`ddslurm.runtime._inspect`), never in the submitting process:
Data Designer reads its home directory and telemetry settings at import time and writes default settings files
into its home when constructed, so it gets a scratch home, telemetry off and the Hugging Face hub offline. It gets
the recipe with the snapshot's model configs (as the node will run it), providers without endpoints or keys
(validation sends no request), the builder script's record (whose ``rebuild`` columns it takes from the script,
as the node does) and the recipe's directory as its working directory (relative seed paths). Running the script
again, it starts from the environment its first run had (``_recipe.script_environment``: none of the shell's
secrets); what it prints or raises reaches the submit's error only after ``submit`` redacts every secret value.

Its answer also carries what the planner needs from Data Designer: the columns as it reads them and the plugins
the recipe uses (the plan records their distributions and versions; each node checks it has the same), and that
Data Designer's version (the plan records it; each node refuses another). The same
request carries the run file's ``run_config``: Data Designer's ``RunConfig`` there judges its fields (their names,
types and ranges are its own, version by version) and the recipe is validated with them applied, as on the node.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import (
    CheckProvider,
    CheckRequest,
    PluginRecord,
    ProviderSnapshot,
    RecipeColumn,
    RecipeSource,
    RunConfigProblem,
    ServingPlan,
    UnknownType,
    recipe_section,
    recipe_with_models,
)
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._process import Stopped
from ddslurm.launcher.errors import InspectAnswerError
from ddslurm.launcher.submission._recipe import script_environment, secret_names
from ddslurm.providers.discovery import settings_dir
from ddslurm.runtime import PLUGIN_GROUP, engine_environment

VALIDATE_TIMEOUT_S = 300
_ACCEPTED: dict[bytes, RecipeCheck] = {}


@dataclass(frozen=True, slots=True)
class RecipeCheck:
    """What the check found: Data Designer's refusals (one line each, its own words), the columns as it reads them
    (None when it refuses them) and the plugins the recipe uses."""

    problems: tuple[str, ...] = ()
    columns: tuple[RecipeColumn, ...] | None = None
    plugins: tuple[PluginRecord, ...] = ()
    data_designer_version: str = ""
    """The version of that Data Designer, which the plan records ("" when the check did not say)."""
    run_config: tuple[RunConfigProblem, ...] = ()
    """What Data Designer's ``RunConfig`` refuses in the run file's ``run_config``, one field each."""


def dd_check_recipe(
    recipe: Mapping[str, Any],
    recipe_path: Path,
    snapshot: ProviderSnapshot,
    serving: ServingPlan | None,
    runtime: Path,
    source: RecipeSource | None,
    *,
    host: EngineHost = RUNTIME_PROCESS,
    env: Mapping[str, str] | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> RecipeCheck:
    """Check ``recipe`` with ``runtime`` (``<python_env>/bin/ddslurm-runtime``, asked through ``host``) as the node
    will build it; ``serving``: the plan's deployments as a client sees them, which size the local aliases'
    ``max_parallel_requests`` as on the node. ``env``: the environment the check starts from, which a builder script
    it runs again sees (``script_environment`` of the submitting shell, as the script's first run had); by default
    this process's environment, scrubbed the same way. ``run_config``: the run file's, judged by Data Designer's
    ``RunConfig`` there and applied to the recipe's validation."""
    request = CheckRequest(
        recipe=recipe_with_models(recipe, snapshot, serving),  # the recipe exactly as the node builds it
        providers=tuple(CheckProvider(name=p.name, provider_type=p.provider_type) for p in snapshot.providers),
        scratch="",  # each check's own, made when it is asked
        source=source,
        run_config=dict(run_config) if run_config else None,
    )
    # An accepted recipe without a seed dataset (whose files may change) is accepted again without asking.
    seeded = bool(recipe_section(request.recipe).get("seed_config"))
    key = None if seeded or source is not None else msgspec.json.encode([str(runtime), request], order="sorted")
    if key is not None and key in _ACCEPTED:
        return _ACCEPTED[key]
    if env is None:
        hidden = secret_names(None, os.environ, settings_dir(os.environ)) | set(snapshot.secret_env_names())
        env = script_environment(os.environ, hidden)
    check = _run_check(host, runtime, request, recipe_path.parent, env)
    if key is not None and not check.problems and not check.run_config:
        _ACCEPTED[key] = check
    return check


def _submit_host_plugins() -> dict[str, str]:
    """The plugins installed beside the submitting ddslurm, by entry-point name: ``distribution version``."""
    found = {}
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        if ep.dist is not None:
            found[ep.name] = f"{ep.dist.name} {ep.dist.version}"
    return found


def _unknown_lines(unknown: tuple[UnknownType, ...], python_env: Path) -> list[str]:
    here = _submit_host_plugins()
    lines = []
    for u in unknown:
        line = (
            f"{u.where}: {u.field} {u.type!r} is neither built into the Data Designer of python_env "
            f"({python_env}) nor provided by a plugin installed there"
        )
        if u.type in here:
            dist, version = here[u.type].split(" ", 1)
            line += f"; the submit host has it from {dist} {version}: install {dist}=={version} in python_env"
        lines.append(line)
    return lines


def _run_check(
    host: EngineHost, runtime: Path, request: CheckRequest, cwd: Path, base: Mapping[str, str]
) -> RecipeCheck:
    with tempfile.TemporaryDirectory(prefix="ddslurm-validate-") as scratch:
        env = {k: v for k, v in base.items() if not k.startswith("DATA_DESIGNER_")}
        try:
            answer = host.ask(
                runtime,
                msgspec.structs.replace(request, scratch=scratch),
                timeout_s=VALIDATE_TIMEOUT_S,
                env=env | engine_environment(Path(scratch)),
                cwd=cwd,
            ).answer
        except Stopped:
            return RecipeCheck(problems=(f"Data Designer's validation did not finish within {VALIDATE_TIMEOUT_S} s",))
        except OSError as exc:
            return RecipeCheck(problems=(f"cannot run {runtime} (the profile's python_env): {exc}",))
        except InspectAnswerError as exc:
            if exc.answered:
                return RecipeCheck(problems=(str(exc),))
            problem = f"Data Designer's validation could not run (exit code {exc.returncode}):\n{exc.tail()}"
            return RecipeCheck(problems=(problem,))
    problems = _unknown_lines(answer.unknown, runtime.parent.parent) if answer.unknown else list(answer.problems)
    return RecipeCheck(
        problems=tuple(problems),
        columns=answer.columns,
        plugins=answer.plugins,
        data_designer_version=answer.data_designer or "",
        run_config=answer.run_config,
    )
