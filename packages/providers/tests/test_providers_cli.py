"""The ``ddslurm-providers RUN.yaml`` command: a resolution table that never shows a key value."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddslurm.providers import AliasRow, load_recipe, resolve_run
from ddslurm.providers.cli import format_table, main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hosted-only"
SECRET = "s3cr3t-VALUE-never-printed-9876543210"
KEY_ENV = "DEMO_HOSTED_API_KEY"
ENDPOINT = "http://127.0.0.1:18400/v1"


@pytest.fixture
def run_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hosted-only example copied into tmp_path, with DATA_DESIGNER_HOME pointing at its dd-home."""
    work = tmp_path / "run"
    work.mkdir()
    shutil.copy(EXAMPLE / "recipe.yaml", work / "recipe.yaml")
    shutil.copy(EXAMPLE / "run.yaml", work / "run.yaml")
    shutil.copytree(EXAMPLE / "dd-home", tmp_path / "dd-home")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DATA_DESIGNER_HOME", str(tmp_path / "dd-home"))
    monkeypatch.setenv(KEY_ENV, SECRET)
    return work / "run.yaml"


def test_table(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run_file)]) == 0

    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines() == [
        "ALIAS   KIND    PROVIDER     ENDPOINT                   MODEL           API KEY VARIABLE",
        f"writer  hosted  demo-hosted  {ENDPOINT}  demo/writer-8b  {KEY_ENV} (set)",
        f"judge   hosted  demo-hosted  {ENDPOINT}  demo/judge-70b  {KEY_ENV} (set)",
    ]
    assert SECRET not in captured.out


def test_json(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run_file), "--json"]) == 0

    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    row = {"kind": "hosted", "provider": "demo-hosted", "endpoint": ENDPOINT, "key_env": KEY_ENV, "key_set": True}
    assert json.loads(captured.out) == {
        "aliases": [
            {"alias": "writer", **row, "model": "demo/writer-8b"},
            {"alias": "judge", **row, "model": "demo/judge-70b"},
        ]
    }


def test_settings_come_from_the_home_directory_without_data_designer_home(
    run_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATA_DESIGNER_HOME")
    (tmp_path / "home").mkdir()
    (tmp_path / "dd-home").rename(tmp_path / "home" / ".data-designer")

    assert main([str(run_file), "--json"]) == 0

    assert [r["provider"] for r in json.loads(capsys.readouterr().out)["aliases"]] == ["demo-hosted"] * 2


def test_unset_key_is_an_error(
    run_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(KEY_ENV)

    assert main([str(run_file)]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: 1 problem(s) resolving model providers:\n  - provider 'demo-hosted'")
    assert f"environment variable {KEY_ENV} is unset or empty" in captured.err


def test_literal_key_is_an_error_and_is_not_echoed(
    run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    providers = tmp_path / "dd-home" / "model_providers.yaml"
    providers.write_text(providers.read_text().replace(f"api_key: {KEY_ENV}", f"api_key: sk-{SECRET}"))

    assert main([str(run_file)]) == 2

    captured = capsys.readouterr()
    assert "looks like a literal key" in captured.err
    assert SECRET not in captured.out + captured.err


@pytest.mark.parametrize(
    ("run_text", "want"),
    [
        pytest.param(
            "name: demo\nrecipe: recipe.yaml\nnum_records: 0\n",
            "{run}:3:1: num_records: expected int >= 1",
            id="bad-value",
        ),
        pytest.param(
            "name: demo\nrecipe: recipe.yaml\nnum_records: 4\nshard: 2\n",
            "{run}:4:1: shard: unknown field",
            id="unknown-key",
        ),
        pytest.param(
            "name: demo\nrecipe: missing.yaml\nnum_records: 4\n",
            "{dir}/missing.yaml: cannot read: No such file or directory",
            id="recipe-not-found",
        ),
        pytest.param("", "{run}:1:1: file is empty", id="empty-run-file"),
    ],
)
def test_bad_run_file_returns_2_with_a_clear_error(
    run_file: Path, capsys: pytest.CaptureFixture[str], run_text: str, want: str
) -> None:
    run_file.write_text(run_text, encoding="utf-8")

    assert main([str(run_file)]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: " + want.format(run=run_file, dir=run_file.parent.resolve()))


def test_missing_run_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory\n"


def test_malformed_settings_file(run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    providers = tmp_path / "dd-home" / "model_providers.yaml"
    providers.write_text("providers:\n- name: x\n  endpoint: e\n  endpiont: typo\n")

    assert main([str(run_file)]) == 2

    assert capsys.readouterr().err.startswith(f"error: {providers}:4:3: providers[0].endpiont: unknown field")


def test_recipe_that_is_not_a_mapping(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run_file.parent / "recipe.yaml").write_text("- a\n- b\n")

    assert main([str(run_file)]) == 2

    assert "the recipe must be a mapping" in capsys.readouterr().err


def test_resolve_run_uses_the_given_environment(run_file: Path, tmp_path: Path) -> None:
    env = {"DATA_DESIGNER_HOME": str(tmp_path / "dd-home"), KEY_ENV: "x"}
    resolution = resolve_run(run_file, env)
    assert [m.alias for m in resolution.snapshot.models] == ["writer", "judge"]
    assert load_recipe(run_file.parent / "recipe.yaml")["library_version"] == "0.9.7"


def test_format_table_marks_unset_keys_and_local_rows() -> None:
    rows = [
        AliasRow("gen", "local", "ddslurm-local-gen", "(started in the job)", "llama", None, None),
        AliasRow("judge", "hosted", "nv", "https://nv/v1", "big", "NV_KEY", False),
    ]
    assert format_table(rows).splitlines() == [
        "ALIAS  KIND    PROVIDER           ENDPOINT              MODEL  API KEY VARIABLE",
        "gen    local   ddslurm-local-gen  (started in the job)  llama  -",
        "judge  hosted  nv                 https://nv/v1         big    NV_KEY (UNSET)",
    ]
