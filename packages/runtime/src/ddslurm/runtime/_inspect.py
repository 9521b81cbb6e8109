"""``ddslurm-runtime inspect``: what the submit host asks of the profile's ``python_env`` (the Data Designer, plugins
and packages the nodes run) before anything is written. One JSON request on stdin, one JSON answer on stdout, both
the typed, versioned structs of :mod:`ddslurm.config._inspect_protocol` (every message carries
:data:`ddslurm.config.INSPECT_VERSION`); what Data Designer or a builder script prints goes to stderr.

:class:`~ddslurm.config.BuildRequest` → :class:`~ddslurm.config.BuildAnswer`
    call a builder script (:mod:`ddslurm.runtime._builder`): its config as Data Designer writes it; for a builder
    that returns a Data Designer workflow, the config of its stage ``stage`` (from 0, optional) seeded from
    ``seed`` (the stage before's dataset directory) and the workflow's shape (:mod:`ddslurm.runtime._workflow`).
:class:`~ddslurm.config.CheckRequest` → :class:`~ddslurm.config.CheckAnswer`
    the recipe exactly as the node builds it (``source``: the plan's ``RecipeSource``, whose ``rebuild`` columns
    come from running the script again, as on the node; ``run_config``: the run file's, optional): what Data
    Designer refuses (its own validation, sending no request, with the run file's ``run_config`` applied as on the
    node), the types no plugin here provides (then nothing else is checked), the columns' facts
    (:class:`ddslurm.config.RecipeColumn`), the plugins used (:class:`ddslurm.config.PluginRecord`), what Data
    Designer's ``RunConfig`` refuses in ``run_config`` (:class:`ddslurm.config.RunConfigProblem`, one per field) and
    this environment's Data Designer version (``data_designer``: the plan records it, and each node refuses another,
    :mod:`ddslurm.runtime._dd_version`).
:class:`~ddslurm.config.VersionsRequest` → :class:`~ddslurm.config.VersionsAnswer`
    :data:`NODE_DISTRIBUTIONS` as this environment has them, and the plan format this runtime reads
    (:data:`ddslurm.config.PLAN_VERSION`, :data:`ddslurm.config.LAYOUT_VERSION`). ``ddslurm doctor`` judges them:
    ddslurm's own and the plan format as the submit host's, Data Designer any version ddslurm supports
    (:data:`ddslurm.config.DATA_DESIGNER_VERSIONS`).
:class:`~ddslurm.config.ToolsRequest` → :class:`~ddslurm.config.ToolsAnswer`
    the tools each MCP provider of ``snapshot`` offers, listed by Data Designer's own MCP client with this process's
    environment (:mod:`ddslurm.runtime._mcp_tools`). The process ends as soon as the answer is written: Data
    Designer's MCP loop thread and the servers' sessions are not waited for.

A request this runtime cannot read, or of another protocol version, is answered with an
:class:`~ddslurm.config.ErrorAnswer` naming both versions (:func:`read_request`), and so is ddslurm's own failure
while answering (:func:`answer_inspect`): the exit code is 0 whenever an answer was written.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec

from ddslurm.config import (
    LAYOUT_VERSION,
    PLAN_VERSION,
    BuildRequest,
    CheckAnswer,
    CheckProvider,
    CheckRequest,
    ErrorAnswer,
    InspectAnswer,
    InspectProtocolError,
    InspectRequest,
    PlanFormat,
    ToolsRequest,
    VersionsAnswer,
    VersionsRequest,
    decode_request,
    encode_message,
    frozen_imports,
)
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


def versions() -> VersionsAnswer:
    """The ``versions`` action (see the module's docstring)."""
    return VersionsAnswer(
        versions=installed_versions(NODE_DISTRIBUTIONS), plan=PlanFormat(version=PLAN_VERSION, layout=LAYOUT_VERSION)
    )


def _validate(
    builder: Any, providers: Sequence[CheckProvider], scratch: Path, run_config: Mapping[str, Any] | None = None
) -> list[str]:
    import data_designer.config as dd
    from data_designer.interface import DataDesigner

    from ddslurm.runtime._engine import UNUSED_ENDPOINT, unused_provider, violation_lines, violations_reported

    (scratch / "managed-assets").mkdir(parents=True, exist_ok=True)
    models = [
        dd.ModelProvider(name=p.name, endpoint=UNUSED_ENDPOINT, provider_type=p.provider_type, api_key=None)
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


def check(request: CheckRequest) -> CheckAnswer:
    """The ``check`` action (see the module's docstring)."""
    recipe = request.recipe
    run_config: Mapping[str, Any] = request.run_config or {}
    refused = tuple(run_config_problems(run_config)) if run_config else ()
    answer = CheckAnswer(run_config=refused, data_designer=installed_data_designer(), unknown=unknown_types(recipe))
    if answer.unknown:  # the submit host says which package would provide them
        return answer
    answer = msgspec.structs.replace(answer, plugins=used_plugins(recipe))
    source = request.source
    try:
        rebuilt = rebuilt_columns(source, source.rebuild) if source is not None and source.rebuild else {}
        builder = node_builder(recipe, rebuilt)
    except RecipeError as exc:
        return msgspec.structs.replace(answer, problems=(exc.message,))
    applied = None if refused else run_config
    return msgspec.structs.replace(
        answer,
        columns=column_facts(builder.get_column_configs()),
        problems=tuple(_validate(builder, request.providers, Path(request.scratch), applied)),
    )


def read_request(text: str | bytes) -> InspectRequest | ErrorAnswer:
    """The request ``text`` holds, or the :class:`~ddslurm.config.ErrorAnswer` to one this runtime cannot read or
    of another protocol version: both versions named, and this ddslurm-runtime's."""
    try:
        return decode_request(text)
    except InspectProtocolError as exc:
        ours = installed_versions(("ddslurm-runtime",))["ddslurm-runtime"]
        return ErrorAnswer(
            error=f"ddslurm-runtime {ours} in {sys.prefix} cannot answer: {exc}; install the same ddslurm on the "
            "submit host and in python_env",
            request_version=exc.theirs,
        )


def answer_inspect(request: InspectRequest | ErrorAnswer) -> InspectAnswer:
    """The answer to ``request`` (see the module's docstring), in this process; an
    :class:`~ddslurm.config.ErrorAnswer` (one that :func:`read_request` gave is answered as it is) when answering
    fails."""
    try:
        match request:
            case ErrorAnswer():
                return request
            case BuildRequest():
                return build(request)
            case VersionsRequest():
                return versions()
            case ToolsRequest():
                return list_tools(request)
            case CheckRequest():
                return check(request)
    except BaseException as exc:  # ddslurm's own failure: report it rather than a bare traceback
        return ErrorAnswer(error=f"inspecting the recipe failed: {type(exc).__name__}: {exc}")


def inspect_main(stdin: IO[str] = sys.stdin) -> int:
    """Answer one request (see the module's docstring); exit code 0 whenever an answer was written."""
    request = read_request(stdin.read())
    result = os.dup(1)
    os.dup2(2, 1)  # Data Designer and builder scripts print to stdout: keep it for the answer
    with frozen_imports():  # answering is mostly importing Data Designer (and a script's imports); exiting is cheap
        answer = answer_inspect(request)
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(result, "w") as out:
        out.write(encode_message(answer))
    if isinstance(request, ToolsRequest):
        os._exit(0)  # Data Designer's MCP loop thread and the servers' sessions are not waited for
    return 0
