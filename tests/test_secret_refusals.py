"""Credentials planted where the old checks let them through are refused, and the planted value appears in no
file that ``submit`` writes and in nothing any command prints (submit, submit --dry-run, providers [--json]
[--check]). ``sbatch`` and ``scontrol`` are stand-ins on PATH, so a submission that got through would be
recorded rather than queued on a cluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddslurm.launcher.cli import main

HEX = "7f3a9c0d1e2b55aa41c0"
RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}
  model_configs:
  - alias: writer
    model: m-1
    provider: hosted
    inference_parameters: {temperature: 0.3, max_parallel_requests: 2}
"""


@dataclass(frozen=True)
class Case:
    planted: str
    provider: str = "endpoint: 'http://127.0.0.1:9/v1', api_key: HOSTED_KEY"
    recipe: Callable[[str], str] = lambda text: text
    subject: str = "provider 'hosted'"


CASES = {
    "userinfo": Case(f"sk-userinfo-{HEX}", f"endpoint: 'http://user:sk-userinfo-{HEX}@127.0.0.1:9/v1'"),
    "query": Case(f"sk-query-{HEX}", f"endpoint: 'http://127.0.0.1:9/v1?api_key=sk-query-{HEX}'"),
    "query-innocent-name": Case(f"qs{HEX}Zq{HEX}", f"endpoint: 'http://127.0.0.1:9/v1?client=qs{HEX}Zq{HEX}'"),
    "header-value": Case(
        f"sk-header-{HEX}",
        f"endpoint: 'http://127.0.0.1:9/v1', extra_headers: {{X-Upstream: 'Bearer sk-header-{HEX}'}}",
    ),
    "extra-body-nested": Case(
        "horse-battery-staple-41",
        "endpoint: 'http://127.0.0.1:9/v1', extra_body: {upstream: {auth: {password: horse-battery-staple-41}}}",
    ),
    "model-extra-body": Case(
        "horse-battery-staple-42",
        recipe=lambda text: text.replace(
            "max_parallel_requests: 2}",
            "max_parallel_requests: 2, extra_body: {access_token: horse-battery-staple-42}}",
        ),
        subject="model alias 'writer'",
    ),
    **{
        f"header-name-{name}": Case(
            f"horse-battery-staple-{i}",
            f"endpoint: 'http://127.0.0.1:9/v1', extra_headers: {{{name}: horse-battery-staple-{i}}}",
        )
        for i, name in enumerate(["X-API-KEYS", "Api-Keys", "X-JWT-Assertion", "X-Bearer", "X-Api-Pass"])
    },
    "all-capitals-literal-key": Case(
        "LIVEKEY7F3A9C0D1E2B55", "endpoint: 'http://127.0.0.1:9/v1', api_key: LIVEKEY7F3A9C0D1E2B55"
    ),
}


def _stand_ins(bin_dir: Path, record: Path) -> None:
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {record}\necho 4242\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'MaxArraySize = 1001'\n")
    for tool in ("sbatch", "scontrol"):
        (bin_dir / tool).chmod(0o755)


@pytest.mark.parametrize("name", list(CASES))
def test_planted_credential_is_refused_and_appears_nowhere(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[name]
    home = tmp_path / "dd"
    home.mkdir()
    planted_files = {home / "model_providers.yaml", tmp_path / "recipe.yaml"}
    (home / "model_providers.yaml").write_text(f"providers:\n- {{name: hosted, {case.provider}}}\n")
    (tmp_path / "recipe.yaml").write_text(case.recipe(RECIPE))
    run = tmp_path / "run.yaml"
    run.write_text("name: unit\nrecipe: recipe.yaml\nnum_records: 4\nshards: 2\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"workspace: work\npython_env: {Path(sys.executable).parent.parent}\ncpu_partition: cpu\n")
    record = tmp_path / "sbatch-calls.txt"
    _stand_ins(tmp_path / "bin", record)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("DATA_DESIGNER_HOME", str(home))
    monkeypatch.setenv("HOSTED_KEY", "k" * 24)

    codes = [
        main(["submit", str(run), "--profile", str(profile)]),
        main(["submit", str(run), "--profile", str(profile), "--dry-run"]),
        main(["submit", str(run), "--profile", str(profile), "--json"]),
        main(["providers", str(run)]),
        main(["providers", str(run), "--json"]),
        main(["providers", str(run), "--check", "--timeout", "2"]),
    ]

    printed = capsys.readouterr()
    assert codes == [2, 2, 2, 1, 1, 1], printed.err
    assert case.subject in printed.err  # the provider (or model alias) is named ...
    assert case.planted not in printed.out + printed.err  # ... and the value never
    assert not record.exists()  # nothing was submitted
    assert not (tmp_path / "work").exists()  # nothing was written
    leaked = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and p not in planted_files and case.planted.encode() in p.read_bytes()
    ]
    assert leaked == []
