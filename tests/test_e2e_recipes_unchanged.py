"""Recipes run on the cluster as they run on a laptop, end to end on the real local Slurm cluster and the real
engine, each compared with a plain local ``DataDesigner.create`` of the same recipe (the oracle):

- a builder script using a real plugin package from the registry (``data-designer-lambda-column``, Python >= 3.12),
  with a ``python_env`` of Python 3.12 that has it: the plugin is found there, recorded in the plan, and used on
  the nodes; with a ``python_env`` that lacks it the run is refused at submit, naming the type;
- a builder script whose seed is ``Path(__file__).parent / "seed.csv"``, with a custom column, a judge whose
  option keys are integers, a structured column whose output schema (a pydantic model) lists its fields out of
  alphabetical order, with descriptions, and an expression over it: the node takes the custom column and the judge
  from the run's copy of the script, so the custom function runs and the scores stay integers, and the structured
  column's schema reaches the node in the builder's field order (it is in the prompt Data Designer sends), so every
  row is the local run's, column for column and in its column order. Twice, each submitted by this workspace's
  launcher (in process): with this workspace's ``python_env`` (Data Designer 0.9.7), and with one of Data Designer
  ``NODE_DD`` (the newest supported, 1.0.0rc1; ``DDSLURM_NODE_DD`` chooses another) holding this checkout's ddslurm,
  where the script runs, the nodes generate and the oracle runs: the plan records that version, and the columns
  rebuilt from the script, the submit note and the rows are the same as under 0.9.7.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import PluginRecord, RunLayout, read_plan
from ddslurm.launcher import BuilderError, Slurm, SubmitError, collect_local, run_status, submit
from ddslurm.launcher.commands._console import plan_notes
from tests.e2e import REPO, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

PLUGIN = ("data-designer-lambda-column", "0.1.1")
"""This workspace's Data Designer (``.venv``'s)."""
TOPICS = ["rain", "bread", "glass", "moss", "salt", "wool", "tin"]  # 7 rows over 3 shards: 3, 2, 2

PLUGIN_BUILD = """\
from pathlib import Path

import data_designer.config as dd
from data_designer_lambda_column.plugin import LambdaColumnConfig

HERE = Path(__file__).parent


def shout(row):
    return row["topic"].upper() + "!"


def load_config_builder() -> dd.DataDesignerConfigBuilder:
    builder = dd.DataDesignerConfigBuilder()
    builder.with_seed_dataset(dd.LocalFileSeedSource(path=str(HERE / "topics.csv")), sampling_strategy="ordered")
    builder.add_column(LambdaColumnConfig(name="loud", required_cols=["topic"], column_function=shout))
    builder.add_column(dd.ExpressionColumnConfig(name="size", expr="{{ loud | length }}", dtype="int"))
    return builder
"""

PLUGIN_YAML = """\
data_designer:
  seed_config: {source: {seed_type: local, path: topics.csv}, sampling_strategy: ordered}
  columns:
  - {name: loud, column_type: lambda-column, required_cols: [topic]}
"""

BUILD = """\
from pathlib import Path

import data_designer.config as dd
from pydantic import BaseModel, Field

HERE = Path(__file__).parent


class Verdict(BaseModel):  # fields out of alphabetical order: Data Designer's write_config sorts them by default
    verdict: str = Field(description="yes or no")
    reason: str = Field(description="why, in one sentence")
    confidence: int = Field(description="from 0 to 9")


@dd.custom_column_generator(required_columns=["topic"])
def shout(row):
    row["loud"] = row["topic"].upper() + "!"
    return row


def load_config_builder() -> dd.DataDesignerConfigBuilder:
    params = dd.ChatCompletionInferenceParams(max_parallel_requests=4, max_tokens=64)
    builder = dd.DataDesignerConfigBuilder(
        model_configs=[dd.ModelConfig(alias="judge", model="demo/judge-70b", provider="demo-hosted",
                                      inference_parameters=params)]
    )
    builder.with_seed_dataset(dd.LocalFileSeedSource(path=str(HERE / "seed.csv")), sampling_strategy="ordered")
    builder.add_column(dd.CustomColumnConfig(name="loud", generator_function=shout))
    builder.add_column(
        dd.LLMJudgeColumnConfig(
            name="grade",
            model_alias="judge",
            prompt="Grade {{ loud }}.",
            scores=[dd.Score(name="quality", description="How good", options={1: "bad", 2: "fine", 3: "good"})],
        )
    )
    builder.add_column(
        dd.LLMStructuredColumnConfig(
            name="answer", model_alias="judge", prompt="Is {{ loud }} loud? {{ grade }}", output_format=Verdict
        )
    )  # after the judge: siblings of Data Designer's DAG come in an order that varies between its processes
    builder.add_column(dd.ExpressionColumnConfig(name="said", expr="{{ answer.verdict }} ({{ loud }})"))
    return builder
