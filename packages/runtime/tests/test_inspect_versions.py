"""``ddslurm-runtime inspect`` answers a ``versions`` request with the versions of the distributions the nodes run, as
this environment's package metadata records them, and the plan format it reads (``ddslurm doctor`` judges them
against the submit host's); a request it cannot read, or of another protocol version, gets the typed error answer
naming both versions, from the real process as in this one."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    INSPECT_VERSION,
    LAYOUT_VERSION,
    PLAN_VERSION,
    ErrorAnswer,
    PlanFormat,
    VersionsAnswer,
    VersionsRequest,
    encode_message,
)
from ddslurm.runtime import answer_inspect, read_request

pytestmark = pytest.mark.dd  # the Data Designer installed here (make test-dd-range: each supported version)

RUNTIME = Path(sys.executable).parent / "ddslurm-runtime"


def _inspect(request: str) -> str:
    done = subprocess.run(
        [str(RUNTIME), "inspect"], input=request, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


def test_the_versions_answer_is_what_the_package_metadata_records() -> None:
    answer = msgspec.json.decode(_inspect(encode_message(VersionsRequest())), type=VersionsAnswer)
    assert answer == VersionsAnswer(
        versions={name: version(name) for name in ("ddslurm-runtime", "ddslurm-config", "data-designer")},
        plan=PlanFormat(version=PLAN_VERSION, layout=LAYOUT_VERSION),
    )
    assert answer.inspect_version == INSPECT_VERSION


def test_a_request_of_an_older_ddslurm_gets_the_typed_error_naming_both_versions_on_stdout_alone() -> None:
    """The request of a launcher from before the versioned protocol (no ``inspect_version``): the process answers,
    on stdout, with exit code 0, an :class:`ErrorAnswer` that says its own version, the request's (none) and what to
    install."""
    answer = msgspec.json.decode(_inspect('{"action": "versions"}'), type=ErrorAnswer)
    assert answer.inspect_version == INSPECT_VERSION and answer.request_version is None
    assert "the request says no inspect protocol version" in answer.error
    assert f"this side speaks inspect protocol {INSPECT_VERSION}" in answer.error
    assert f"ddslurm-runtime {version('ddslurm-runtime')} in {sys.prefix} cannot answer" in answer.error
    assert answer.error.endswith("install the same ddslurm on the submit host and in python_env")


@pytest.mark.parametrize(
    ("request_text", "theirs", "says"),
    [
        pytest.param(
            f'{{"action": "versions", "inspect_version": {INSPECT_VERSION + 1}}}', INSPECT_VERSION + 1,
            f"the request is of inspect protocol {INSPECT_VERSION + 1}; this side speaks inspect protocol "
            f"{INSPECT_VERSION}",
            id="a-newer-version",
        ),
        pytest.param(
            f'{{"action": "summon", "inspect_version": {INSPECT_VERSION}}}', INSPECT_VERSION,
            f"the request, of inspect protocol {INSPECT_VERSION} as this side's, cannot be read as one: Invalid value "
            "'summon' - at `$.action`",
            id="an-unknown-action",
        ),
        pytest.param(
            f'{{"action": "check", "inspect_version": {INSPECT_VERSION}, "recipe": {{}}}}', INSPECT_VERSION,
            "cannot be read as one: Object missing required field `providers`",
            id="a-missing-field",
        ),
        pytest.param("not json", None, "the request is not a JSON object", id="not-json"),
    ],
)  # fmt: skip
def test_a_request_the_runtime_cannot_read_gets_the_typed_error(
    request_text: str, theirs: int | None, says: str
) -> None:
    answer = read_request(request_text)
    assert isinstance(answer, ErrorAnswer), answer
    assert answer.request_version == theirs and says in answer.error, answer.error
    assert answer_inspect(answer) is answer  # answered as it is


def test_the_real_process_answers_an_unreadable_request_with_the_typed_error() -> None:
    text = _inspect(f'{{"action": "summon", "inspect_version": {INSPECT_VERSION}}}')
    answer = msgspec.json.decode(text, type=ErrorAnswer)
    assert "Invalid value 'summon'" in answer.error and answer.request_version == INSPECT_VERSION
