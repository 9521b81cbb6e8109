"""``ddslurm-runtime inspect``: what the submit host asks of the profile's ``python_env`` (the Data Designer, plugins
and packages the nodes run) before anything is written. One JSON request on stdin, one JSON answer on stdout; what
Data Designer or a builder script prints goes to stderr.

``{"action": "build", "script" | "module", "function", "run_dir", "stage", "seed"}``
    call a builder script (:mod:`ddslurm.runtime._builder`): its config as Data Designer writes it; for a builder
    that returns a Data Designer workflow, the config of its stage ``stage`` (from 0, optional) seeded from
    ``seed`` (the stage before's dataset directory) and the workflow's shape (:mod:`ddslurm.runtime._workflow`).
``{"action": "check", "recipe", "providers", "scratch", "source", "run_config"}``
    the recipe exactly as the node builds it (``source``: the plan's ``RecipeSource``, whose ``rebuild`` columns
    come from running the script again, as on the node; ``run_config``: the run file's, optional):
    ``{"problems", "unknown", "columns", "plugins", "run_config"}``: what Data
    Designer refuses (its own validation, sending no request, with the run file's ``run_config`` applied as on the
    node), the types no plugin here provides (then nothing
    else is checked), the columns' facts
    (:class:`ddslurm.config.RecipeColumn`), the plugins used (:class:`ddslurm.config.PluginRecord`) and what Data
    Designer's ``RunConfig`` refuses in ``run_config`` (:class:`ddslurm.config.RunConfigProblem`, one per field).
``{"action": "versions"}``
    ``{"versions": {distribution: version or null}, "plan": {"version", "layout"}}``: :data:`NODE_DISTRIBUTIONS` as
    this environment has them, and the plan format this runtime reads (:data:`ddslurm.config.PLAN_VERSION`,
    :data:`ddslurm.config.LAYOUT_VERSION`). ``ddslurm doctor`` judges them: ddslurm's own and the plan format as
    the submit host's, Data Designer any version ddslurm supports (:data:`ddslurm.config.DATA_DESIGNER_VERSIONS`).
``{"action": "tools", "snapshot", "timeout"}``
    the tools each MCP provider of ``snapshot`` offers, listed by Data Designer's own MCP client with this process's
    environment (:mod:`ddslurm.runtime._mcp_tools`): ``{"tools": {provider: [name, ...]}, "errors": {provider:
    why}}``. The process ends as soon as the answer is written: Data Designer's MCP loop thread and the servers'
    sessions are not waited for.
The ``check`` answer's ``"data_designer"`` is this environment's Data Designer version: the plan records it, and each
node refuses another (:mod:`ddslurm.runtime._dd_version`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import msgspec

from ddslurm.config import LAYOUT_VERSION, PLAN_VERSION, RecipeSource
from ddslurm.runtime._builder import build, rebuilt_columns
from ddslurm.runtime._columns import column_facts
from ddslurm.runtime._dd_version import installed_data_designer, installed_versions
from ddslurm.runtime._mcp_tools import list_tools
from ddslurm.runtime._node_recipe import node_builder
from ddslurm.runtime._plugins import unknown_types, used_plugins
from ddslurm.runtime._run_config import engine_run_config, run_config_problems
from ddslurm.runtime.errors import RecipeError

NODE_DISTRIBUTIONS = ("ddslurm-runtime", "ddslurm-config", "data-designer")
"""What the compute nodes run of ddslurm and Data Designer: ``ddslurm doctor`` wants ddslurm's own at the submit
host's versions (they write and read the plan) and Data Designer at any version ddslurm supports."""


def versions() -> dict[str, Any]:
    """The ``versions`` action (see the module's docstring)."""
    return {
        "versions": installed_versions(NODE_DISTRIBUTIONS),
        "plan": {"version": PLAN_VERSION, "layout": LAYOUT_VERSION},
    }


def _validate(
    builder: Any, providers: list[Mapping[str, Any]], scratch: Path, run_config: Mapping[str, Any] | None = None
) -> list[str]:
    import data_designer.config as dd
    from data_designer.interface import DataDesigner

    from ddslurm.runtime._engine import UNUSED_ENDPOINT, unused_provider, violation_lines, violations_reported

    (scratch / "managed-assets").mkdir(parents=True, exist_ok=True)
    models = [
        dd.ModelProvider(name=p["name"], endpoint=UNUSED_ENDPOINT, provider_type=p["provider_type"], api_key=None)
        for p in providers
    ] or [unused_provider()]
    designer = DataDesigner(
        artifact_path=scratch / "artifacts", model_providers=models, managed_assets_path=scratch / "managed-assets"
    )
    if run_config:  # as the node sets it (the Jinja engine a template is checked with)
        designer.set_run_config(engine_run_config(run_config, otel_metrics_port=None))
    recorded: list[Any] = []
    try:
        with violations_reported(recorded):
            designer.validate(builder)
    except Exception as exc:
        return violation_lines(recorded) or [f"{type(exc).__name__}: {exc}"]
    return []


def check(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The ``check`` action (see the module's docstring)."""
    recipe = payload["recipe"]
    run_config: Mapping[str, Any] = payload.get("run_config") or {}
    refused = [msgspec.to_builtins(p) for p in run_config_problems(run_config)] if run_config else []
    answer: dict[str, Any] = {
        "problems": [],
        "unknown": unknown_types(recipe),
        "columns": None,
        "plugins": [],
        "run_config": refused,
        "data_designer": installed_data_designer(),
    }
    if answer["unknown"]:  # the submit host says which package would provide them
        return answer
    answer["plugins"] = [msgspec.to_builtins(p) for p in used_plugins(recipe)]
    raw = payload.get("source")
    source = None if raw is None else msgspec.convert(raw, RecipeSource)
    try:
        rebuilt = rebuilt_columns(source, source.rebuild) if source is not None and source.rebuild else {}
        builder = node_builder(recipe, rebuilt)
    except RecipeError as exc:
        answer["problems"] = [exc.message]
        return answer
    answer["columns"] = [msgspec.to_builtins(c) for c in column_facts(builder.get_column_configs())]
    applied = None if refused else run_config
    answer["problems"] = _validate(builder, list(payload.get("providers") or []), Path(payload["scratch"]), applied)
    return answer


def answer_inspect(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to one request (see the module's docstring), in this process."""
    action = payload.get("action")
    if action == "build":
        return build(payload)
    if action == "versions":
        return versions()
    if action == "tools":
        return list_tools(payload)
    return check(payload)


def inspect_main(stdin: IO[str] = sys.stdin) -> int:
    """Answer one request (see the module's docstring); exit code 0 whenever an answer was written."""
    payload = json.load(stdin)
    result = os.dup(1)
    os.dup2(2, 1)  # Data Designer and builder scripts print to stdout: keep it for the answer
    try:
        answer = answer_inspect(payload)
    except BaseException as exc:  # ddslurm's own failure: report it rather than a bare traceback
        answer = {"ok": False, "error": f"inspecting the recipe failed: {type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(result, "w") as out:
        json.dump(answer, out)
    if payload.get("action") == "tools":
        os._exit(0)  # Data Designer's MCP loop thread and the servers' sessions are not waited for
    return 0
