"""Recipes built by Python: a builder script in Data Designer's convention (``recipe: build.py``), a named function
(``build.py:make``, ``package.module:make``), and every way one can fail. The script runs in a subprocess with
the real Data Designer; what the run stores is what Data Designer's own CLI loader and ``write_config`` give."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import (
    ConfigFileError,
    ProviderSnapshot,
    RunFile,
    load_run_file,
    read_json,
    recipe_with_models,
    sha256_bytes,
    sha256_file,
)
from ddslurm.config import Plan as PlanRecord
from ddslurm.launcher import BuilderError, LoadedRecipe, SubmitError, load_run_recipe, prepare, write_run_dir
from ddslurm.launcher.testing import accept_recipe, write_unit_run

pytestmark = pytest.mark.dd

KEY = "sk-recipe-test-value-0123456789"

BUILDER = """\
import data_designer.config as dd

print("building the unit recipe")


def unit_builder() -> dd.DataDesignerConfigBuilder:
    params = dd.ChatCompletionInferenceParams(temperature=0.3, max_parallel_requests=8)
    builder = dd.DataDesignerConfigBuilder(
        model_configs=[dd.ModelConfig(alias="writer", model="m-1", provider="hosted", inference_parameters=params)]
    )
    builder.add_column(
        dd.SamplerColumnConfig(
            name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a", "b"])
        )
    )
    builder.add_column(dd.LLMTextColumnConfig(name="q", model_alias="writer", prompt="Say {{ topic }}"))
    return builder


def load_config_builder() -> dd.DataDesignerConfigBuilder:
    return unit_builder()
"""


def _script(path: Path, extra: str = "", *, body: str = BUILDER) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body + textwrap.dedent(extra))
    return path


def _use_recipe(run: Path, recipe: str) -> RunFile:
    run.write_text(run.read_text().replace("recipe: recipe.yaml", f"recipe: {recipe}"))
    return load_run_file(run)


def _dd_cli_yaml(script: Path) -> str:
    """What Data Designer's own CLI loader gives for ``script``, written by ``write_config`` in the config's own
    key order (``sort_keys=False``: sorted, an output schema's fields would not be the builder's)."""
    from data_designer.cli.utils.config_loader import load_config_builder

    builder = load_config_builder(str(script))
    out = script.parent / "dd-cli-written.yaml"
    builder.write_config(out, sort_keys=False)
    text = out.read_text()
    out.unlink()
    return text


def _load(tmp_path: Path, run_file: RunFile, env: dict[str, str], **kwargs: Any) -> LoadedRecipe:
    """The run file's recipe, loaded as ``prepare`` loads it (the stand-in python_env of ``write_unit_run``)."""
    runtime = tmp_path / "venv" / "bin" / "ddslurm-runtime"
    return load_run_recipe(run_file, tmp_path / "run.yaml", env, tmp_path / "dd", runtime=runtime, **kwargs)


def test_a_script_in_data_designers_convention_yields_what_data_designer_writes(tmp_path: Path) -> None:
    run, _, env = write_unit_run(tmp_path, KEY)
    script = _script(tmp_path / "recipes" / "build.py")
    loaded = _load(tmp_path, _use_recipe(run, "recipes/build.py"), env)
    assert loaded.stored.decode() == _dd_cli_yaml(script)  # byte for byte what `data-designer create build.py` uses
    assert loaded.path == script and loaded.source == script.read_bytes()
    assert loaded.builder == f"{script}:load_config_builder"
    assert loaded.ref.kind == "script"
    columns = [c["name"] for c in loaded.data["data_designer"]["columns"]]
    assert columns == ["topic", "q"]
    assert loaded.data["data_designer"]["model_configs"][0]["provider"] == "hosted"


