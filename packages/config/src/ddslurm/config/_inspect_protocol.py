"""The protocol between the submit host and ``<python_env>/bin/ddslurm-runtime inspect``: one JSON request on the
process's standard input, one JSON answer on its standard output.

The two sides may run different ddslurm versions (the launcher's environment and the profile's ``python_env``), so
both are typed here and versioned: every request and every answer carries :data:`INSPECT_VERSION`, and a side reads
the other's message only at its own version (:func:`decode_request`, :func:`decode_answer`), else it says both
versions (:class:`InspectProtocolError`; the runtime answers :class:`ErrorAnswer`). A request is tagged by its
``action`` (``build``, ``check``, ``versions``, ``tools``), an answer by ``answer`` (the action it answers, or
``error``). What each action does is ``ddslurm.runtime._inspect``'s; who asks,
``ddslurm.launcher.cluster._engine_host``.

Change a field of any struct here and :data:`INSPECT_VERSION` goes up: a ``python_env`` with another ddslurm is then
told so in both versions' words rather than misread.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._plan import PluginRecord, RecipeSource
from ddslurm.config._recipe_graph import RecipeColumn
from ddslurm.config._run_config import RunConfigProblem
from ddslurm.config._snapshot import ProviderSnapshot
from ddslurm.config._workflow import WorkflowStage
from ddslurm.config.errors import InspectProtocolError

INSPECT_VERSION = 2
"""The version of this protocol, carried in every request and answer (``inspect_version``)."""


class _Request(Frozen, frozen=True, kw_only=True, tag_field="action"):
    inspect_version: int = INSPECT_VERSION


class BuildRequest(_Request, frozen=True, kw_only=True, tag="build"):
    """Call a builder: ``function`` of ``script`` (a file) or of ``module`` (imported, looked for beside ``run_dir``
    too). For a builder that returns a Data Designer workflow, the config of its stage ``stage`` (from 0) seeded
    from ``seed`` (the stage before's dataset directory)."""

    function: str
    run_dir: str
    script: str | None = None
    module: str | None = None
    stage: int | None = None
    seed: str | None = None


class CheckProvider(Frozen, frozen=True, kw_only=True):
    """A model provider as Data Designer's validation gets it: no endpoint, no key (it sends no request)."""

    name: str
    provider_type: str


class CheckRequest(_Request, frozen=True, kw_only=True, tag="check"):
    """Check ``recipe`` (with the snapshot's model configs, as the node builds it) by Data Designer's own
    validation with Data Designer's home and artifacts under ``scratch``; ``source``: the builder script's record
    (its ``rebuild`` columns come from running it again); ``run_config``: the run file's, judged by Data Designer's
    ``RunConfig`` and applied to the validation."""

    recipe: dict[str, Any]
    providers: tuple[CheckProvider, ...]
    scratch: str
    source: RecipeSource | None = None
    run_config: dict[str, Any] | None = None


class VersionsRequest(_Request, frozen=True, kw_only=True, tag="versions"):
    """The versions of what the nodes run, and the plan format the runtime reads."""


class ToolsRequest(_Request, frozen=True, kw_only=True, tag="tools"):
    """The tools each MCP provider of ``snapshot`` offers, each listed within ``timeout`` seconds."""

    snapshot: ProviderSnapshot
    timeout: float


InspectRequest = BuildRequest | CheckRequest | VersionsRequest | ToolsRequest
"""Any request ``ddslurm-runtime inspect`` answers."""


class _Answer(Frozen, frozen=True, kw_only=True, tag_field="answer"):
    inspect_version: int = INSPECT_VERSION


class GivenMCPProvider(Frozen, frozen=True, kw_only=True):
    """An MCP provider a builder script gave Data Designer (``DataDesigner(mcp_providers=...)``, or held at its top
    level): Data Designer's fields, a key as the script wrote it, and the script's line that gave it."""

    provider: dict[str, Any]
    line: int | None = None


class CodeLine(Frozen, frozen=True, kw_only=True):
    """A line of the user's code (a builder script, or a module of theirs it calls): where a column or a model
    config of the config it returned was made."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class WorkflowShape(Frozen, frozen=True, kw_only=True):
    """A Data Designer workflow a builder returned, as the submit host needs it."""

    name: str
    stages: tuple[WorkflowStage, ...]


class BuildAnswer(_Answer, frozen=True, kw_only=True, tag="build"):
    """What the builder gave: its config as Data Designer writes it (``yaml``), the file and line of the function,
    the columns whose config that YAML does not carry as it is (``rebuild``; ``changes``: what it changes in each),
    the MCP providers it gave and, for a workflow, its shape; where the user's code made each column (``columns_at``,
    by name: its ``add_column`` call) and each model config (``models_at``, by alias: its ``ModelConfig(...)``), so
    that a refusal of one names that line. Not ``ok``: the builder failed; ``error`` says why, at ``file``:``line``
    where known."""

    ok: bool
    error: str = ""
    file: str | None = None
    line: int | None = None
    yaml: str = ""
    rebuild: tuple[str, ...] = ()
    changes: dict[str, str] = msgspec.field(default_factory=dict)
    mcp_providers: tuple[GivenMCPProvider, ...] = ()
    workflow: WorkflowShape | None = None
    columns_at: dict[str, CodeLine] = msgspec.field(default_factory=dict)
    models_at: dict[str, CodeLine] = msgspec.field(default_factory=dict)


class UnknownType(Frozen, frozen=True, kw_only=True):
    """A type the recipe names at ``where`` (its ``field``: ``column_type``, ``processor_type``, ``seed_type``)
    that neither Data Designer nor any plugin installed beside it provides."""

    where: str
    field: str
    type: str


class CheckAnswer(_Answer, frozen=True, kw_only=True, tag="check"):
    """What Data Designer refuses in the recipe (``problems``, one line each in its own words), the types no plugin
    provides (``unknown``: then nothing else is checked), the columns as it reads them (None when it refuses them),
    the plugins the recipe uses, what its ``RunConfig`` refuses in the run file's ``run_config`` (one field each)
    and its version (``data_designer``: the plan records it; None when it is not installed)."""

    problems: tuple[str, ...] = ()
    unknown: tuple[UnknownType, ...] = ()
    columns: tuple[RecipeColumn, ...] | None = None
    plugins: tuple[PluginRecord, ...] = ()
    run_config: tuple[RunConfigProblem, ...] = ()
    data_designer: str | None = None


class PlanFormat(Frozen, frozen=True, kw_only=True):
    """The plan format a runtime reads (``ddslurm.config.PLAN_VERSION``, ``ddslurm.config.LAYOUT_VERSION``)."""

    version: int
    layout: int


class VersionsAnswer(_Answer, frozen=True, kw_only=True, tag="versions"):
    """Each distribution the nodes run, at the version the environment has it (None: not installed), and the plan
    format its runtime reads."""

    versions: dict[str, str | None]
    plan: PlanFormat


class ToolsAnswer(_Answer, frozen=True, kw_only=True, tag="tools"):
    """Each MCP provider's tool names, or why they could not be listed."""

    tools: dict[str, tuple[str, ...]]
    errors: dict[str, str] = msgspec.field(default_factory=dict)


