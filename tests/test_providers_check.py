"""``ddslurm providers``: the table with problems marked instead of a failure, and ``--check`` against the vLLM
stand-in as a hosted endpoint (is the model listed by /v1/models, is the key accepted)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddslurm.launcher.cli import main
from fake_vllm.testing import RunningServer, free_port, start_server

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "hosted-only"
KEY_ENV = "DEMO_HOSTED_API_KEY"
KEY = "sk-check-" + "5e1f0a9c3b7d2e4f6a8c0b1d"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("stand-in") / "server.log"
    with start_server("demo", args=["--served-model-name", "demo/writer-8b"], api_key=KEY, log_path=log) as running:
        yield running


def _run_file(tmp_path: Path, endpoint: str) -> Path:
    work = tmp_path / "run"
    work.mkdir(parents=True)
    shutil.copy(EXAMPLE / "recipe.yaml", work / "recipe.yaml")
    shutil.copy(EXAMPLE / "run.yaml", work / "run.yaml")
    home = tmp_path / "dd-home"
    home.mkdir()
    (home / "model_providers.yaml").write_text(
        f"providers:\n- name: demo-hosted\n  endpoint: {endpoint}\n  provider_type: openai\n  api_key: {KEY_ENV}\n"
    )
    return work / "run.yaml"


def _providers(tmp_path: Path, endpoint: str, key: str | None, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    run = _run_file(tmp_path, endpoint)
    monkeypatch.setenv("DATA_DESIGNER_HOME", str(tmp_path / "dd-home"))
    if key is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, key)
    return main(["providers", str(run), *args])


def _rows(out: str) -> dict[str, str]:
    return {r["alias"]: r["check"] for r in json.loads(out)["aliases"]}


def test_check_against_the_stand_in(
    tmp_path: Path, server: RunningServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stand-in serves the writer's model but not the judge's, and requires KEY.
    rc = _providers(tmp_path / "a", server.base_url, KEY, monkeypatch, "--check", "--json")
    out = capsys.readouterr()
    assert rc == 1
    assert _rows(out.out) == {"writer": "ok", "judge": "model not listed by /models"}

    rc = _providers(tmp_path / "b", server.base_url, "sk-wrong-" + "0" * 24, monkeypatch, "--check", "--json")
    out = capsys.readouterr()
    assert rc == 1
    assert _rows(out.out) == {"writer": "key refused (HTTP 401)", "judge": "key refused (HTTP 401)"}

    rc = _providers(tmp_path / "c", server.base_url, KEY, monkeypatch, "--check")
    text = capsys.readouterr()
    assert rc == 1
    lines = text.out.splitlines()
    assert lines[0].split()[-1] == "CHECK"
    assert lines[1].endswith(f"{KEY_ENV} (set)  ok")
    assert lines[2].endswith(f"{KEY_ENV} (set)  model not listed by /models")
    assert KEY not in text.out + text.err + out.out + out.err


def test_check_of_an_endpoint_nobody_listens_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}/v1"
    rc = _providers(tmp_path, endpoint, KEY, monkeypatch, "--check", "--json", "--timeout", "3")
    out = capsys.readouterr()
    assert rc == 1
    assert all(check.startswith("unreachable: ") for check in _rows(out.out).values())
    assert KEY not in out.out + out.err


def test_without_check_nothing_is_asked_and_an_unset_key_is_a_marked_row(
    tmp_path: Path, server: RunningServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = _providers(tmp_path, server.base_url, None, monkeypatch)
    out = capsys.readouterr()
    assert rc == 1
    assert f"writer  hosted  demo-hosted  {server.base_url}  demo/writer-8b  {KEY_ENV} (UNSET)" in out.out
    assert "CHECK" not in out.out
    assert f"environment variable {KEY_ENV} is unset" in out.err
