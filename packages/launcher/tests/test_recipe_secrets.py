"""A secret's value in the recipe, wherever it is, is refused at submit before anything is written: the recipe
text of a config file (YAML or JSON, comments included) is checked exactly as a builder script's config is, by
the same function, and so is the seed data the run would copy into its inputs. Errors name the file, the line
and the field, never the value."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.launcher import Slurm
from ddslurm.launcher.cli import main
from ddslurm.launcher.testing import FakeSlurm, write_unit_run

KEY = "sk-pasted-" + "9c0d1e2b55aa41c07f3a"
FIELD = "data_designer.columns[1].prompt"
REFUSED = "holds the value of $HOSTED_KEY, a secret (values are not shown)"

RECIPE = """\
data_designer:
  columns:
  - name: topic
    column_type: sampler
    sampler_type: category
    params: {sampler_type: category, values: [a, b]}
  - name: q
    column_type: llm-text
    model_alias: writer
    prompt: "Say {{ topic }}"
  model_configs:
  - {alias: writer, model: m-1, provider: hosted, inference_parameters: {temperature: 0.3, max_parallel_requests: 8}}
"""
PROMPT_LINE = 10  # the line of `prompt:` in RECIPE, and its column
PROMPT_COL = 5


def _dry_run(tmp_path: Path, env: dict[str, str], run: Path, profile: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    slurm = FakeSlurm()
    code = main(
        ["submit", str(run), "--profile", str(profile), "--dry-run"],
        env=env,
        slurm=Slurm(slurm),
        stdout=out,
        stderr=err,
    )
    assert slurm.calls == [] or all(call[0] != "sbatch" for call in slurm.calls)
    return code, out.getvalue(), err.getvalue()


def _refused(tmp_path: Path, env: dict[str, str], run: Path, profile: Path) -> str:
    code, out, err = _dry_run(tmp_path, env, run, profile)
    assert code == 2, out + err
    assert KEY not in out + err  # the value is never repeated
    assert not (tmp_path / "work").exists()  # no run directory, nothing written
    return err


def test_a_key_pasted_into_a_yaml_recipes_prompt_is_refused_at_the_field(tmp_path: Path) -> None:
    recipe = RECIPE.replace('"Say {{ topic }}"', f'"Say {{{{ topic }}}} using {KEY}"')
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=recipe)
    err = _refused(tmp_path, env, run, profile)
    assert f"{tmp_path / 'recipe.yaml'}:{PROMPT_LINE}:{PROMPT_COL}: {FIELD}: the recipe {REFUSED}" in err


def test_a_key_in_a_yaml_comment_is_refused_at_its_line(tmp_path: Path) -> None:
    recipe = RECIPE.replace("  model_configs:\n", f"  # the key: {KEY}\n  model_configs:\n")
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=recipe)
    err = _refused(tmp_path, env, run, profile)
    assert f"{tmp_path / 'recipe.yaml'}:11:{len('  # the key: ') + 1}: the recipe {REFUSED}" in err


def test_a_key_in_a_json_recipe_is_refused_at_its_json_path_even_escaped(tmp_path: Path) -> None:
    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)  # not in the file's bytes; in the value Data Designer reads
    data = {
        "data_designer": {
            "columns": [
                {
                    "name": "topic",
                    "column_type": "sampler",
                    "sampler_type": "category",
                    "params": {"sampler_type": "category", "values": ["a", "b"]},
                },
                {"name": "q", "column_type": "llm-text", "model_alias": "writer", "prompt": "PROMPT"},
            ],
            "model_configs": [{"alias": "writer", "model": "m-1", "provider": "hosted"}],
        }
    }
    text = json.dumps(data, indent=2).replace('"PROMPT"', f'"Say {{{{ topic }}}} {escaped}"')
    run, profile, env = write_unit_run(tmp_path, KEY)
    (tmp_path / "recipe.json").write_text(text)
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: recipe.json"))
    err = _refused(tmp_path, env, run, profile)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if '"prompt"' in ln)
    assert f"{tmp_path / 'recipe.json'}:{line}:" in err
    assert f": {FIELD}: the recipe {REFUSED}" in err


@pytest.mark.dd
def test_the_same_key_in_a_builder_scripts_config_is_refused_the_same_way(tmp_path: Path) -> None:
    """The script cannot see the key (its environment has none of the run's secrets); one it reads from a file
    reaches its config, and the config is refused by the check the YAML recipe goes through, field and all."""
    script = tmp_path / "build.py"
    script.write_text(
        textwrap.dedent(
            """\
            import data_designer.config as dd
            from pathlib import Path


            def load_config_builder() -> dd.DataDesignerConfigBuilder:
                key = (Path(__file__).parent / "key.txt").read_text()
                builder = dd.DataDesignerConfigBuilder(
                    model_configs=[dd.ModelConfig(alias="writer", model="m-1", provider="hosted")]
                )
                builder.add_column(
                    dd.SamplerColumnConfig(
                        name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a", "b"])
                    )
                )
                builder.add_column(
                    dd.LLMTextColumnConfig(name="q", model_alias="writer", prompt="Say {{ topic }} using " + key)
                )
                return builder
            """
        )
    )
    (tmp_path / "key.txt").write_text(KEY)
    run, profile, env = write_unit_run(tmp_path, KEY)
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: build.py"))
    err = _refused(tmp_path, env, run, profile)
    assert f"{script}: {FIELD}: the config that load_config_builder() returned {REFUSED}" in err


def _seed_recipe(path: str) -> str:
    return RECIPE.replace(
        "  model_configs:\n", f"  seed_config:\n    source: {{seed_type: local, path: {path}}}\n  model_configs:\n"
    )


def test_a_seed_cell_that_holds_the_key_is_refused(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=_seed_recipe("seeds/q.csv"))
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds" / "q.csv").write_text(f"subject,note\na,plain\nb,{KEY}\n")
    err = _refused(tmp_path, env, run, profile)
    text = (tmp_path / "recipe.yaml").read_text()
    number, line = next((i, ln) for i, ln in enumerate(text.splitlines(), 1) if "seeds/q.csv" in ln)
    place = f"{tmp_path / 'recipe.yaml'}:{number}:{line.index('path:') + 1}: seed_config.source.path"
    assert f"{place}: {tmp_path / 'seeds' / 'q.csv'} {REFUSED}" in err


def test_a_key_in_a_compressed_parquet_seed_is_refused(tmp_path: Path) -> None:
    """Compression and dictionary pages hide the key's bytes: the decoded values are searched, as on the node."""
    run, profile, env = write_unit_run(tmp_path, KEY, recipe=_seed_recipe("'seeds/*.parquet'"))
    (tmp_path / "seeds").mkdir()
    pq.write_table(pa.table({"subject": ["a", "b"]}), tmp_path / "seeds" / "part-0.parquet")
    # its two halves come first, so the compressor copies them into the full value (no statistics)
    table = pa.table({"subject": [KEY[:12] + "|", "|" + KEY[12:], f"note: {KEY}"]})
    pq.write_table(table, tmp_path / "seeds" / "part-1.parquet", compression="snappy", write_statistics=False)
    assert KEY.encode() not in (tmp_path / "seeds" / "part-1.parquet").read_bytes()
    err = _refused(tmp_path, env, run, profile)
    assert f"{tmp_path / 'seeds' / 'part-1.parquet'} {REFUSED}" in err


def test_a_key_in_the_run_file_is_refused_at_its_line(tmp_path: Path) -> None:
    """The run file is kept in the run's inputs too (``inputs/run.yaml``): the same check, comments included."""
    run, profile, env = write_unit_run(tmp_path, KEY, run_extra=f"# key for later: {KEY}\n")
    err = _refused(tmp_path, env, run, profile)
    assert f"{run}:5:{len('# key for later: ') + 1}: the run file {REFUSED}" in err


# Issue 37: the secrets are every key variable Data Designer's settings name, an MCP server's too. This one's value is
# plain words under a plain name: only its place in mcp_providers.yaml (a stdio server's ${VAR}) makes it a secret.
MCP_VALUE = "correct-horse-battery-staple"
MCP_PROVIDERS = "providers:\n- {name: docs, provider_type: stdio, command: docs-server, env: {T: '${DOCS_SESAME}'}}\n"


def _mcp_run(tmp_path: Path, **kwargs: str) -> tuple[Path, Path, dict[str, str]]:
    run, profile, env = write_unit_run(tmp_path, KEY, **kwargs)
    (tmp_path / "dd" / "mcp_providers.yaml").write_text(MCP_PROVIDERS)
    return run, profile, {**env, "DOCS_SESAME": MCP_VALUE}


def test_a_run_file_string_that_holds_an_mcp_servers_key_is_refused_at_its_field(tmp_path: Path) -> None:
    run, profile, env = _mcp_run(tmp_path, run_extra=f"submission:\n  account: {MCP_VALUE}\n")
    code, out, err = _dry_run(tmp_path, env, run, profile)
    assert code == 2 and MCP_VALUE not in out + err, out + err
    assert not (tmp_path / "work").exists()
    line = run.read_text().splitlines().index(f"  account: {MCP_VALUE}") + 1
    assert f"{run}:{line}:3: submission.account: the run file holds the value of $DOCS_SESAME, a secret" in err


def test_a_recipe_that_holds_an_mcp_servers_key_is_refused_at_its_field(tmp_path: Path) -> None:
    recipe = RECIPE.replace('"Say {{ topic }}"', f'"Say {{{{ topic }}}} {MCP_VALUE}"')
    run, profile, env = _mcp_run(tmp_path, recipe=recipe)
    code, out, err = _dry_run(tmp_path, env, run, profile)
    assert code == 2 and MCP_VALUE not in out + err, out + err
    place = f"{tmp_path / 'recipe.yaml'}:{PROMPT_LINE}:{PROMPT_COL}: {FIELD}"
    assert f"{place}: the recipe holds the value of $DOCS_SESAME, a secret (values are not shown)" in err