class ErrorAnswer(_Answer, frozen=True, kw_only=True, tag="error"):
    """The runtime could not answer: a request it cannot read, of another version (``request_version``, None when
    the request said none), or ddslurm's own failure while answering. ``error`` says which, naming both versions
    when they differ."""

    error: str
    request_version: int | None = INSPECT_VERSION


InspectAnswer = BuildAnswer | CheckAnswer | VersionsAnswer | ToolsAnswer | ErrorAnswer
"""Any answer of ``ddslurm-runtime inspect``."""

ANSWER_TYPES: dict[type[InspectRequest], type[InspectAnswer]] = {
    BuildRequest: BuildAnswer,
    CheckRequest: CheckAnswer,
    VersionsRequest: VersionsAnswer,
    ToolsRequest: ToolsAnswer,
}
"""The answer each request gets (or an :class:`ErrorAnswer`)."""

A = TypeVar("A", BuildAnswer, CheckAnswer, VersionsAnswer, ToolsAnswer)


class _Envelope(msgspec.Struct):
    """What any version's message says of its version (and, an error answer, of its error)."""

    inspect_version: int | None = None
    error: Any = None


def _envelope(data: bytes | str, what: str) -> _Envelope:
    """What ``data`` says of its version; :class:`InspectProtocolError` when it is no JSON object, or says another
    version than :data:`INSPECT_VERSION` (``what``: "request", "answer")."""
    try:
        envelope = msgspec.json.decode(data, type=_Envelope)
    except msgspec.DecodeError as exc:
        raise InspectProtocolError(f"the {what} is not a JSON object ({exc})", theirs=None) from None
    theirs = envelope.inspect_version
    if theirs != INSPECT_VERSION:
        said = (
            "says no inspect protocol version (it is older than the versioned protocol)"
            if theirs is None
            else f"is of inspect protocol {theirs}"
        )
        error = f" (it says: {envelope.error})" if isinstance(envelope.error, str) and envelope.error else ""
        raise InspectProtocolError(
            f"the {what} {said}; this side speaks inspect protocol {INSPECT_VERSION}{error}", theirs=theirs
        )
    return envelope


def decode_request(data: bytes | str) -> InspectRequest:
    """The request ``data`` holds; :class:`InspectProtocolError` (naming both versions) for one of another protocol
    version, or that this version cannot read."""
    _envelope(data, "request")
    try:
        return msgspec.json.decode(data, type=InspectRequest)
    except msgspec.DecodeError as exc:
        raise InspectProtocolError(
            f"the request, of inspect protocol {INSPECT_VERSION} as this side's, cannot be read as one: {exc}",
            theirs=INSPECT_VERSION,
        ) from None


def decode_answer(data: bytes | str, expected: type[A]) -> A | ErrorAnswer:
    """The answer ``data`` holds, of type ``expected`` or an :class:`ErrorAnswer`; :class:`InspectProtocolError`
    (naming both versions, and the error such an answer said) for one of another protocol version, or that this
    version cannot read as ``expected``."""
    _envelope(data, "answer")
    try:
        return msgspec.json.decode(data, type=expected | ErrorAnswer)
    except msgspec.DecodeError as exc:
        tag = expected.__struct_config__.tag
        raise InspectProtocolError(
            f"the answer, of inspect protocol {INSPECT_VERSION} as this side's, cannot be read as its {tag!r} "
            f"answer: {exc}",
            theirs=INSPECT_VERSION,
        ) from None


def encode_message(message: InspectRequest | InspectAnswer) -> str:
    """``message`` as the JSON text the other side decodes."""
    return msgspec.json.encode(message).decode()