@pytest.mark.parametrize(
    ("signature", "call"),
    [
        pytest.param("params", "params.argv", id="positional-script-params"),
        pytest.param("*, params", "params.argv", id="keyword-only-script-params"),
    ],
)
def test_the_function_may_take_data_designers_script_params(tmp_path: Path, signature: str, call: str) -> None:
    run, _, env = write_unit_run(tmp_path, KEY)
    _script(
        tmp_path / "build.py",
        f"""
        def with_params({signature}):
            assert {call} == (), {call}
            assert type(params).__name__ == "DataDesignerScriptParams"
            return unit_builder()
        """,
    )
    loaded = _load(tmp_path, _use_recipe(run, "build.py:with_params"), env)
    assert [c["name"] for c in loaded.data["data_designer"]["columns"]] == ["topic", "q"]


def test_module_function_returning_a_config_object(tmp_path: Path) -> None:
    run, _, env = write_unit_run(tmp_path, KEY)
    package = tmp_path / "unitrecipes"
    module = _script(
        package / "build.py",
        """
        def config():
            return unit_builder().build()  # a DataDesignerConfig, not a builder
        """,
    )
    (package / "__init__.py").write_text("")
    loaded = _load(tmp_path, _use_recipe(run, "unitrecipes.build:config"), env)
    assert loaded.path == module and loaded.source == module.read_bytes()
    assert loaded.builder == "unitrecipes.build:config" and loaded.ref.kind == "module"
    assert loaded.stored.decode() == _dd_cli_yaml(module)  # BuilderConfig(data_designer=...).to_yaml() == write_config


def test_prepare_from_a_builder_script_plans_what_the_equivalent_yaml_recipe_plans(tmp_path: Path) -> None:
    """`recipe: build.py` and `recipe: recipe.yaml` written by the script's own builder give the same plan, the
    same stored recipe and the same seed capture (relative seed paths resolved from the script's directory);
    the script is kept as inputs/recipe-source.py, its sha256 in the plan. Data Designer's validation runs."""
    run, profile, env = write_unit_run(tmp_path, KEY)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "seed.csv").write_text("subject\nx\ny\nz\n")
    seeded = BUILDER.replace(
        "    return builder\n",
        '    builder.with_seed_dataset(dd.LocalFileSeedSource(path="seed.csv"))\n    return builder\n',
        1,
    )
    script = _script(recipes / "build.py", body=seeded)
    (recipes / "recipe.yaml").write_text(_dd_cli_yaml_in(script))

    _use_recipe(run, "recipes/recipe.yaml")
    from_yaml = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    run.write_text(run.read_text().replace("recipes/recipe.yaml", "recipes/build.py"))
    from_script = prepare(run, profile, env, datetime.now(UTC))  # with Data Designer's own validation

    def stored(prepared: Any) -> str:  # the stored recipe points at the run's copy of the seed
        return str(prepared.recipe_bytes.decode().replace(prepared.layout.run_id, "RUN"))

    assert stored(from_script) == stored(from_yaml)
    assert from_script.snapshot_bytes == from_yaml.snapshot_bytes
    seed = from_script.plan.seed
    assert seed is not None and seed.rows == 3 and [f.path for f in seed.files] == ["seed.csv"]
    source = from_script.plan.recipe_source
    assert source is not None and from_yaml.plan.recipe_source is None
    assert source.builder == f"{script}:load_config_builder" and source.origin == str(script)
    layout = from_script.layout
    assert source.file == str(layout.recipe_source)

    def comparable(prepared: Any) -> Any:  # the recipe's digest differs only by the run id in its seed path
        assert prepared.plan.recipe_sha256 == sha256_bytes(prepared.recipe_bytes)
        plan = msgspec.structs.replace(prepared.plan, recipe_source=None, recipe_sha256="")
        text = msgspec.json.encode(plan).decode().replace(prepared.layout.run_id, "RUN")
        return json.loads(text)

    assert comparable(from_script) == comparable(from_yaml)

    write_run_dir(from_script)
    assert layout.recipe_source.read_bytes() == script.read_bytes()
    assert layout.recipe.read_bytes() == from_script.recipe_bytes
    assert read_json(layout.plan, PlanRecord).recipe_source == source
    assert source.sha256 == sha256_file(layout.recipe_source)
    stored = json.loads(layout.recipe.read_text())
    assert stored["data_designer"]["seed_config"]["source"]["path"] == str(layout.seed_dir / "seed.csv")


