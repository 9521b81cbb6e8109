"""``ddslurm providers``: the table with problems marked instead of a failure, and ``--check`` against the vLLM
stand-in as a hosted endpoint (is the model listed by /v1/models, is the key accepted)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddslurm.launcher.cli import main
from ddslurm.launcher.testing import InProcessHost
from fake_vllm.testing import RunningServer, free_port, start_server

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""

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


# --- a recipe built by a builder script, as submit loads it; and submit --check-endpoints ---

BUILD = """\
import data_designer.config as dd


def load_config_builder() -> dd.DataDesignerConfigBuilder:
    builder = dd.DataDesignerConfigBuilder(
        model_configs=[
            dd.ModelConfig(alias="writer", model="demo/writer-8b", provider="demo-hosted"),
            dd.ModelConfig(alias="judge", model="demo/judge-70b", provider="demo-hosted"),
        ]
    )
    builder.add_column(dd.LLMTextColumnConfig(name="question", model_alias="writer", prompt="Ask {{ person }}."))
    builder.add_column(dd.LLMTextColumnConfig(name="verdict", model_alias="judge", prompt="Rate {{ question }}."))
    builder.with_seed_dataset(dd.LocalFileSeedSource(path="people.csv"))
    return builder
"""


def _builder_run(tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch, key: str) -> tuple[Path, Path]:
    """A run whose recipe is ``recipes/build.py`` (a seed CSV beside it), a profile whose python_env runs it, and
    the shell's environment: Data Designer's home and ``key`` in the provider's key variable."""
    run = _run_file(tmp_path, endpoint)
    monkeypatch.setenv("DATA_DESIGNER_HOME", str(tmp_path / "dd-home"))
    monkeypatch.setenv(KEY_ENV, key)
    recipes = run.parent / "recipes"
    recipes.mkdir()
    (recipes / "build.py").write_text(BUILD)
    (recipes / "people.csv").write_text("person\nada\ngrace\n")
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: recipes/build.py"))
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"workspace: {tmp_path / 'work'}\npython_env: {REPO / '.venv'}\ncpu_partition: cpu\n")
    return run, profile


def test_providers_runs_a_builder_script_in_the_profiles_python_env_and_resolves_what_submit_would(
    tmp_path: Path, server: RunningServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime

    import msgspec

    from ddslurm.launcher import prepare

    run, profile = _builder_run(tmp_path, server.base_url, monkeypatch, KEY)

    rc = main(["providers", str(run), "--profile", str(profile), "--check", "--json"])
    out = capsys.readouterr()
    assert rc == 1, out.err  # the stand-in does not serve the judge's model
    shown = json.loads(out.out)["aliases"]
    assert {r["alias"]: r["check"] for r in shown} == {"writer": "ok", "judge": "model not listed by /models"}

    # exactly the aliases submit resolves (its preparation: the script run, the seed beside it, nothing written)
    prepared = prepare(run, profile, dict(os.environ), datetime.now(UTC), host=HOST)
    assert [{**r, "check": None} for r in shown] == msgspec.to_builtins(list(prepared.aliases))
    assert [r["provider"] for r in shown] == ["demo-hosted", "demo-hosted"] and not (tmp_path / "work").exists()

    monkeypatch.setenv("DDSLURM_PROFILE", str(profile))  # the profile by its variable, as every --profile
    assert main(["providers", str(run)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in table] == [["ALIAS", "KIND"], ["writer", "hosted"], ["judge", "hosted"]]
    assert KEY not in out.out + out.err + "".join(table)


def test_a_builder_script_without_a_profile_is_refused_at_the_run_files_recipe(
    tmp_path: Path, server: RunningServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = _builder_run(tmp_path, server.base_url, monkeypatch, KEY)
    assert main(["providers", str(run), "--check"]) == 2
    line = next(i for i, text in enumerate(run.read_text().splitlines(), 1) if text.startswith("recipe:"))
    err = capsys.readouterr().err
    assert f"{run}:{line}:1: recipe: recipes/build.py:load_config_builder is built by Python" in err
    assert "give --profile PROFILE.yaml (or DDSLURM_PROFILE naming it)" in err


def _sbatch_stand_in(bin_dir: Path, record: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sbatch`` that only records the calls that submit (``--test-only``, the profile's check, goes to Slurm's own),
    and the ``scontrol`` the limits are read with."""
    bin_dir.mkdir()
    real = shutil.which("sbatch") or "sbatch"
    test_only = f'case " $* " in *" --test-only "*) exec {real} "$@";; esac\n'
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\n{test_only}echo "$@" >> {record}\necho 4242\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'MaxArraySize = 1001'\n")
    for tool in ("sbatch", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_submit_check_endpoints_refuses_a_refused_key_and_an_unlisted_model_before_anything_is_written(
    tmp_path: Path, server: RunningServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = "sk-wrong-" + os.urandom(12).hex()
    run, profile = _builder_run(tmp_path, server.base_url, monkeypatch, wrong)
    record = tmp_path / "sbatch-calls.txt"
    _sbatch_stand_in(tmp_path / "bin", record, monkeypatch)

    assert main(["submit", str(run), "--profile", str(profile), "--check-endpoints"]) == 2
    err = capsys.readouterr().err
    assert "--check-endpoints: 2 hosted model alias(es) would fail on the nodes; nothing was written" in err
    for alias, model in (("writer", "demo/writer-8b"), ("judge", "demo/judge-70b")):
        assert f"  {alias}: key refused (HTTP 401) (provider demo-hosted, {server.base_url}, model {model}, " in err
    assert f"key {KEY_ENV})" in err and wrong not in err
    assert not record.exists() and not (tmp_path / "work").exists()  # nothing submitted, nothing written

    monkeypatch.setenv(KEY_ENV, KEY)  # the right key: only the judge's model, which the endpoint does not serve
    assert main(["submit", str(run), "--profile", str(profile), "--dry-run", "--check-endpoints", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["code"], error["exit_code"]) == ("submit_refused", 2)
    assert "1 hosted model alias(es)" in error["message"] and "  judge: model not listed by /models" in error["message"]
    assert "writer:" not in error["message"]
    assert not record.exists() and not (tmp_path / "work").exists()


def test_submit_check_endpoints_accepts_endpoints_that_list_the_models_and_take_the_key(
    tmp_path: Path, hosted_endpoint: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, profile = _builder_run(tmp_path, hosted_endpoint.base_url, monkeypatch, hosted_endpoint.api_key)  # both models
    record = tmp_path / "sbatch-calls.txt"
    _sbatch_stand_in(tmp_path / "bin", record, monkeypatch)
    asked = _model_requests(hosted_endpoint.request_log)

    assert main(["submit", str(run), "--profile", str(profile), "--dry-run", "--check-endpoints", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["aliases"]
    assert {r["alias"]: r["check"] for r in shown} == {"writer": "ok", "judge": "ok"}
    assert _model_requests(hosted_endpoint.request_log) == asked + 1  # one request per provider, with the key
    assert not record.exists() and not (tmp_path / "work").exists()  # a dry run still writes nothing

    assert main(["submit", str(run), "--profile", str(profile), "--check-endpoints"]) == 0
    assert record.read_text().count("\n") == 1 and (tmp_path / "work").is_dir()  # submitted as without the check


def _model_requests(log: Path) -> int:
    """The authorised ``GET /v1/models`` the stand-in has answered."""
    if not log.exists():
        return 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return sum(1 for r in lines if r["path"] == "/v1/models" and r["authorized"])
