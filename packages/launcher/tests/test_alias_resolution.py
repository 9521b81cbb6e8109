"""One resolution of a run's model aliases, whichever command asks: ``ddslurm-providers`` (``providers.describe_run``),
``ddslurm providers`` (``launcher.describe_aliases``) and ``submit`` (``prepare``, which refuses what the other two
list) all resolve through ``providers.describe_run_recipe``, and the planner serves a deployed alias under the very
model name the snapshot gives it (``Deployment.served_name``).

The cases: an alias both deployed by the run and defined in Data Designer's settings with a hosted provider (the
deployment wins), a hosted alias, an alias nothing defines, and a model config whose provider is missing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import ProviderSnapshot
from ddslurm.launcher import SubmitError, prepare
from ddslurm.launcher.submission._aliases import describe_aliases
from ddslurm.launcher.testing import HOSTED_PROVIDER, accept_recipe, write_unit_run
from ddslurm.providers import Resolution, ResolutionError, describe_run

KEY = "sk-alias-resolution-0123456789"
COLUMNS = {
    "gen": '  - {name: a, column_type: llm-text, model_alias: gen, prompt: "Say {{ topic }}"}\n',
    "writer": '  - {name: b, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}\n',
    "ghost": '  - {name: c, column_type: llm-text, model_alias: ghost, prompt: "Say {{ topic }}"}\n',
    "orphan": '  - {name: d, column_type: llm-text, model_alias: orphan, prompt: "Say {{ topic }}"}\n',
}
SETTINGS_MODELS = """model_configs:
- {alias: gen, model: hosted-gen, provider: hosted, inference_parameters: {temperature: 0.1}}
- {alias: orphan, model: m-3, provider: gone}
"""
DEPLOYMENT = (
    "deployments:\n"
    "- {model_alias: gen, model: org/gen-7b, served_model_name: gen-served, replicas: 1, "
    "server: {extra_args: ['--max-num-seqs=4']}}\n"
)


def _recipe(aliases: tuple[str, ...]) -> str:
    return (
        "data_designer:\n  columns:\n"
        "  - {name: topic, column_type: sampler, sampler_type: category, params: {values: [a, b]}}\n"
        + "".join(COLUMNS[a] for a in aliases)
        + "  model_configs:\n  - {alias: writer, model: m-1, provider: hosted}\n"
    )


def _run(tmp_path: Path, aliases: tuple[str, ...]) -> tuple[Path, Path, dict[str, str]]:
    run, profile, env = write_unit_run(
        tmp_path, KEY, recipe=_recipe(aliases), providers=HOSTED_PROVIDER, run_extra=DEPLOYMENT
    )
    (Path(env["DATA_DESIGNER_HOME"]) / "model_configs.yaml").write_text(SETTINGS_MODELS)
    profile.write_text(profile.read_text() + "gpus_per_node: 4\n")
    return run, profile, env


def _both(run: Path, env: dict[str, str]) -> Resolution:
    """What ``ddslurm-providers`` and ``ddslurm providers`` show, checked to be the same."""
    standalone = describe_run(run, env)
    launcher = describe_aliases(run, env, None)
    assert launcher == standalone
    return standalone


def test_a_run_that_resolves_gets_the_same_snapshot_from_every_command(tmp_path: Path) -> None:
    run, profile, env = _run(tmp_path, ("gen", "writer"))
    shown = _both(run, env)
    assert not shown.problems
    rows = {r.alias: (r.kind, r.provider, r.model) for r in shown.rows}
    # deployed and in the settings with a hosted provider: the deployment wins, under its served name
    assert rows == {"gen": ("local", "ddslurm-local-gen", "gen-served"), "writer": ("hosted", "hosted", "m-1")}
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    assert snapshot == shown.snapshot
    gen = next(m for m in snapshot.models if m.alias == "gen")
    assert gen.inference_parameters == {"temperature": 0.1}  # the settings' parameters, the deployment's model
    assert prepared.plan.serving is not None
    [deployment] = prepared.plan.serving.deployments
    assert (deployment.alias, deployment.served_model_name) == ("gen", gen.model)  # what the servers answer to


@pytest.mark.parametrize(
    ("alias", "problem"),
    [
        pytest.param(
            "ghost", "model alias 'ghost' has no deployment in the run file and no model config", id="unknown"
        ),
        pytest.param("orphan", "model alias 'orphan': provider 'gone' does not exist in", id="provider-missing"),
    ],
)
def test_an_alias_that_does_not_resolve_is_listed_by_both_and_refused_by_submit(
    tmp_path: Path, alias: str, problem: str
) -> None:
    run, profile, env = _run(tmp_path, ("gen", "writer", alias))
    shown = _both(run, env)
    assert [r.kind for r in shown.rows if r.alias == alias] == ["unresolved"]
    assert [p for p in shown.problems if problem in p], shown.problems
    with pytest.raises(SubmitError) as refused:
        prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    cause = refused.value.__cause__
    assert isinstance(cause, ResolutionError) and cause.problems == list(shown.problems)