@pytest.mark.parametrize(
    ("params", "runs_with"),
    [
        pytest.param("temperature=0.3", 12, id="unset-sized"),
        pytest.param("temperature=0.3, max_parallel_requests=4", 4, id="explicit-4-kept"),
    ],
)
def test_a_builders_max_parallel_requests_is_kept_only_when_the_script_sets_it(
    tmp_path: Path, params: str, runs_with: int
) -> None:
    """Data Designer writes every field of a model config, its default ``max_parallel_requests: 4`` included: the
    stored recipe keeps the field only when the script set it, so a deployed alias whose script left it out runs
    with the plan's replicas x capacity and one whose script chose 4 keeps 4, at submit and on the node."""
    deployment = (
        "client_workers: 1\n"
        "deployments:\n"
        "- {model_alias: writer, model: org/writer, replicas: 2, server: {extra_args: ['--max-num-seqs=6']}}\n"
    )
    run, profile, env = write_unit_run(tmp_path, KEY, run_extra=deployment)
    profile.write_text(profile.read_text() + "gpus_per_node: 4\n")
    body = BUILDER.replace("temperature=0.3, max_parallel_requests=8", params)
    assert body != BUILDER
    script = _script(tmp_path / "build.py", body=body)
    _use_recipe(run, "build.py")
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    written = _dd_cli_yaml(script)  # Data Designer's own text, which always has the field
    assert "      max_parallel_requests: 4\n" in written
    dropped = "" if runs_with == 4 else "      max_parallel_requests: 4\n"
    assert prepared.recipe_bytes.decode() == written.replace(dropped, "", 1)  # all else as Data Designer wrote it
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    assert prepared.plan.serving is not None and prepared.plan.serving.deployments[0].max_parallel_requests == 12
    node = recipe_with_models({}, snapshot, prepared.plan.serving)  # the node's model configs
    assert node["model_configs"][0]["inference_parameters"]["max_parallel_requests"] == runs_with


def _dd_cli_yaml_in(script: Path) -> str:
    import os

    here = Path.cwd()
    os.chdir(script.parent)  # Data Designer checks a relative seed path against the working directory
    try:
        return _dd_cli_yaml(script)
    finally:
        os.chdir(here)


STRUCTURED = """\
from pydantic import BaseModel, Field


class Verdict(BaseModel):  # out of alphabetical order: Data Designer's write_config sorts fields by default
    verdict: str = Field(description="yes or no")
    reason: str = Field(description="why, in one sentence")
    confidence: int = Field(description="from 0 to 9")


def with_answer():
    builder = unit_builder()
    builder.with_seed_dataset(dd.LocalFileSeedSource(path="seed.csv"))
    builder.add_column(
        dd.LLMStructuredColumnConfig(name="answer", model_alias="writer", prompt="{{ q }}?", output_format=Verdict)
    )
    builder.add_column(
        dd.LLMJudgeColumnConfig(
            name="grade",
            model_alias="writer",
            prompt="Grade {{ answer }}",
            scores=[dd.Score(name="quality", description="How good", options={2: "fine", 1: "bad"})],
        )
    )
    return builder
"""


