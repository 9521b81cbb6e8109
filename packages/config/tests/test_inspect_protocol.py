"""The protocol of ``ddslurm-runtime inspect`` (``ddslurm.config._inspect_protocol``): every request and answer comes
back from its JSON as it was sent, each carrying the protocol's version; a message of another version, or one this
version cannot read, is refused naming both versions."""

from __future__ import annotations

from typing import Any, get_args

import msgspec
import pytest

from ddslurm.config import (
    ANSWER_TYPES,
    INSPECT_VERSION,
    BuildAnswer,
    BuildRequest,
    CheckAnswer,
    CheckProvider,
    CheckRequest,
    ErrorAnswer,
    GivenMCPProvider,
    InspectAnswer,
    InspectProtocolError,
    InspectRequest,
    PlanFormat,
    PluginRecord,
    ProviderSnapshot,
    RecipeColumn,
    RecipeSource,
    RunConfigProblem,
    SnapshotMCPProvider,
    ToolsAnswer,
    ToolsRequest,
    UnknownType,
    VersionsAnswer,
    VersionsRequest,
    WorkflowShape,
    WorkflowStage,
    decode_answer,
    decode_request,
    encode_message,
)

SOURCE = RecipeSource(
    file="/run/inputs/recipe-source.py", sha256="ab" * 32, builder="/home/u/build.py:load_config_builder",
    origin="/home/u/build.py", rebuild=("loud",), reasons=("'loud': a custom column's function",), stage=1,
)  # fmt: skip
COLUMN = RecipeColumn(
    name="q", column_type="llm-text", aliases=("writer",), refs=("topic",), required=("topic",), side_effects=(),
    drop=False, skips=False, propagate_skip=False, sampler_type=None,
)  # fmt: skip
REQUESTS: list[InspectRequest] = [
    BuildRequest(function="load_config_builder", run_dir="/home/u", script="/home/u/build.py"),
    BuildRequest(function="make", run_dir="/home/u", module="pkg.recipes", stage=2, seed="/w/runs/a/dataset"),
    CheckRequest(
        recipe={"data_designer": {"columns": [{"name": "q", "column_type": "llm-text"}]}},
        providers=(CheckProvider(name="hosted", provider_type="openai"),),
        scratch="/tmp/ddslurm-validate-x",
        source=SOURCE,
        run_config={"max_in_flight_tasks": 4, "throttle": {"rate": 2.5}},
    ),
    CheckRequest(recipe={}, providers=(), scratch="/tmp/s"),
    VersionsRequest(),
    ToolsRequest(
        snapshot=ProviderSnapshot(
            mcp_providers=(
                SnapshotMCPProvider(
                    name="docs", provider_type="stdio", command="/bin/docs", args=("-v",), env_from={"T": "TOKEN"}
                ),
            )
        ),
        timeout=12.5,
    ),
]
ANSWERS: list[InspectAnswer] = [
    BuildAnswer(
        ok=True,
        yaml="data_designer: {}\n",
        file="/home/u/build.py",
        line=3,
        rebuild=("loud",),
        changes={"loud": "a custom column's function"},
        mcp_providers=(GivenMCPProvider(provider={"name": "docs", "command": "/bin/docs"}, line=7),),
        workflow=WorkflowShape(
            name="chain", stages=(WorkflowStage(name="a", num_records=5), WorkflowStage(name="b", allow_empty=True))
        ),
    ),
    BuildAnswer(ok=False, error="load_config_builder() raised KeyError", file="/home/u/build.py", line=9),
    CheckAnswer(
        problems=("column 'q': no such column 'x'",),
        columns=(COLUMN,),
        plugins=(PluginRecord(name="p", plugin_type="column-generator", distribution="dd-p", version="1.0"),),
        run_config=(RunConfigProblem(field="max_in_flight_tasks", message="Input should be >= 1"),),
        data_designer="0.9.7",
    ),
    CheckAnswer(unknown=(UnknownType(where="column 'b'", field="column_type", type="no-such"),), data_designer=None),
    VersionsAnswer(versions={"ddslurm-runtime": "0.1.0", "data-designer": None}, plan=PlanFormat(version=3, layout=2)),
    ToolsAnswer(tools={"docs": ("search", "fetch")}, errors={"down": "ConnectError: refused"}),
    ErrorAnswer(error="cannot answer", request_version=None),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_comes_back_as_it_was_sent_with_the_protocols_version(request_: InspectRequest) -> None:
    text = encode_message(request_)
    assert msgspec.json.decode(text)["inspect_version"] == INSPECT_VERSION
    assert decode_request(text) == request_


@pytest.mark.parametrize("answer", ANSWERS, ids=lambda a: type(a).__name__)
def test_every_answer_comes_back_as_it_was_sent_with_the_protocols_version(answer: InspectAnswer) -> None:
    text = encode_message(answer)
    assert msgspec.json.decode(text)["inspect_version"] == INSPECT_VERSION
    expected = type(answer) if not isinstance(answer, ErrorAnswer) else VersionsAnswer
    assert decode_answer(text, expected) == answer  # an error answer comes back to any request


def test_every_request_has_its_answer_type() -> None:
    assert set(ANSWER_TYPES) == set(get_args(InspectRequest))
    covered = {type(r) for r in REQUESTS} | {type(a) for a in ANSWERS}
    assert covered == set(get_args(InspectRequest)) | set(get_args(InspectAnswer))


@pytest.mark.parametrize(
    ("text", "theirs", "says"),
    [
        pytest.param(
            '{"versions": {"data-designer": "0.9.7"}, "plan": {"version": 3, "layout": 2}}', None,
            f"the answer says no inspect protocol version (it is older than the versioned protocol); this side "
            f"speaks inspect protocol {INSPECT_VERSION}",
            id="older-than-the-protocol",
        ),
        pytest.param(
            f'{{"answer": "error", "inspect_version": {INSPECT_VERSION + 1}, "error": "I speak another"}}',
            INSPECT_VERSION + 1,
            f"the answer is of inspect protocol {INSPECT_VERSION + 1}; this side speaks inspect protocol "
            f"{INSPECT_VERSION} (it says: I speak another)",
            id="a-newer-version",
        ),
        pytest.param(
            f'{{"answer": "versions", "inspect_version": {INSPECT_VERSION}, "versions": {{}}}}', INSPECT_VERSION,
            f"the answer, of inspect protocol {INSPECT_VERSION} as this side's, cannot be read as its 'versions' "
            "answer: Object missing required field `plan`",
            id="a-field-missing",
        ),
        pytest.param(
            f'{{"answer": "check", "inspect_version": {INSPECT_VERSION}}}', INSPECT_VERSION,
            "cannot be read as its 'versions' answer: Invalid value 'check' - at `$.answer`",
            id="the-answer-to-another-request",
        ),
        pytest.param("Traceback (most recent call last)", None, "the answer is not a JSON object", id="not-json"),
    ],
)  # fmt: skip
def test_an_answer_of_another_version_or_shape_is_refused_naming_both_versions(
    text: str, theirs: int | None, says: str
) -> None:
    with pytest.raises(InspectProtocolError) as refused:
        decode_answer(text, VersionsAnswer)
    assert refused.value.theirs == theirs
    assert says in str(refused.value), str(refused.value)


def test_a_request_of_another_version_is_refused_before_its_fields_are_read() -> None:
    """A newer request whose fields this version does not know is refused for its version, not its fields."""
    newer: dict[str, Any] = {"action": "check", "inspect_version": INSPECT_VERSION + 1, "recipe_v2": {}}
    with pytest.raises(InspectProtocolError, match=f"is of inspect protocol {INSPECT_VERSION + 1}") as refused:
        decode_request(msgspec.json.encode(newer))
    assert refused.value.theirs == INSPECT_VERSION + 1
