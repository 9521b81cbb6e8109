"""Issue 40: a refusal of what a builder script made names the script's line that made it, as a YAML recipe's
names the field's line: a Jinja reference to no column (Data Designer's check) at the column's ``add_column`` line,
with a "did you mean" among the columns; a column's alias that nothing defines and a model config's provider that
Data Designer's home does not define (``providers`` and ``submit`` alike) at the column's and the model config's
lines, the provider with the providers there. The script runs as submit runs it (its own process); the line
numbers are counted here from the script's text."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ddslurm.launcher import Slurm, SubmitError, prepare
from ddslurm.launcher.cli import main
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, write_unit_run

pytestmark = pytest.mark.dd

KEY = "sk-builder-lines-0123456789abcdef"
PROVIDERS = "- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HOSTED_KEY}\n"
SCRIPT = """\
import data_designer.config as dd


def _writer(provider):
    return dd.ModelConfig(alias="writer", model="m-1", provider=provider)


def _length(builder, of):
    builder.add_column(name=f"{of}_chars", column_type="expression", expr="{{ " + of + " | length }}")


def load_config_builder():
    builder = dd.DataDesignerConfigBuilder(model_configs=[_writer("PROVIDER")])
    builder.add_column(
        dd.SamplerColumnConfig(name="topic", sampler_type="category", params=dd.CategorySamplerParams(values=["a"]))
    )
    builder.add_column(dd.LLMTextColumnConfig(name="q", model_alias="ALIAS", prompt="Ask about {{ TOPIC }}"))
    _length(builder, "q")
    return builder
"""


def _line(script: str, needle: str) -> int:
    """The number of the script's line that holds ``needle`` (counted here, from its text)."""
    [number] = [i for i, line in enumerate(script.splitlines(), 1) if needle in line]
    return number


def _run(tmp_path: Path, *, provider: str = "hosted", alias: str = "writer", topic: str = "topic") -> Path:
    """A run whose recipe is SCRIPT with its model config's provider, its column's alias and the column its prompt
    names as given; returns the script."""
    run, _, _ = write_unit_run(tmp_path, KEY, providers=PROVIDERS)
    script = SCRIPT.replace("PROVIDER", provider).replace("ALIAS", alias).replace("TOPIC", topic)
    (tmp_path / "build.py").write_text(script)
    run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: build.py"))
    return tmp_path / "build.py"


def _env(tmp_path: Path) -> dict[str, str]:
    return {"DATA_DESIGNER_HOME": str(tmp_path / "dd"), "HOSTED_KEY": KEY, "PATH": "/usr/bin:/bin"}


def test_a_jinja_reference_to_no_column_is_refused_at_the_add_column_line_with_a_did_you_mean(tmp_path: Path) -> None:
    script = _run(tmp_path, topic="topc")
    with pytest.raises(SubmitError) as refused:
        prepare(tmp_path / "run.yaml", tmp_path / "profile.yaml", _env(tmp_path), datetime.now(UTC),
                host=InProcessHost())  # fmt: skip
    line = _line(SCRIPT, 'name="q"')
    assert f"\n  {script}:{line}: column 'q': The prompt template for 'q' references a column that does not exist: " \
           "'topc'; did you mean 'topic'?" in str(refused.value)  # fmt: skip


def test_a_column_made_by_a_helper_is_placed_at_the_helper_s_add_column_line(tmp_path: Path) -> None:
    script = _run(tmp_path)
    script.write_text(script.read_text().replace('"{{ " + of + " | length }}"', '"{{ " + of + "x | length }}"'))
    with pytest.raises(SubmitError) as refused:
        prepare(tmp_path / "run.yaml", tmp_path / "profile.yaml", _env(tmp_path), datetime.now(UTC),
                host=InProcessHost())  # fmt: skip
    line = _line(SCRIPT, "builder.add_column(name=")  # inside _length(), not the call of _length()
    assert f"\n  {script}:{line}: column 'q_chars': " in str(refused.value)
    assert "'qx'; did you mean 'q'?" in str(refused.value)


def _providers(tmp_path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["providers", str(tmp_path / "run.yaml"), "--profile", str(tmp_path / "profile.yaml")]
    code = main(argv, env=_env(tmp_path), slurm=Slurm(FakeSlurm()), stdout=out, stderr=err)
    return code, out.getvalue() + err.getvalue()


def test_an_alias_typo_is_refused_at_the_line_of_the_column_that_uses_it(tmp_path: Path) -> None:
    script = _run(tmp_path, alias="writr")
    code, said = _providers(tmp_path)
    line = _line(SCRIPT, 'name="q"')
    assert (
        code == 1
        and (
            f"  - {script}:{line}: data_designer.columns[1].model_alias: model alias 'writr' has no deployment in the "
            f"run file and no model config in the recipe or in {tmp_path / 'dd'}; did you mean 'writer'?"
        )
        in said
    ), said


def test_an_unknown_provider_is_refused_at_the_model_config_s_line_listing_the_providers(tmp_path: Path) -> None:
    script = _run(tmp_path, provider="hostd")
    expected = (
        f"{script}:{_line(SCRIPT, 'dd.ModelConfig(')}: data_designer.model_configs[0].provider: model alias "
        f"'writer': provider 'hostd' does not exist in {tmp_path / 'dd' / 'model_providers.yaml'} (its providers: "
        "'hosted'); did you mean 'hosted'?"
    )
    code, said = _providers(tmp_path)
    assert code == 1 and f"  - {expected}" in said, said
    with pytest.raises(SubmitError) as refused:  # submit refuses it in the same words
        prepare(tmp_path / "run.yaml", tmp_path / "profile.yaml", _env(tmp_path), datetime.now(UTC),
                host=InProcessHost())  # fmt: skip
    assert expected in str(refused.value)