def test_a_structured_columns_schema_reaches_the_run_in_the_builders_field_order(tmp_path: Path) -> None:
    """The stored recipe (after the seed capture rewrites it) keeps the output schema's field order and
    descriptions, which are in the prompt the column sends: the node reads the column from it; the judge, whose
    integer keys the YAML cannot keep, is taken from the script, and the plan and submit's note say why."""
    from ddslurm.launcher.commands._console import plan_notes

    run, profile, env = write_unit_run(tmp_path, KEY)
    (tmp_path / "seed.csv").write_text("subject\nx\ny\n")
    _script(tmp_path / "build.py", STRUCTURED)
    _use_recipe(run, "build.py:with_answer")
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    columns = {c["name"]: c for c in json.loads(prepared.recipe_bytes)["data_designer"]["columns"]}
    schema = columns["answer"]["output_format"]
    assert list(schema["properties"]) == ["verdict", "reason", "confidence"], schema
    assert schema["properties"]["confidence"]["description"] == "from 0 to 9"
    assert list(columns["grade"]["scores"][0]["options"]) == ["2", "1"]  # the builder's order; keys as strings
    source = prepared.plan.recipe_source
    assert source is not None and source.rebuild == ("grade",), source
    assert source.reasons == ("'grade': scores[0].options: keys 2, 1 read back as '2', '1'",)
    [note] = [n for n in plan_notes(prepared.plan) if "run's copy of" in n]
    assert note == (
        f"the nodes take column(s) 'grade' from the run's copy of {tmp_path / 'build.py'}:with_answer: Data "
        "Designer's YAML does not carry them as the builder made them ('grade': scores[0].options: keys 2, 1 read "
        "back as '2', '1')"
    )


def test_missing_script_or_module_is_an_error_at_the_run_files_recipe(tmp_path: Path) -> None:
    run, _, env = write_unit_run(tmp_path, KEY)
    with pytest.raises(ConfigFileError) as info:
        _load(tmp_path, _use_recipe(run, "build.py"), env)
    assert str(info.value) == (
        f"{run}:2:1: recipe: {tmp_path / 'build.py'} does not exist (a builder script, relative to the run file)"
    )
    run.write_text(run.read_text().replace("build.py", "no_such_package.recipes:make"))
    with pytest.raises(BuilderError, match=r"module 'no_such_package.recipes' cannot be imported: No module named"):
        _load(tmp_path, load_run_file(run), env)
    # a module name without its function reads as a file, and the error says how to name the function
    run.write_text(run.read_text().replace("no_such_package.recipes:make", "pkg.recipes"))
    with pytest.raises(
        ConfigFileError, match=r"does not exist \(a module's function is written pkg.recipes:function\)"
    ):
        _load(tmp_path, load_run_file(run), env)


def _error(tmp_path: Path, recipe: str, extra: str = "", *, body: str = BUILDER, **kwargs: Any) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    run, _, env = write_unit_run(tmp_path, KEY)
    _script(tmp_path / "build.py", extra, body=body)
    with pytest.raises(BuilderError) as info:
        _load(tmp_path, _use_recipe(run, recipe), env, **kwargs)
    return str(info.value)


def test_a_script_without_load_config_builder_says_what_data_designer_expects(tmp_path: Path) -> None:
    body = BUILDER.replace("def load_config_builder()", "def something_else()")
    message = _error(tmp_path, "build.py", body=body)
    assert message.startswith(
        f"{tmp_path / 'build.py'}: does not define a 'load_config_builder()' function (Data Designer's convention"
    )
    assert "def load_config_builder() -> DataDesignerConfigBuilder" in message
    assert "building the unit recipe" in message  # the script's own output, shown on failure


def test_a_missing_function_is_named(tmp_path: Path) -> None:
    assert _error(tmp_path, "build.py:make").startswith(f"{tmp_path / 'build.py'}: defines no function 'make'")


def test_a_function_returning_something_else_is_refused_at_its_definition(tmp_path: Path) -> None:
    message = _error(tmp_path, "build.py:wrong", "\n\ndef wrong():\n    return {'columns': []}\n")
    line = (tmp_path / "build.py").read_text().splitlines().index("def wrong():") + 1
    assert message.startswith(
        f"{tmp_path / 'build.py'}:{line}: wrong() returned dict, expected a DataDesignerConfigBuilder (or a Data "
        "Designer config: DataDesignerConfig, BuilderConfig)"
    )


