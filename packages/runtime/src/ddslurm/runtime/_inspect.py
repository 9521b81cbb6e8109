"""``ddslurm-runtime inspect``: what the submit host asks of the profile's ``python_env`` (the Data Designer, plugins
and packages the nodes run) before anything is written. One JSON request on stdin, one JSON answer on stdout; what
Data Designer or a builder script prints goes to stderr.

``{"action": "build", "script" | "module", "function", "run_dir"}``
    call a builder script (:mod:`ddslurm.runtime._builder`): its config as Data Designer writes it.
``{"action": "check", "recipe", "providers", "scratch", "source"}``
    the recipe exactly as the node builds it (``source``: the plan's ``RecipeSource``, whose ``rebuild`` columns
    come from running the script again, as on the node): ``{"problems", "unknown", "columns", "plugins"}``: what Data
    Designer refuses (its own validation, sending no request), the types no plugin here provides (then nothing
    else is checked), the columns' facts
    (:class:`ddslurm.config.RecipeColumn`) and the plugins used (:class:`ddslurm.config.PluginRecord`).
``{"action": "versions"}``
    ``{"versions": {distribution: version or null}}`` of :data:`NODE_DISTRIBUTIONS` as this environment has them
    (``ddslurm doctor`` compares them with the submit host's).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any

import msgspec

from ddslurm.config import RecipeSource
from ddslurm.runtime._builder import build, rebuilt_columns
from ddslurm.runtime._columns import column_facts
from ddslurm.runtime._node_recipe import node_builder
from ddslurm.runtime._plugins import unknown_types, used_plugins
from ddslurm.runtime.errors import RecipeError

NODE_DISTRIBUTIONS = ("ddslurm-runtime", "ddslurm-config", "data-designer")
"""What the compute nodes run of ddslurm and Data Designer: the submit host must have the same versions."""


def installed_versions(names: Sequence[str]) -> dict[str, str | None]:
    """The version of each distribution of ``names`` installed here, None for one that is not."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def versions() -> dict[str, Any]:
    """The ``versions`` action (see the module's docstring)."""
    return {"versions": installed_versions(NODE_DISTRIBUTIONS)}


def _validate(builder: Any, providers: list[Mapping[str, Any]], scratch: Path) -> list[str]:
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
    answer: dict[str, Any] = {"problems": [], "unknown": unknown_types(recipe), "columns": None, "plugins": []}
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
    answer["problems"] = _validate(builder, list(payload.get("providers") or []), Path(payload["scratch"]))
    return answer


def answer_inspect(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to one request (see the module's docstring), in this process."""
    action = payload.get("action")
    return build(payload) if action == "build" else versions() if action == "versions" else check(payload)


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
    return 0
