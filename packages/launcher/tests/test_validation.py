"""Data Designer's own validation of the recipe: at submit and dry run (refused before anything is written), and
on the node (a refused recipe fails the attempt once, not retryable, with Data Designer's own message)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddslurm.config import (
    AttemptRecord,
    CheckRequest,
    ErrorAnswer,
    InspectAnswer,
    InspectRequest,
    ProviderSnapshot,
    parallel_requests,
    read_json,
    recipe_with_models,
)
from ddslurm.launcher import Slurm, SubmitError, prepare, run_status, submit, write_run_dir
from ddslurm.launcher.testing import (
    UNIT_RECIPE,
    FakeSlurm,
    InProcessHost,
    accept_recipe,
    write_runtime_shim,
    write_unit_run,
)

HOST = InProcessHost()
"""Answers the submit-side recipe check in this process (docs/testing.md: seams, not subprocesses)."""

pytestmark = pytest.mark.dd

RECIPE = UNIT_RECIPE.replace('prompt: "Say {{ topic }}"', 'prompt: "Say {{ no_such_column }} about {{ topic }}"')
DD_DETAIL = "references a column that does not exist: 'no_such_column'"


def _files(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    run, profile, env = write_unit_run(
        tmp_path, "sk-validation-test-0123456789", recipe=RECIPE, num_records=4, shards=2
    )
    del env["PATH"]
    return run, profile, env


def test_submit_and_dry_run_refuse_a_recipe_data_designer_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddslurm.launcher import cli

    run, profile, env = _files(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    runner = FakeSlurm()
    monkeypatch.setattr(cli, "Slurm", lambda env: Slurm(runner, env=env))
    for extra in ([], ["--dry-run"]):
        assert cli.main(["submit", str(run), "--profile", str(profile), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert "Data Designer refuses the recipe" in err
        assert f"column 'q': The prompt template for 'q' {DD_DETAIL}" in err
        # placed at the prompt that uses the missing column (its line and column counted here, from the text)
        number, line = next((i, ln) for i, ln in enumerate(RECIPE.splitlines(), 1) if "no_such_column" in ln)
        place = f"{tmp_path / 'recipe.yaml'}:{number}:{line.index('prompt') + 1}: data_designer.columns[1].prompt"
        assert f"  {place}: column 'q': The prompt template" in err
        assert "Please address the indicated issues" not in err
    # only what the profile's checks read (ddslurm doctor's): nothing submitted
    assert [c[0] for c in runner.calls if c[0] not in ("sinfo", "scontrol", "sacctmgr")] == []
    assert not (tmp_path / "work").exists()
    with pytest.raises(SubmitError, match="no_such_column"):
        submit(run, profile, slurm=Slurm(runner), env=env)
    assert [c[0] for c in runner.calls if c[0] not in ("sinfo", "scontrol", "sacctmgr")] == []
    assert not (tmp_path / "work").exists()


def test_a_template_syntax_error_is_refused_at_its_field(tmp_path: Path) -> None:
    recipe = UNIT_RECIPE.replace('prompt: "Say {{ topic }}"', 'prompt: "Say {{ topic"')
    run, profile, env = write_unit_run(tmp_path, "sk-validation-test-0123456789", recipe=recipe, num_records=4)

    with pytest.raises(SubmitError) as info:
        prepare(run, profile, env, datetime.now(UTC), host=HOST)

    number, line = next((i, ln) for i, ln in enumerate(recipe.splitlines(), 1) if '{{ topic"' in ln)
    place = f"{tmp_path / 'recipe.yaml'}:{number}:{line.index('prompt') + 1}: data_designer.columns[1].prompt"
    assert f"  {place}: the recipe is not a valid Data Designer config: " in str(info.value)
    assert "Jinja2 template" in str(info.value)
    assert not (tmp_path / "work").exists()


def test_a_recipe_refused_on_the_node_fails_once_not_retryable_with_data_designers_message(
    make_run_files: Any, hosted_endpoint: Any
) -> None:
    """The submit host's Data Designer accepted the recipe (``check_recipe`` says so here: a user's nodes may run
    another version); the node's refuses it: failed at once, never rerun inside the allocation, and status says
    what Data Designer said."""
    runtime = Path(sys.executable).parent / "ddslurm-runtime"
    if not runtime.exists():
        pytest.skip("ddslurm-runtime is not installed in this environment")
    files = make_run_files("node", num_records=2, shards=1, buffer_size=2)
    recipe = files.root / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("{{ difficulty }}", "{{ no_such_column }}"))
    prepared = prepare(files.run_file, files.profile, files.env, datetime.now(UTC), check_recipe=accept_recipe)
    write_run_dir(prepared)
    env = {k: v for k, v in files.env.items() if not k.startswith("SLURM")}
    argv = [str(runtime), "generate", "--run-dir", str(prepared.layout.root), "--shard", "0", "--job-id", "local-v1"]
    done = subprocess.run(
        [*argv, "--launcher", "local", "--grace", "3"], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode != 0, done.stderr[-2000:]
    record = read_json(prepared.layout.shard(0).attempt("attempt-local-v1").record, AttemptRecord)
    assert (record.state, record.retryable, record.client_runs) == ("failed", False, 1), record
    assert record.message is not None and DD_DETAIL in record.message, record.message
    assert "Please address the indicated issues" not in record.message
    from ddslurm.launcher.commands._console import status_text

    status = run_status(prepared.layout, Slurm(FakeSlurm(), env=dict(os.environ)))  # (no Slurm job: ran outside it)
    shard = status.shards[0]
    assert shard.reason == "recipe_invalid" and shard.message is not None and DD_DETAIL in shard.message
    assert DD_DETAIL in status_text(status)


def test_a_recipe_without_model_columns_is_validated_too(tmp_path: Path) -> None:
    from ddslurm.config import ProviderSnapshot
    from ddslurm.launcher.submission._validate import dd_check_recipe
    from ddslurm.providers import load_recipe

    (tmp_path / "recipe.yaml").write_text(
        "data_designer:\n  columns:\n"
        "  - {name: n, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a]}}\n"
        "  - {name: e, column_type: expression, expr: '{{ n }}-{{ missing }}'}\n"
    )
    recipe = load_recipe(tmp_path / "recipe.yaml")
    runtime = write_runtime_shim(tmp_path / "venv")
    problems = dd_check_recipe(recipe, tmp_path / "recipe.yaml", ProviderSnapshot(), None, runtime, None).problems
    assert len(problems) == 1 and problems[0].startswith("column 'e': ") and "'missing'" in problems[0], problems
    recipe["data_designer"]["columns"][1]["expr"] = "{{ n }}-x"
    check = dd_check_recipe(recipe, tmp_path / "recipe.yaml", ProviderSnapshot(), None, runtime, None)
    assert check.problems == () and [c.name for c in check.columns or ()] == ["n", "e"], check


@pytest.mark.parametrize(
    ("own", "runs_with"),
    [
        pytest.param("timeout: 30", 12, id="absent-sized"),
        pytest.param("max_parallel_requests: 4, timeout: 30", 4, id="explicit-4-kept"),
    ],
)
def test_submit_validates_the_recipe_with_the_max_parallel_requests_the_node_uses(
    tmp_path: Path, own: str, runs_with: int
) -> None:
    """A local alias whose model config leaves ``max_parallel_requests`` out is validated with the plan's replicas x
    capacity, the value the node runs it with; one that sets it, to Data Designer's default of 4 as much as to any
    other value, keeps its own, at submit and on the node alike."""
    recipe = RECIPE.replace("{{ no_such_column }}", "something").replace("max_parallel_requests: 8", own)
    deployment = (
        "client_workers: 1\n"  # one client: it alone keeps the replicas' capacity in flight
        "deployments:\n"
        "- {model_alias: writer, model: org/writer, replicas: 2, server: {extra_args: ['--max-num-seqs=6']}}\n"
    )
    run, profile, env = write_unit_run(tmp_path, "sk-validation-test-0123456789", recipe=recipe, run_extra=deployment)
    profile.write_text(profile.read_text() + "gpus_per_node: 4\n")
    seen: list[CheckRequest] = []

    class Recording(InProcessHost):  # the check's request, as the engine host receives it
        def answer(self, request: InspectRequest | ErrorAnswer) -> InspectAnswer:
            if isinstance(request, CheckRequest):
                seen.append(request)
            return super().answer(request)

    prepared = prepare(run, profile, env, datetime.now(UTC), host=Recording())
    assert prepared.plan.serving is not None
    assert prepared.plan.serving.deployments[0].max_parallel_requests == 12  # what the replicas run at once
    [model] = seen[0].recipe["data_designer"]["model_configs"]
    assert model["alias"] == "writer"
    assert model["inference_parameters"] == {"temperature": 0.3, "timeout": 30, "max_parallel_requests": runs_with}
    # the node builds its model configs with the same function, from the run's snapshot and plan
    snapshot = msgspec.json.decode(prepared.snapshot_bytes, type=ProviderSnapshot)
    node = recipe_with_models({}, snapshot, prepared.plan.serving)
    assert node["model_configs"][0]["inference_parameters"]["max_parallel_requests"] == runs_with
    assert parallel_requests(snapshot, prepared.plan.serving) == {"writer": runs_with}