"""

ORACLE = """\
import json, os, sys
from pathlib import Path
os.environ["NEMO_TELEMETRY_ENABLED"] = "false"
import data_designer.config as dd
from data_designer.engine.secret_resolver import EnvironmentResolver
from data_designer.interface import DataDesigner

job = json.loads(sys.argv[1])
if job.get("script"):
    sys.path.insert(0, str(Path(job["script"]).parent))
    import importlib.util
    spec = importlib.util.spec_from_file_location("build", job["script"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    builder = module.load_config_builder()
else:
    builder = dd.DataDesignerConfigBuilder.from_config(job["recipe"])
designer = DataDesigner(
    artifact_path=job["out"],
    model_providers=[dd.ModelProvider(name="demo-hosted", endpoint=job["endpoint"], api_key=job["key_env"])],
    secret_resolver=EnvironmentResolver(),
)
result = designer.create(builder, num_records=job["records"], dataset_name="oracle")
result.load_dataset().to_parquet(job["parquet"])
"""


def _oracle(python: Path, job: dict[str, Any], files: Any, tmp: Path) -> list[dict[str, Any]]:
    """The rows of a plain local ``DataDesigner.create`` run by ``python`` (in its own Data Designer home)."""
    out = tmp / "oracle"
    home = tmp / "oracle-home"
    job = {**job, "out": str(out), "parquet": str(tmp / "oracle.parquet"), "key_env": "DEMO_HOSTED_API_KEY"}
    env = {**files.env, "DATA_DESIGNER_HOME": str(home)}
    done = subprocess.run(
        [str(python), "-c", ORACLE, json.dumps(job)], env=env, cwd=tmp, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return pq.read_table(tmp / "oracle.parquet").to_pylist()


def _builder_run(make_run_files: Any, name: str, script: str, seed: str) -> Any:
    """Run files whose recipe is ``recipes/build.py`` (``script``), with the topics as ``recipes/<seed>``."""
    files = make_run_files(name, num_records=7, shards=3, buffer_size=3)
    recipes = files.root / "recipes"
    recipes.mkdir()
    (recipes / "build.py").write_text(script)
    (recipes / seed).write_text("topic\n" + "\n".join(TOPICS) + "\n")
    files.run_file.write_text(files.run_file.read_text().replace("recipe: recipe.yaml", "recipe: recipes/build.py"))
    return files


def _finish(layout: RunLayout, slurm: Slurm) -> list[dict[str, Any]]:
    """The collected rows of the run, once it succeeded."""
    status = until(
        lambda: (s := run_status(layout, slurm)).state not in {"pending", "running"} and s, 300, "the run to end"
    )
    assert status.state == "succeeded", status
    return pq.read_table(collect_local(layout, overwrite=False).dataset).to_pylist()


def _python(version: str) -> str:
    """An installed interpreter of ``version``: on PATH, or one of pyenv's versions."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False).stdout.strip()
        candidates += [str(p) for p in sorted(Path(root).glob(f"versions/{version}*/bin/python3"))]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "--version"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.startswith(f"Python {version}"):
            return candidate
    raise AssertionError(f"Python {version} is not installed (looked on PATH and in pyenv's versions)")


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python 3.12 ``python_env`` with ddslurm's runtime, this Data Designer and the plugin from the registry."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build the plugin's environment"
    python = _python("3.12")
    env = tmp_path_factory.mktemp("py312") / "venv"
    subprocess.run([uv, "venv", "-q", "-p", python, str(env)], check=True, timeout=120)
    packages = [f"data-designer=={importlib.metadata.version('data-designer')}", "==".join(PLUGIN)]
    editable = ["-e", str(REPO / "packages" / "config"), "-e", str(REPO / "packages" / "runtime")]
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(env / "bin" / "python"), *editable, *packages],
        check=True,
        timeout=600,
    )
    return env


