"""A Data Designer workflow (``DataDesigner.compose_workflow``) on the real local Slurm cluster and the real
engine, each stage a sharded run (docs/recipes.md#workflows), against ``workflow.run()`` on the builder itself.

The builder script returns a two-stage workflow: ``draft`` (7 topics of a seed file, one LLM column) and ``improve``
(seeded by the first stage's output, an LLM column over it and an expression), 3 shards a stage, one record a
batch. ``ddslurm submit`` submits the first stage; ``ddslurm workflow`` waits for it, collects it and submits the
second, seeded by its dataset. The second stage's shard 0 is killed (SIGKILL) after its first batch (the hosted
stand-in holds every request meanwhile: an event), so the workflow stops there and says how to go on;
``ddslurm retry`` resumes the shard from its saved batch, and ``ddslurm workflow`` again follows the same runs to
the dataset, which holds ``workflow.run()``'s rows, in its order, column for column.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, RunLayout, read_json, read_plan
from ddslurm.launcher import SubmitError, prepare
from ddslurm.launcher.testing import InProcessHost
from fake_vllm.testing import set_gate, start_server
from tests.e2e import REPO, cli_json, resumable_rows, shard_client, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

TOPICS = ["rain", "bread", "glass", "moss", "salt", "wool", "tin"]  # 7 rows over 3 shards: 3, 2, 2
DDSLURM = REPO / ".venv" / "bin" / "ddslurm"
KEY = "sk-workflow-" + "5" * 20

BUILD = """\
from pathlib import Path

import data_designer.config as dd
from data_designer.interface import DataDesigner

HERE = Path(__file__).parent


def load_config_builder():
    # timeout: a request the test holds at the stand-in's gate waits as long as the test steps, never a 504
    params = dd.ChatCompletionInferenceParams(max_parallel_requests=4, max_tokens=48, timeout=900)
    models = [dd.ModelConfig(alias="judge", model="demo/judge-70b", provider="demo-hosted",
                             inference_parameters=params, skip_health_check=True)]
    draft = dd.DataDesignerConfigBuilder(model_configs=models)
    draft.with_seed_dataset(dd.LocalFileSeedSource(path=str(HERE / "topics.csv")), sampling_strategy="ordered")
    draft.add_column(dd.LLMTextColumnConfig(name="draft", model_alias="judge", prompt="A line on {{ topic }}."))
    improve = dd.DataDesignerConfigBuilder(model_configs=models)
    improve.add_column(dd.LLMTextColumnConfig(name="better", model_alias="judge", prompt="Improve: {{ draft }}"))
    improve.add_column(dd.ExpressionColumnConfig(name="said", expr="{{ topic }}: {{ better }}"))
    workflow = DataDesigner(artifact_path=HERE / "artifacts").compose_workflow(name="lines")
    workflow.add_stage("draft", draft, num_records=7)
    workflow.add_stage("improve", improve)
    return workflow