def test_a_script_that_raises_is_placed_at_its_line_with_its_output(tmp_path: Path) -> None:
    extra = """

    def broken():
        print("about to fail")
        return helper()


    def helper():
        raise ValueError("no such topic list")
    """
    message = _error(tmp_path, "build.py:broken", extra)
    lines = (tmp_path / "build.py").read_text().splitlines()
    raise_line = lines.index('    raise ValueError("no such topic list")') + 1
    call_line = lines.index("    return helper()") + 1
    script = tmp_path / "build.py"
    assert message.startswith(f"{script}:{raise_line}: broken() raised ValueError: no such topic list\n")
    assert f"{script}:{call_line} in broken: return helper()" in message
    assert f"{script}:{raise_line} in helper: raise ValueError" in message
    assert "    about to fail" in message and "RuntimeWarning" not in message


def test_a_script_that_fails_to_import_or_parse_names_the_line(tmp_path: Path) -> None:
    message = _error(tmp_path, "build.py", body="import data_designer.config as dd\nx = (\n")
    assert message.startswith(f"{tmp_path / 'build.py'}:2: running the script raised SyntaxError: ")
    message = _error(tmp_path / "b", "build.py", body="import os\n\nimport no_such_module_here\n")
    assert message.startswith(
        f"{tmp_path / 'b' / 'build.py'}:3: running the script raised ModuleNotFoundError: No module named"
    )


def test_a_script_that_does_not_finish_is_stopped(tmp_path: Path) -> None:
    message = _error(
        tmp_path, "build.py", body="import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n", timeout_s=8
    )
    assert message.startswith(
        f"{tmp_path / 'build.py'}: load_config_builder() did not return a config within 8 s and was stopped"
    )
    assert "sleeping" in message


def test_a_dataframe_seed_cannot_be_stored(tmp_path: Path) -> None:
    extra = """

    def in_memory():
        import pandas as pd

        return unit_builder().with_seed_dataset(dd.DataFrameSeedSource(df=pd.DataFrame({"s": [1, 2]})))
    """
    message = _error(tmp_path, "build.py:in_memory", extra)
    assert "in_memory() returned a config that Data Designer cannot write: BuilderSerializationError" in message


def test_the_script_sees_no_secret_and_the_home_ddslurm_uses(tmp_path: Path) -> None:
    run, _, env = write_unit_run(tmp_path, KEY)
    probe = tmp_path / "env.json"
    env |= {
        "OTHER_SERVICE_TOKEN": "abcdefgh12345678",  # a credential by its name
        "INNOCENT": "nvapi-" + "x1" * 20,  # a credential by its value
        "HF_TOKEN": "hf_serverside0123456789",  # a deployment's server.env_from
        "PROBE": str(probe),
        "TOPIC_WORD": "plain",
    }
    run.write_text(run.read_text() + "deployments:\n- {model_alias: other, model: m, server: {env_from: [HF_TOKEN]}}\n")
    _script(
        tmp_path / "build.py",
        """

        def probed():
            import json, os

            with open(os.environ["PROBE"], "w") as fh:
                json.dump(dict(os.environ), fh)
            return unit_builder()
        """,
    )
    _load(tmp_path, _use_recipe(run, "build.py:probed"), env)
    seen = json.loads(probe.read_text())
    for name in ("HOSTED_KEY", "OTHER_SERVICE_TOKEN", "INNOCENT", "HF_TOKEN"):
        assert name not in seen
    assert seen["TOPIC_WORD"] == "plain" and seen["PATH"] == env["PATH"]
    assert seen["DATA_DESIGNER_HOME"] == str(tmp_path / "dd")
    assert seen["NEMO_TELEMETRY_ENABLED"] == "false"


