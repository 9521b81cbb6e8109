"""Issue 37: a builder script runs twice at submit, once to build the config and once more inside Data Designer's
check (for the columns the YAML does not carry, here a custom column). Both runs start from the same environment,
the submitting shell's without any of its secrets (the run's hosted key, other providers' keys, MCP servers' keys
and ``${VAR}`` values, ``*_TOKEN`` variables), and whatever either run prints or raises is shown, in ``submit``'s
error and in its ``--json`` output, with every secret value of the shell redacted. (Hygiene, not a barrier: the
script is the user's own code and can read what the user can; here it reads the values from a file.)"""

from __future__ import annotations

import io
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ddslurm.launcher import Slurm, prepare
from ddslurm.launcher.cli import main
from ddslurm.launcher.testing import FakeSlurm, write_unit_run

pytestmark = pytest.mark.dd

SECRETS = {
    "HOSTED_KEY": "sk-builder-runs-" + "0123456789abcdef",  # the run's hosted provider's key
    "OTHER_PROVIDER_ACCESS": "other-provider-plain-words",  # another provider's key, under a plain name
    "SEARCH_ACCESS": "search-mcp-plain-words",  # a remote MCP server's key, under a plain name
    "DOCS_SESAME": "correct-horse-battery-staple",  # a stdio MCP server's ${VAR}
    "CI_JOB_TOKEN": "plainvalue1234",  # a *_TOKEN variable of the shell
}
PROVIDERS = (
    "- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HOSTED_KEY}\n"
    "- {name: other, endpoint: 'http://127.0.0.1:9/v1', api_key: OTHER_PROVIDER_ACCESS}\n"
)
MCP_PROVIDERS = """\
providers:
- {name: search, provider_type: streamable_http, endpoint: 'http://127.0.0.1:9/mcp', api_key: SEARCH_ACCESS}
- {name: docs, provider_type: stdio, command: docs-server, env: {T: '${DOCS_SESAME}'}}
"""
SET_BY_EACH_RUN = {
    "DATA_DESIGNER_HOME", "DATA_DESIGNER_MANAGED_ASSETS_PATH", "NEMO_TELEMETRY_ENABLED", "HF_HUB_OFFLINE",
}  # fmt: skip
"""Where each run points Data Designer (its settings, its check's scratch home), and nothing else."""

SCRIPT = """\
import json
import os
from pathlib import Path

import data_designer.config as dd

HERE = Path(__file__).parent


@dd.custom_column_generator(required_columns=["topic"])
def shout(row):
    row["loud"] = row["topic"].upper()
    return row


def load_config_builder():
    runs = HERE / "runs.jsonl"
    before = runs.read_text().count("\\n") if runs.exists() else 0
    with runs.open("a") as out:
        out.write(json.dumps(dict(os.environ)) + "\\n")
    if before and (HERE / "fail-second").exists():
        read = (HERE / "read-elsewhere.txt").read_text()  # the user's code reads what the user can
        print("the second run's keys:", read, sorted(os.environ.items()), flush=True)
        if (HERE / "fail-second").read_text() == "exit":
            os._exit(3)  # no answer: submit shows the end of what the check printed
        raise RuntimeError("cannot build: " + read)
    builder = dd.DataDesignerConfigBuilder(
        model_configs=[dd.ModelConfig(alias="writer", model="m-1", provider="hosted")]
    )
    builder.add_column(
        dd.SamplerColumnConfig(name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a"]))
    )
    builder.add_column(dd.CustomColumnConfig(name="loud", generator_function=shout))
    builder.add_column(dd.LLMTextColumnConfig(name="q", model_alias="writer", prompt="Say {{ loud }}"))
    return builder
"""


def _builder_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, dict[str, str]]:
    """A run whose recipe is SCRIPT, and the submitting shell's environment (this process's, as the CLI's is)
    holding every secret of SECRETS and a plain variable."""
    run, profile, env = write_unit_run(tmp_path, SECRETS["HOSTED_KEY"], providers=PROVIDERS)
    (tmp_path / "dd" / "mcp_providers.yaml").write_text(MCP_PROVIDERS)
    (tmp_path / "build.py").write_text(SCRIPT)
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: build.py"))
    for name, value in {**SECRETS, "TOPIC_WORD": "plain"}.items():
        monkeypatch.setenv(name, value)
    return run, profile, {**os.environ, "DATA_DESIGNER_HOME": env["DATA_DESIGNER_HOME"]}


def _runs(tmp_path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]


def test_both_runs_of_a_builder_script_see_the_same_environment_without_any_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, profile, env = _builder_run(tmp_path, monkeypatch)
    prepared = prepare(run, profile, env, datetime.now(UTC))
    assert prepared.plan.recipe_source is not None and prepared.plan.recipe_source.rebuild == ("loud",)
    first, second = _runs(tmp_path)  # the build, then Data Designer's check running it again
    for seen in (first, second):
        assert not set(SECRETS) & set(seen), set(SECRETS) & set(seen)
        assert not any(value in json.dumps(seen) for value in SECRETS.values())
        assert seen["TOPIC_WORD"] == "plain"
    assert first["DATA_DESIGNER_HOME"] == str(tmp_path / "dd")  # its settings; the check's: a scratch home
    assert second["DATA_DESIGNER_HOME"] != first["DATA_DESIGNER_HOME"]
    same = {k: v for k, v in first.items() if k not in SET_BY_EACH_RUN}
    assert same == {k: v for k, v in second.items() if k not in SET_BY_EACH_RUN}


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_what_a_failing_second_run_prints_is_redacted_in_the_error_and_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    run, profile, env = _builder_run(tmp_path, monkeypatch)
    (tmp_path / "read-elsewhere.txt").write_text(" ".join(f"{n}={v}" for n, v in SECRETS.items()))
    (tmp_path / "fail-second").write_text(how)
    out, err = io.StringIO(), io.StringIO()
    argv = ["submit", str(run), "--profile", str(profile), "--dry-run", "--json"]
    code = main(argv, env=env, slurm=Slurm(FakeSlurm()), stdout=out, stderr=err)
    assert len(_runs(tmp_path)) == 2  # the second run is the one that failed
    printed = out.getvalue() + err.getvalue()
    assert code == 2, printed
    for value in SECRETS.values():
        assert value not in printed
    error: dict[str, Any] = json.loads(out.getvalue())["error"]
    assert "Data Designer refuses the recipe" in error["message"]
    for name in SECRETS:  # what it read is shown, every value redacted, in the JSON and on standard error alike
        assert f"{name}=<${name} redacted>" in error["message"], error["message"]
        assert f"{name}=<${name} redacted>" in err.getvalue()
    assert not (tmp_path / "work").exists()
