"""The ``ddslurm-providers RUN.yaml`` command: a resolution table that never shows a key value."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from ddslurm.config import load_run_file
from ddslurm.providers import (
    AliasRow,
    Resolution,
    check_endpoints,
    describe_run,
    describe_run_recipe,
    load_recipe,
    resolve_run,
)
from ddslurm.providers.cli import exit_code, format_table, main
from ddslurm.providers.discovery import settings_dir

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
    row = {
        "kind": "hosted",
        "provider": "demo-hosted",
        "endpoint": ENDPOINT,
        "key_env": KEY_ENV,
        "key_set": True,
        "key_scanned": True,
        "key_literal": False,
        "check": None,
    }
    assert json.loads(captured.out) == {
        "aliases": [
            {"alias": "writer", **row, "model": "demo/writer-8b"},
            {"alias": "judge", **row, "model": "demo/judge-70b"},
        ],
        "problems": [],
    }


def test_settings_come_from_the_home_directory_without_data_designer_home(
    run_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATA_DESIGNER_HOME")
    (tmp_path / "home").mkdir()
    (tmp_path / "dd-home").rename(tmp_path / "home" / ".data-designer")

    assert main([str(run_file), "--json"]) == 0

    assert [r["provider"] for r in json.loads(capsys.readouterr().out)["aliases"]] == ["demo-hosted"] * 2


def test_unset_key_shows_the_table_with_the_key_marked_and_the_problem_below(
    run_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(KEY_ENV)

    assert main([str(run_file)]) == 1

    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "ALIAS   KIND    PROVIDER     ENDPOINT                   MODEL           API KEY VARIABLE",
        f"writer  hosted  demo-hosted  {ENDPOINT}  demo/writer-8b  {KEY_ENV} (UNSET)",
        f"judge   hosted  demo-hosted  {ENDPOINT}  demo/judge-70b  {KEY_ENV} (UNSET)",
    ]
    assert captured.err.startswith("1 problem(s) would stop `ddslurm submit`:\n  - ")
    assert f"providers[0].api_key: provider 'demo-hosted': environment variable {KEY_ENV} is unset" in captured.err


def test_unset_key_in_json(run_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(KEY_ENV)

    assert main([str(run_file), "--json"]) == 1

    out = json.loads(capsys.readouterr().out)
    assert [(r["key_env"], r["key_set"]) for r in out["aliases"]] == [(KEY_ENV, False)] * 2
    assert len(out["problems"]) == 1 and "is unset or empty" in out["problems"][0]


def test_unresolved_aliases_are_rows_too(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = run_file.parent / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("model_alias: judge", "model_alias: ghost"))

    assert main([str(run_file)]) == 1

    captured = capsys.readouterr()
    assert "ghost   unresolved  -" in captured.out
    assert "model alias 'ghost' has no deployment" in captured.err


def test_placeholder_key_is_marked_not_scanned(
    run_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(KEY_ENV, "EMPTY")

    assert main([str(run_file)]) == 0

    out = capsys.readouterr().out
    assert f"{KEY_ENV} (set; placeholder value, not scanned for)" in out
    assert "EMPTY" not in out


@pytest.mark.parametrize("literal", [f"sk-{SECRET}", "LIVEKEY7F3A9C0D1E2B55"])
def test_literal_key_is_refused_and_never_echoed(
    run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], literal: str
) -> None:
    providers = tmp_path / "dd-home" / "model_providers.yaml"
    providers.write_text(providers.read_text().replace(f"api_key: {KEY_ENV}", f"api_key: {literal}"))

    assert main([str(run_file)]) == 1
    assert main([str(run_file), "--json"]) == 1

    captured = capsys.readouterr()
    assert "looks like a literal key" in captured.err
    assert "(literal key, not shown)" in captured.out
    assert literal not in captured.out + captured.err


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


def main_rc(resolution: Resolution) -> int:
    return exit_code(resolution, checked=True)


class FakeFetch:
    """Answers GET {endpoint}/models like the stand-in would; records what it was asked."""

    def __init__(self, status: int = 200, models: tuple[str, ...] = ("demo/writer-8b", "demo/judge-70b")) -> None:
        self.status, self.models = status, models
        self.calls: list[tuple[str, dict[str, str]]] = []

    def __call__(self, url: str, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
        self.calls.append((url, dict(headers)))
        if self.status == 0:
            raise OSError("connection refused")
        return self.status, json.dumps({"object": "list", "data": [{"id": m} for m in self.models]}).encode()


@pytest.mark.parametrize(
    ("fetch", "want", "rc"),
    [
        pytest.param(FakeFetch(), ["ok", "ok"], 0, id="listed-and-accepted"),
        pytest.param(FakeFetch(401), ["key refused (HTTP 401)"] * 2, 1, id="key-refused"),
        pytest.param(FakeFetch(models=("demo/writer-8b",)), ["ok", "model not listed by /models"], 1, id="not-listed"),
        pytest.param(FakeFetch(0), ["unreachable: connection refused"] * 2, 1, id="unreachable"),
        pytest.param(FakeFetch(503), ["HTTP 503 from /models"] * 2, 1, id="server-error"),
    ],
)
def test_check(run_file: Path, fetch: FakeFetch, want: list[str], rc: int) -> None:
    resolution = describe_run(run_file, os.environ)
    checked = check_endpoints(resolution, os.environ, fetch=fetch)
    assert [r.check for r in checked.rows] == want
    assert fetch.calls == [(f"{ENDPOINT}/models", {"Authorization": f"Bearer {SECRET}"})]  # once per provider
    assert SECRET not in repr(checked.rows)
    assert main_rc(checked) == rc


def test_check_is_off_by_default_and_skips_providers_with_problems(
    run_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(KEY_ENV)
    fetch = FakeFetch()
    checked = check_endpoints(describe_run(run_file, os.environ), os.environ, fetch=fetch)
    assert [r.check for r in checked.rows] == [f"not checked: {KEY_ENV} is unset"] * 2
    assert fetch.calls == []

    assert main([str(run_file)]) == 1
    assert "CHECK" not in capsys.readouterr().out


def test_check_column_in_the_table(run_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        AliasRow("gen", "local", "ddslurm-local-gen", "(started in the job)", "llama", None, None),
        AliasRow("judge", "hosted", "nv", "https://nv/v1", "big", "NV_KEY", True, True, check="ok"),
    ]
    assert format_table(rows, check=True).splitlines() == [
        "ALIAS  KIND    PROVIDER           ENDPOINT              MODEL  API KEY VARIABLE  CHECK",
        "gen    local   ddslurm-local-gen  (started in the job)  llama  -                 -",
        "judge  hosted  nv                 https://nv/v1         big    NV_KEY (set)      ok",
    ]


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


def test_a_recipe_built_by_python_is_not_run_here_but_may_be_given_loaded(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddslurm.config import ConfigError

    recipe = load_recipe(run_file.parent / "recipe.yaml")
    run_file.write_text(run_file.read_text().replace("recipe: recipe.yaml", "recipe: build.py"))
    with pytest.raises(ConfigError) as info:
        describe_run(run_file, os.environ)
    line = next(i for i, text in enumerate(run_file.read_text().splitlines(), 1) if text.startswith("recipe:"))
    assert str(info.value).startswith(f"{run_file}:{line}:1: recipe: build.py:load_config_builder is built by Python")
    assert main([str(run_file)]) == 2 and "ddslurm providers RUN_FILE --profile" in capsys.readouterr().err

    run = load_run_file(run_file)
    origin = run_file.parent / "build.py:load_config_builder()"
    resolution = describe_run_recipe(run, run_file, recipe, origin, os.environ, settings_dir(os.environ))
    assert [row.alias for row in resolution.rows] == ["writer", "judge"] and not resolution.problems
