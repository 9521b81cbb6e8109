"""Placeholder API keys (``EMPTY``, ``none``, as local OpenAI-compatible servers use) do not fail attempts that
can never succeed: Data Designer writes ``"with_trace": "none"`` into every output, so scanning for such a value
would refuse every result. A real key is still scanned for, in the same run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import AttemptRecord, RunLayout, read_json
from fake_vllm.testing import RunningServer, start_server
from tests.e2e import run_cli

REAL = "sk-real-" + "9c0d1e2b55aa41c07f3a"
MODELS = ["--served-model-name", "demo/writer-8b", "demo/judge-70b"]


@pytest.fixture(scope="module")
def placeholder_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The stand-in as a local OpenAI-compatible server accepting the placeholder keys and one real key."""
    log = tmp_path_factory.mktemp("placeholder") / "server.log"
    args = [*MODELS, "--api-key", "EMPTY", "none", REAL, "--fake-request-log", str(log.parent / "requests.jsonl")]
    with start_server("demo", args=args, log_path=log) as server:
        yield server


def _two_providers(files: Any, server: RunningServer, writer_key: str, judge_key: str, recipe_edit: Any = None) -> Any:
    """The run's writer through provider demo-hosted (WRITER_KEY), its judge through demo-judge (JUDGE_KEY)."""
    (files.dd_home / "model_providers.yaml").write_text(
        "providers:\n"
        f"- {{name: demo-hosted, endpoint: '{server.base_url}', provider_type: openai, api_key: WRITER_KEY}}\n"
        f"- {{name: demo-judge, endpoint: '{server.base_url}', provider_type: openai, api_key: JUDGE_KEY}}\n"
    )
    recipe = files.root / "recipe.yaml"
    text = recipe.read_text()
    judge_at = text.rindex("provider: demo-hosted")
    text = text[:judge_at] + "provider: demo-judge" + text[judge_at + len("provider: demo-hosted") :]
    recipe.write_text(recipe_edit(text) if recipe_edit else text)
    env = {k: v for k, v in files.env.items() if k != "DEMO_HOSTED_API_KEY"}
    return dataclasses.replace(files, env={**env, "WRITER_KEY": writer_key, "JUDGE_KEY": judge_key})


def _attempt(run_dir: Path) -> AttemptRecord:
    (record,) = RunLayout(run_dir).shard(0).attempts.glob("*/attempt.json")
    return read_json(record, AttemptRecord)


@pytest.mark.dd
def test_placeholder_keys_are_not_scanned_for_and_the_attempt_succeeds(
    make_run_files: Any, local_attempt: Any, placeholder_server: RunningServer
) -> None:
    files = _two_providers(make_run_files("placeholder", num_records=4, shards=1), placeholder_server, "none", "EMPTY")
    run_dir, proc = local_attempt(files, "11")
    _, err = proc.communicate(timeout=240)

    record = _attempt(run_dir)
    assert (record.state, record.reason, proc.returncode) == ("succeeded", None, 0), (record, err[-2000:])
    assert RunLayout(run_dir).shard(0).winner.exists()


@pytest.mark.dd
def test_a_real_key_is_still_scanned_for_next_to_a_placeholder(
    make_run_files: Any, local_attempt: Any, placeholder_server: RunningServer
) -> None:
    # The recipe puts the judge's real key into every output (a sampler value): the attempt must refuse it,
    # although the writer's placeholder key is not scanned for. Submit refuses a recipe that holds the value of a
    # key it exports, so the key is rotated between submit and the attempt: the job's value is in the recipe.
    files = _two_providers(
        make_run_files("real", num_records=4, shards=1),
        placeholder_server,
        "none",
        "sk-rotated-" + "0f1e2d3c4b5a69788796",
        lambda text: text.replace("      - weather\n", f"      - {REAL}\n"),
    )
    run_dir, proc = local_attempt(files, "12", node_env={"JUDGE_KEY": REAL})
    _, err = proc.communicate(timeout=240)

    record = _attempt(run_dir)
    assert proc.returncode != 0
    assert (record.state, record.reason) == ("failed", "output_invalid"), record
    assert "a secret value was found" in (record.message or "")
    assert not RunLayout(run_dir).shard(0).winner.exists()
    assert REAL not in err


@pytest.mark.slurm
@pytest.mark.dd
def test_hosted_provider_with_placeholder_keys_runs_to_success_on_the_cluster(
    make_run_files: Any, placeholder_server: RunningServer
) -> None:
    files = _two_providers(
        make_run_files("cluster", num_records=6, shards=2, buffer_size=3), placeholder_server, "EMPTY", "none"
    )

    submit = run_cli("submit", str(files.run_file), "--profile", str(files.profile), env=files.env, timeout=300)
    assert submit.returncode == 0, submit.stderr[-3000:]
    assert "JUDGE_KEY, WRITER_KEY hold placeholder values (not secrets): attempts do not scan their files for them" in (
        submit.stdout
    )
    run_dir = Path(next(line.split(": ", 1)[1] for line in submit.stdout.splitlines() if "run dir: " in line))

    wait = run_cli("wait", str(run_dir), "--json", env=files.env)
    final = json.loads(wait.stdout)
    assert final["state"] == "succeeded", final
    assert final["records_done"] == 6
    requests = [
        json.loads(line) for line in (placeholder_server.log_path.parent / "requests.jsonl").read_text().splitlines()
    ]
    chats = [r for r in requests if r["path"].endswith("/chat/completions")]
    assert chats and all(r["authorized"] for r in chats)