"""

# workflow.run() of the script on the builder itself (its DataDesigner, Data Designer's home the run's)
ORACLE = """\
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("build", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.load_config_builder().run().load_dataset().to_parquet(sys.argv[2])
"""


def test_a_two_stage_workflow_runs_as_sharded_stages_and_resumes_its_second(
    make_run_files: Any, scan_for_secret: Any, tmp_path: Path
) -> None:
    """In this workspace's ``python_env`` (Data Designer 0.9.7). With a ``python_env`` of 1.0.0rc1 (the
    ``builder_env`` fixture) the scenario passed too when it was written; that variant is left out of ``make test``
    for its cost (101 s and 25 CPU-s on the submit side)."""
    gate = tmp_path / "gate"
    set_gate(gate, "")  # open; the kill holds it
    log = tmp_path / "requests.jsonl"
    args = ["--served-model-name", "demo/judge-70b", "--fake-latency", "0.05", "--fake-gate", str(gate),
            "--fake-request-log", str(log)]  # fmt: skip
    with start_server("demo", args=args, api_key=KEY) as endpoint:
        files = make_run_files("wf", num_records=7, shards=3, buffer_size=1, extra_run="client_retries: 0\n")
        recipes = files.root / "recipes"
        recipes.mkdir()
        (recipes / "build.py").write_text(BUILD)
        (recipes / "topics.csv").write_text("topic\n" + "\n".join(TOPICS) + "\n")
        files.run_file.write_text(files.run_file.read_text().replace("recipe: recipe.yaml", "recipe: recipes/build.py"))
        (files.dd_home / "model_providers.yaml").write_text(
            "providers:\n- {name: demo-hosted, endpoint: '" + endpoint.base_url + "', api_key: DEMO_HOSTED_API_KEY}\n"
        )
        env = {**files.env, "DEMO_HOSTED_API_KEY": KEY}
        python_env, dd_version = REPO / ".venv", version("data-designer")

        # the run file's num_records must be the first stage's: refused at its line, nothing written
        wrong = files.root / "wrong.yaml"
        wrong.write_text(files.run_file.read_text().replace("num_records: 7", "num_records: 5"))
        with pytest.raises(SubmitError, match=r"wrong.yaml:3:1: num_records: 5, but .* first stage 'draft' makes 7"):
            prepare(wrong, files.profile, env, datetime.now(UTC), host=InProcessHost())

        submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)
        first = RunLayout(Path(submitted["run_dir"]))
        place = read_plan(first.plan).workflow
        assert place is not None and (place.name, place.index) == ("lines", 0), place
        assert [s.name for s in place.stages] == ["draft", "improve"] and place.previous_run is None

        # stage 1 done, the gate shut: every chat request from here on waits until the test lets it through
        assert cli_json("wait", str(first.root), "--json", env=env)["state"] == "succeeded"
        assert len(_chats(log)) == len(TOPICS)  # one a row (no health check: the script skips it)
        set_gate(gate, len(TOPICS))

        # ddslurm workflow: stage 1 collected, stage 2 submitted; its shard 0 killed mid-way
        follow = subprocess.Popen(
            [str(DDSLURM), "workflow", str(first.root), "--local", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        until(lambda: first.workflow_next.is_file(), 600, "the second stage's run")
        second = RunLayout(Path(json.loads(first.workflow_next.read_text())["run_dir"]))
        _let_shard_0_answer_once(second, gate, log)
        killed_at = _kill_shard_0(second)
        set_gate(gate, "")  # the other shards finish; shard 0's attempt has failed
        out, _ = follow.communicate(timeout=600)
        assert follow.returncode != 0, out
        stopped = json.loads(out)
        assert [(s["name"], s["state"]) for s in stopped["stages"]] == [("draft", "succeeded"), ("improve", "failed")]
        assert stopped["stages"][0]["rows"] == 7 and stopped["dataset"] is None
        assert f"ddslurm retry {second.root}" in stopped["message"], stopped

        plan = read_plan(second.plan)
        assert plan.workflow is not None and plan.workflow.index == 1 and plan.workflow.previous_run == str(first.root)
        assert plan.num_records == 7 and plan.run_name == "t-2" and len(plan.shards) == 3
        assert plan.recipe_source is not None and plan.recipe_source.stage == 1
        assert plan.data_designer_version == dd_version

        cli_json("retry", str(second.root), "--json", env=env)
        done = cli_json("workflow", str(first.root), "--local", "--json", env=env)  # follows the same runs
        assert [(s["name"], s["state"], s["run_dir"]) for s in done["stages"]] == [
            ("draft", "succeeded", str(first.root)),
            ("improve", "succeeded", str(second.root)),
        ], done
        rows = pq.read_table(done["dataset"]).to_pylist()

        attempts = [read_json(p, AttemptRecord) for p in second.shard(0).attempts.glob("*/attempt.json")]
        killed, resumed = sorted(attempts, key=lambda a: a.started_at)
        assert (killed.state, resumed.state, resumed.resumed_from) == ("failed", "succeeded", killed.attempt)
        assert 3 > resumed.resumed_rows >= killed_at >= 1  # what it had saved when killed (one more may have come)

        oracle_parquet = tmp_path / "oracle.parquet"
        oracle_env = {**env, "NEMO_TELEMETRY_ENABLED": "false"}
        ran = subprocess.run(
            [str(python_env / "bin" / "python"), "-c", ORACLE, str(recipes / "build.py"), str(oracle_parquet)],
            env=oracle_env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr[-3000:]
    oracle = pq.read_table(oracle_parquet).to_pylist()
    assert list(rows[0]) == ["topic", "draft", "better", "said"] == list(oracle[0])
    for column in rows[0]:  # column by column first: a failure names the column that differs
        assert [r[column] for r in rows] == [r[column] for r in oracle], column
    assert rows == oracle
    assert [r["topic"] for r in rows] == TOPICS
    for root in (first.root, second.root):
        assert scan_for_secret(root, KEY) == []
    assert os.environ.get("DEMO_HOSTED_API_KEY") != KEY


def _chats(log: Path) -> list[dict[str, Any]]:
    """The chat requests the stand-in answered, in order."""
    lines = log.read_text().splitlines() if log.is_file() else []
    return [entry for line in lines if (entry := json.loads(line))["path"] == "/v1/chat/completions"]


def _answered(layout: RunLayout, shard: int | None = None) -> int:
    """The hosted requests the attempts of shard ``shard`` (None: of every shard) have on record as answered by the
    provider (their journals; not a gate's own 504)."""
    shards = [shard] if shard is not None else [s.index for s in read_plan(layout.plan).shards]
    journals = [p for i in shards for p in layout.shard(i).attempts.glob("*/hosted-requests.jsonl")]
    lines = [line for journal in journals for line in journal.read_text().splitlines()]
    return sum(json.loads(line).get("status") == 200 for line in lines)


def _let_shard_0_answer_once(layout: RunLayout, gate: Path, log: Path) -> None:
    """Let the held chat requests through one at a time, each once the one before is answered and on record in its
    client's journal, until shard 0 has one answer: then its other requests (3 rows, one request a row) wait at the
    gate, and it cannot finish while the gate stays shut."""
    base = admitted = len(_chats(log))
    while True:
        until(lambda n=admitted: len(_chats(log)) >= n, 300, f"the {admitted} requests let through to be answered")
        until(lambda n=admitted - base: _answered(layout) >= n, 60, "the answers on record in the clients' journals")
        if _answered(layout, 0) >= 1:
            return
        admitted += 1
        set_gate(gate, admitted)


def _kill_shard_0(layout: RunLayout) -> int:
    """SIGKILL shard 0's client once a batch of it is on disk; the rows it had saved."""

    rows = until(lambda: resumable_rows(layout.root, 0), 300, "shard 0's first batch on disk, resumable")
    assert rows < 3, rows  # mid-way: the gate holds its last request
    os.kill(until(lambda: shard_client(layout.root, 0), 60, "shard 0's client process"), signal.SIGKILL)
    return int(rows)