def test_a_plugin_recipe_runs_with_the_plugin_of_python_env_and_matches_a_local_run(
    make_run_files: Any, plugin_env: Path, tmp_path: Path
) -> None:
    """The submitting environment (this one) has no such plugin and cannot import the script; python_env has it:
    the script runs there, the plan records the plugin, and the nodes take the lambda column (whose function the
    YAML leaves out) from the run's copy of the script."""
    files = _builder_run(make_run_files, "plugin", PLUGIN_BUILD, "topics.csv")
    recipes = files.root / "recipes"
    plain_profile = files.profile.read_text()
    files.profile.write_text(plain_profile.replace(f"python_env: {REPO / '.venv'}", f"python_env: {plugin_env}"))

    slurm = Slurm(env=files.env)
    done = submit(files.run_file, files.profile, slurm=slurm, env=files.env)
    layout = RunLayout(done.layout.root)
    plan = read_plan(layout.plan)
    assert plan.plugins == (
        PluginRecord(name="lambda-column", plugin_type="column-generator", distribution=PLUGIN[0], version=PLUGIN[1]),
    )
    assert plan.recipe_source is not None and plan.recipe_source.rebuild == ("loud",), plan.recipe_source
    rows = _finish(layout, slurm)

    job = {"script": str(recipes / "build.py"), "endpoint": "http://127.0.0.1:9/v1", "records": 7}
    oracle = _oracle(plugin_env / "bin" / "python", job, files, tmp_path)
    fields = ("topic", "loud", "size")
    assert sorted(tuple(r[f] for f in fields) for r in rows) == sorted(tuple(r[f] for f in fields) for r in oracle)
    assert sorted(r["loud"] for r in rows) == sorted(t.upper() + "!" for t in TOPICS)

    # A python_env without the plugin: refused before anything is written: the script cannot import it, and a
    # config naming its column type is refused naming the column and the type.
    runs = sorted(p.name for p in files.workspace.joinpath("runs").iterdir())
    files.profile.write_text(plain_profile)
    with pytest.raises(BuilderError, match="No module named 'data_designer_lambda_column'"):
        submit(files.run_file, files.profile, slurm=slurm, env=files.env)
    (files.root / "recipe.yaml").write_text(PLUGIN_YAML)
    (files.root / "topics.csv").write_text("topic\n" + "\n".join(TOPICS) + "\n")
    files.run_file.write_text(files.run_file.read_text().replace("recipe: recipes/build.py", "recipe: recipe.yaml"))
    with pytest.raises(SubmitError) as refused:
        submit(files.run_file, files.profile, slurm=slurm, env=files.env)
    message = str(refused.value)
    assert "column 'loud': column_type 'lambda-column' is neither built into" in message, message
    assert str(REPO / ".venv") in message, message
    assert sorted(p.name for p in files.workspace.joinpath("runs").iterdir()) == runs


def test_a_builder_script_with_a_custom_column_and_integer_judge_keys_matches_a_local_run(
    make_run_files: Any, hosted_endpoint: Any, scan_for_secret: Any, builder_env: tuple[Path, str], tmp_path: Path
) -> None:
    """Submitted by this workspace's launcher (in process); the script run, and the rows made, by the Data Designer
    of ``builder_env``; the oracle is that Data Designer's own ``create`` on the builder."""
    python_env, dd_version = builder_env
    files = _builder_run(make_run_files, "custom", BUILD, "seed.csv")
    recipes = files.root / "recipes"
    files.profile.write_text(
        files.profile.read_text().replace(f"python_env: {REPO / '.venv'}", f"python_env: {python_env}")
    )

    slurm = Slurm(env=files.env)
    done = submit(files.run_file, files.profile, slurm=slurm, env=files.env)
    layout = RunLayout(done.layout.root)
    plan = read_plan(layout.plan)
    assert plan.data_designer_version == dd_version, plan.data_designer_version
    # the structured column is carried by the YAML (written in the builder's key order), the others are not
    assert plan.recipe_source is not None and plan.recipe_source.rebuild == ("grade", "loud"), plan.recipe_source
    [note] = [n for n in plan_notes(plan) if "run's copy of" in n]
    assert "'grade': scores[0].options: keys 1, 2, 3 read back as '1', '2', '3'" in note, note
    assert "'loud': Data Designer cannot read it back" in note and "'answer'" not in note, note
    stored = json.loads(layout.recipe.read_text())["data_designer"]["columns"]
    schema = next(c for c in stored if c["name"] == "answer")["output_format"]
    assert list(schema["properties"]) == ["verdict", "reason", "confidence"], schema
    rows = _finish(layout, slurm)

    job = {"script": str(recipes / "build.py"), "endpoint": hosted_endpoint.base_url, "records": 7}
    oracle = _oracle(python_env / "bin" / "python", job, files, tmp_path)
    assert [list(r) for r in rows] == [list(r) for r in oracle]  # the same columns, in the same order
    assert list(rows[0]) == ["topic", "loud", "grade", "answer", "said"], list(rows[0])
    mine = sorted(rows, key=lambda r: r["topic"])
    theirs = sorted(oracle, key=lambda r: r["topic"])
    for column in rows[0]:  # column by column first: a failure names the column that differs
        assert [r[column] for r in mine] == [r[column] for r in theirs], column
    assert mine == theirs
    assert [r["loud"] for r in mine] == [t.upper() + "!" for t in sorted(TOPICS)]
    assert all(isinstance(r["grade"]["quality"]["score"], int) for r in mine), mine[0]
    assert all(list(r["answer"]) == ["verdict", "reason", "confidence"] for r in mine), mine[0]
    assert scan_for_secret(layout.root, files.env["DEMO_HOSTED_API_KEY"]) == []
