"""The engine host (``ddslurm.launcher.cluster._engine_host``), the one way from the submit host to ``python_env``'s
Data Designer: it sends typed requests and reads typed answers; an answer of another ddslurm (another inspect protocol
version, or none) becomes one clear error naming ``python_env``, both versions and what to install, which every
question's caller (doctor's versions, the recipe check, a builder script's run, the MCP tool listing) passes on.
The real ``ddslurm-runtime inspect`` process answers the same typed questions."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import pytest

from ddslurm.config import (
    INSPECT_VERSION,
    LAYOUT_VERSION,
    PLAN_VERSION,
    BuildRequest,
    CheckRequest,
    PlanFormat,
    VersionsAnswer,
    VersionsRequest,
    decode_request,
)
from ddslurm.launcher import Slurm, SubmitError, doctor, prepare
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._process import Finished
from ddslurm.launcher.errors import BuilderError, InspectAnswerError
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, write_runtime_shim, write_unit_run
from ddslurm.runtime import NODE_DISTRIBUTIONS, installed_versions

OURS = version("ddslurm-runtime")
OLDER_VERSIONS = '{"versions": {"ddslurm-runtime": "0.0.1"}, "plan": {"version": 1, "layout": 1}}'
"""A ``versions`` answer of a ddslurm-runtime from before the versioned protocol."""


class FakeHost(EngineHost):
    """A ``python_env`` that answers every request with ``stdout`` (and exit code ``code``), recording the requests
    it got."""

    def __init__(self, stdout: str, code: int = 0) -> None:
        self.stdout, self.code = stdout, code
        self.requests: list[str] = []

    def exchange(
        self, runtime: Path, request: str, *, timeout_s: float, env: Mapping[str, str], cwd: Path | None = None
    ) -> Finished:
        self.requests.append(request)
        return Finished(self.code, self.stdout, "Traceback: something on stderr\n")


def _clear(runtime: Path, said: str) -> str:
    return (
        f"{runtime} (the profile's python_env {runtime.parent.parent}) answers in a form the submit host cannot "
        f"read: {said}. The submit host has ddslurm-runtime {OURS} (inspect protocol {INSPECT_VERSION}): install the "
        f"same ddslurm in python_env (ddslurm-runtime=={OURS})"
    )


@pytest.mark.parametrize(
    ("stdout", "said"),
    [
        pytest.param(
            OLDER_VERSIONS,
            "the answer says no inspect protocol version (it is older than the versioned protocol); this side speaks "
            f"inspect protocol {INSPECT_VERSION}",
            id="older",
        ),
        pytest.param(
            f'{{"answer": "versions", "inspect_version": {INSPECT_VERSION + 1}, "versions": {{}}}}',
            f"the answer is of inspect protocol {INSPECT_VERSION + 1}; this side speaks inspect protocol "
            f"{INSPECT_VERSION}",
            id="newer",
        ),
        pytest.param(
            f'{{"answer": "versions", "inspect_version": {INSPECT_VERSION}, "versions": {{}}}}',
            f"the answer, of inspect protocol {INSPECT_VERSION} as this side's, cannot be read as its 'versions' "
            "answer: Object missing required field `plan`",
            id="same-version-other-shape",
        ),
    ],
)  # fmt: skip
def test_an_answer_the_launcher_cannot_read_is_one_clear_error(tmp_path: Path, stdout: str, said: str) -> None:
    runtime = tmp_path / "venv" / "bin" / "ddslurm-runtime"
    host = FakeHost(stdout)
    with pytest.raises(InspectAnswerError) as refused:
        host.ask(runtime, VersionsRequest(), timeout_s=5, env={})
    assert str(refused.value) == _clear(runtime, said)
    assert refused.value.answered
    assert [decode_request(r) for r in host.requests] == [VersionsRequest()]  # what was sent: typed, versioned


def test_no_answer_and_an_error_answer_are_said_apart(tmp_path: Path) -> None:
    runtime = tmp_path / "venv" / "bin" / "ddslurm-runtime"
    with pytest.raises(InspectAnswerError) as none:
        FakeHost("", code=1).ask(runtime, VersionsRequest(), timeout_s=5, env={})
    assert not none.value.answered and none.value.returncode == 1
    assert none.value.tail() == "Traceback: something on stderr"
    error = f'{{"answer": "error", "inspect_version": {INSPECT_VERSION}, "error": "it broke"}}'
    with pytest.raises(InspectAnswerError, match=r"^it broke$") as failed:
        FakeHost(error).ask(runtime, VersionsRequest(), timeout_s=5, env={})
    assert failed.value.answered


def test_doctor_says_python_env_holds_another_ddslurm(tmp_path: Path) -> None:
    write_runtime_shim(tmp_path / "venv")
    profile = tmp_path / "profile.yaml"
    profile.write_text("workspace: work\npython_env: venv\npartition: gpu\ncpu_partition: cpu\n")
    report = doctor(profile, slurm=Slurm(FakeSlurm(), user="alice"), host=FakeHost(OLDER_VERSIONS), env={})
    check = next(c for c in report.checks if c.name == "python_env")
    runtime = tmp_path / "venv" / "bin" / "ddslurm-runtime"
    assert check.status == "problem" and check.where.startswith(f"{profile}:")
    assert check.detail == f"{runtime} does not say its versions: " + _clear(
        runtime,
        "the answer says no inspect protocol version (it is older than the versioned protocol); this side speaks "
        f"inspect protocol {INSPECT_VERSION}",
    )


class OlderCheck(InProcessHost):
    """Answers as this environment, but the recipe check as a ddslurm-runtime from before the versioned protocol."""

    def exchange(
        self, runtime: Path, request: str, *, timeout_s: float, env: Mapping[str, str], cwd: Path | None = None
    ) -> Finished:
        if isinstance(decode_request(request), CheckRequest | BuildRequest):
            return Finished(0, '{"problems": [], "unknown": [], "columns": null, "ok": true}', "")
        return super().exchange(runtime, request, timeout_s=timeout_s, env=env, cwd=cwd)


def test_submit_refuses_a_recipe_check_answered_by_another_ddslurm_saying_what_to_install(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, "sk-engine-host-test-0123456789")
    with pytest.raises(SubmitError) as refused:
        prepare(run, profile, env, datetime.now(UTC), host=OlderCheck())
    message = str(refused.value)
    assert "Data Designer refuses the recipe" in message
    assert "answers in a form the submit host cannot read: the answer says no inspect protocol version" in message
    assert f"install the same ddslurm in python_env (ddslurm-runtime=={OURS})" in message


def test_a_builder_script_run_by_another_ddslurm_is_refused_saying_what_to_install(tmp_path: Path) -> None:
    script = (
        "import data_designer.config as dd\ndef load_config_builder():\n    return dd.DataDesignerConfigBuilder()\n"
    )
    (tmp_path / "build.py").write_text(script)
    run, profile, env = write_unit_run(tmp_path, "sk-engine-host-test-0123456789")
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: build.py"))
    with pytest.raises(BuilderError) as refused:
        prepare(run, profile, env, datetime.now(UTC), host=OlderCheck())
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'build.py'}: {tmp_path / 'venv' / 'bin' / 'ddslurm-runtime'} ")
    assert f"install the same ddslurm in python_env (ddslurm-runtime=={OURS})" in message


def test_the_real_process_answers_the_typed_versions_request(tmp_path: Path) -> None:
    """``ddslurm-runtime inspect`` of a stand-in ``python_env`` (this environment), asked by the host every command
    uses: the typed answer, which doctor judges as on the submit host."""
    runtime = write_runtime_shim(tmp_path / "venv")
    answered = RUNTIME_PROCESS.ask(runtime, VersionsRequest(), timeout_s=120, env={"PATH": "/usr/bin:/bin"})
    assert answered.answer == VersionsAnswer(
        versions=installed_versions(NODE_DISTRIBUTIONS), plan=PlanFormat(version=PLAN_VERSION, layout=LAYOUT_VERSION)
    )


def test_the_in_process_host_answers_what_the_real_process_answers(tmp_path: Path) -> None:
    runtime = write_runtime_shim(tmp_path / "venv")
    request = CheckRequest(recipe={"data_designer": {"columns": []}}, providers=(), scratch=str(tmp_path / "s"))
    host = InProcessHost()
    here = host.ask(runtime, VersionsRequest(), timeout_s=120, env={}).answer
    assert here == RUNTIME_PROCESS.ask(runtime, VersionsRequest(), timeout_s=120, env={"PATH": "/bin"}).answer
    assert host.ask(runtime, request, timeout_s=120, env={}).answer.data_designer == version("data-designer")
    assert host.asked == {"versions": 1, "check": 1}
