"""Key values that are placeholders (``EMPTY``, ``none``, anything shorter than 8 characters) are decided at
submit: recorded in the plan as not to be scanned for, and said so in submit's output; real keys still are."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import Plan, encode, read_plan
from ddslurm.config.testing import make_plan
from ddslurm.launcher import prepare
from ddslurm.launcher.cli import main
from ddslurm.launcher.testing import InProcessHost

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""

REAL = "sk-real-" + "5e1f0a9c3b7d2e4f6a8c0b1d"
RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}
  - {name: r, column_type: llm-text, model_alias: judge, prompt: "Judge {{ q }}"}
  model_configs:
  - {alias: writer, model: m-1, provider: local-server}
  - {alias: judge, model: m-2, provider: hosted}
"""


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    home = tmp_path / "dd"
    home.mkdir()
    (home / "model_providers.yaml").write_text(
        "providers:\n- {name: local-server, endpoint: 'http://127.0.0.1:9/v1', api_key: LOCAL_SERVER_KEY}\n"
        "- {name: hosted, endpoint: 'http://127.0.0.1:8/v1', api_key: HOSTED_KEY}\n"
    )
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    run = tmp_path / "run.yaml"
    run.write_text("name: unit\nrecipe: recipe.yaml\nnum_records: 4\nshards: 2\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"workspace: work\npython_env: {Path(sys.executable).parent.parent}\ncpu_partition: cpu\n")
    return home, run, profile


@pytest.mark.parametrize(
    ("local_value", "hosted_value", "want"),
    [
        pytest.param("EMPTY", REAL, ("LOCAL_SERVER_KEY",), id="empty"),
        pytest.param("none", REAL, ("LOCAL_SERVER_KEY",), id="none"),
        pytest.param("dummy", "sk-no-key-required", ("HOSTED_KEY", "LOCAL_SERVER_KEY"), id="both-placeholders"),
        pytest.param("abc1234", REAL, ("LOCAL_SERVER_KEY",), id="shorter-than-eight"),
        pytest.param(REAL + "x", REAL, (), id="real-keys-are-scanned"),
    ],
)
def test_the_plan_records_which_key_variables_are_not_scanned_for(
    tmp_path: Path, local_value: str, hosted_value: str, want: tuple[str, ...]
) -> None:
    home, run, profile = _files(tmp_path)
    env = {"DATA_DESIGNER_HOME": str(home), "LOCAL_SERVER_KEY": local_value, "HOSTED_KEY": hosted_value}

    plan = prepare(run, profile, env, datetime.now(UTC), host=HOST).plan

    assert plan.secret_env == ("HOSTED_KEY", "LOCAL_SERVER_KEY")
    assert plan.secret_env_unscanned == want


def test_a_plan_written_before_the_field_existed_scans_every_key() -> None:
    tree = msgspec.to_builtins(make_plan(secret_env=("HOSTED_KEY",), secret_env_unscanned=("HOSTED_KEY",)))
    assert list(tree.pop("secret_env_unscanned")) == ["HOSTED_KEY"]
    assert msgspec.json.decode(encode(tree), type=Plan).secret_env_unscanned == ()
    field = next(f for f in msgspec.structs.fields(Plan) if f.name == "secret_env_unscanned")
    assert field.default == ()  # optional: a plan without it decodes, and every key is scanned for


def _stand_ins(bin_dir: Path) -> None:
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'MaxArraySize = 1001'\n")
    for tool in ("sbatch", "scontrol"):
        (bin_dir / tool).chmod(0o755)


def test_submit_and_providers_say_which_keys_are_placeholders_and_never_print_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home, run, profile = _files(tmp_path)
    _stand_ins(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("DATA_DESIGNER_HOME", str(home))
    monkeypatch.setenv("LOCAL_SERVER_KEY", "EMPTY")
    monkeypatch.setenv("HOSTED_KEY", REAL)

    assert main(["submit", str(run), "--profile", str(profile)]) == 0
    text = capsys.readouterr().out
    assert main(["submit", str(run), "--profile", str(profile), "--json"]) == 0
    submitted = json.loads(capsys.readouterr().out)
    assert main(["submit", str(run), "--profile", str(profile), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert main(["providers", str(run)]) == 0
    table = capsys.readouterr().out

    note = "LOCAL_SERVER_KEY holds a placeholder value (not a secret): attempts do not scan their files for it"
    assert note in text
    assert note in dry
    assert "HOSTED_KEY" not in text.split("\n", 1)[1]  # a real key is scanned for: nothing to say
    assert submitted["secret_env_unscanned"] == ["LOCAL_SERVER_KEY"]
    assert read_plan(Path(submitted["run_dir"]) / "run.json").secret_env_unscanned == ("LOCAL_SERVER_KEY",)
    assert "LOCAL_SERVER_KEY (set; placeholder value, not scanned for)" in table
    assert "HOSTED_KEY (set)" in table
    for out in (text, dry, table, json.dumps(submitted)):
        assert "EMPTY" not in out and REAL not in out