def test_a_key_that_reaches_the_config_or_the_script_is_refused_without_showing_it(tmp_path: Path) -> None:
    """The script cannot see the key in its environment; one it reads from elsewhere is caught before it is kept:
    in the config, in the script itself, or in what a failing script printed (redacted)."""
    extra = """

    def leaky():
        builder = unit_builder()
        builder.add_column(dd.ExpressionColumnConfig(name="k", expr=open("key.txt").read()))
        return builder


    def loud():
        print("the key is", open("key.txt").read())
        raise RuntimeError("failed")
    """
    (tmp_path / "leaky").mkdir()
    (tmp_path / "leaky" / "key.txt").write_text(KEY)
    message = _error(tmp_path / "leaky", "build.py:leaky", extra)
    assert "leaky() returned holds the value of $HOSTED_KEY, a secret" in message and KEY not in message

    (tmp_path / "loud").mkdir()
    (tmp_path / "loud" / "key.txt").write_text(KEY)
    message = _error(tmp_path / "loud", "build.py:loud", extra)
    assert "loud() raised RuntimeError: failed" in message
    assert "the key is <$HOSTED_KEY redacted>" in message and KEY not in message

    message = _error(tmp_path / "literal", "build.py", body=BUILDER + f'\n\nAPI_KEY = "{KEY}"\n')
    assert "the script holds the value of $HOSTED_KEY, a secret" in message and KEY not in message


def test_submit_refuses_a_failing_script_before_writing_anything(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY)
    _script(tmp_path / "build.py", body="raise SystemExit(3)\n")
    _use_recipe(run, "build.py")
    with pytest.raises(SubmitError, match=r"build.py:1: running the script called sys.exit\(3\)"):
        prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    assert not (tmp_path / "work").exists()


def test_paths_and_the_working_directory_are_no_secrets_but_a_planted_key_still_is(tmp_path: Path) -> None:
    """``PWD`` (a credential word: ``pwd``), ``SSH_AUTH_SOCK`` (``auth``) and a key file's path hold places, not
    keys: a builder script's config may name files under the working directory (``Path(__file__).parent /
    "seed.csv"``), its errors show those paths as they are, and the script sees those variables. A password in a
    variable named for one is still hidden from the script, and a planted key still refused."""
    run, _, env = write_unit_run(tmp_path, KEY)
    places = {
        "PWD": str(tmp_path),
        "OLDPWD": str(tmp_path.parent),
        "SSH_AUTH_SOCK": "/tmp/ssh-XXXXabcd/agent.1234",
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "service-account.json"),
    }
    env |= places | {"DB_PASSWORD": "hunter2hunter2"}
    probe = tmp_path / "env.json"
    env["PROBE"] = str(probe)
    _script(
        tmp_path / "build.py",
        """

        def seeded():
            import json, os
            from pathlib import Path

            with open(os.environ["PROBE"], "w") as fh:
                json.dump(dict(os.environ), fh)
            builder = unit_builder()
            builder.add_column(dd.ExpressionColumnConfig(name="where", expr=str(Path(__file__).parent / "seed.csv")))
            return builder


        def failing():
            from pathlib import Path

            raise RuntimeError(f"no seed at {Path(__file__).parent / 'seed.csv'}")
        """,
    )
    loaded = _load(tmp_path, _use_recipe(run, "build.py:seeded"), env)
    assert str(tmp_path / "seed.csv") in loaded.stored.decode()
    seen = json.loads(probe.read_text())
    assert {name: seen.get(name) for name in places} == places
    assert "DB_PASSWORD" not in seen and "HOSTED_KEY" not in seen
    with pytest.raises(BuilderError) as info:
        run.write_text(run.read_text().replace("build.py:seeded", "build.py:failing"))
        _load(tmp_path, load_run_file(run), env)
    assert f"no seed at {tmp_path / 'seed.csv'}" in str(info.value) and "redacted" not in str(info.value)
    message = _error(tmp_path / "planted", "build.py", body=BUILDER + f'\n\nAPI_KEY = "{KEY}"\n')
    assert "the script holds the value of $HOSTED_KEY, a secret" in message and KEY not in message
