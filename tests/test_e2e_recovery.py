"""Nothing generated is lost and nothing is duplicated: a shard cancelled mid-generation is retried and
resumes from its completed batches; a shard killed by its time limit is retried automatically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, RunLayout, facts_path, read_facts, read_json
from fake_vllm.testing import set_gate
from tests.e2e import REPO, cli_json, requests_waiting, resumable_rows, slurm, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

RECORD_ID = "  - column_type: sampler\n    name: record_id\n    sampler_type: uuid\n    params: {sampler_type: uuid}\n"


def _recipe_with_ids(tmp_path: Path) -> Path:
    text = (REPO / "examples" / "hosted-only" / "recipe.yaml").read_text()
    recipe = tmp_path / "ids" / "recipe.yaml"
    recipe.parent.mkdir()
    recipe.write_text(text.replace("  columns:\n", "  columns:\n" + RECORD_ID, 1))
    return recipe


def test_cancelled_shard_is_retried_and_resumes_without_losing_or_duplicating(
    make_run_files: Any, tmp_path: Path
) -> None:
    from fake_vllm.testing import start_server

    key = "sk-recovery-" + "9" * 16
    # The stand-in answers 12 of the writer's requests (the judge's pass), then holds every other until the test
    # opens its gate. Each shard asks the writer once to check its health, then once a row: with 12 answers in
    # all, neither shard gets the 12 row answers it needs to finish; the two shards share at least 10 row answers,
    # so one of them has its first batch's 3 writer answers, and its judge answers are not held: that batch lands.
    # That shard is cancelled once its batch is on disk: the moment is an event, never a latency.
    gate, requests = tmp_path / "gate", tmp_path / "requests.jsonl"
    set_gate(gate, "12")
    args = ["--served-model-name", "demo/writer-8b", "demo/judge-70b", "--fake-request-log", str(requests)]
    args += ["--fake-gate", str(gate), "--fake-gate-model", "demo/writer-8b"]
    with start_server("demo", args=args, api_key=key) as held:
        files = make_run_files("cancel", num_records=24, shards=2, buffer_size=3, recipe=_recipe_with_ids(tmp_path))
        (files.dd_home / "model_providers.yaml").write_text(
            "providers:\n- {name: demo-hosted, endpoint: '" + held.base_url + "', api_key: DEMO_HOSTED_API_KEY}\n"
        )
        env = {**files.env, "DEMO_HOSTED_API_KEY": key}
        run_dir = Path(
            cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)["run_dir"]
        )

        def writer_answers() -> int:
            return _chat_requests(requests, "demo/writer-8b")

        until(lambda: writer_answers() >= 12, 300, "the 12 writer answers the gate allows", writer_answers)
        victim = until(
            lambda: [shard for shard in (0, 1) if resumable_rows(run_dir, shard) >= 3],
            120,
            "a shard's first batch on disk, 12 writer answers in",
            lambda: [resumable_rows(run_dir, shard) for shard in (0, 1)],
        )[0]
        other = 1 - victim
        cancelled = cli_json("cancel", str(run_dir), "--shards", str(victim), "--json", env=env)["cancelled"]
        assert len(cancelled) == 1
        status = until(
            lambda: (
                (s := cli_json("status", str(run_dir), "--json", env=env))["shards"][victim]["state"] == "cancelled"
                and s
            ),
            120,
            f"shard {victim} to be cancelled",
        )
        # status says cancelled from the cancellation itself; the attempt's own record follows once its controller
        # has stopped the client: wait for that event, then judge it
        record = next(run_dir.glob(f"shards/shard-{victim:05d}/attempts/*/attempt.json"))
        first = until(
            lambda: (r := read_json(record, AttemptRecord)).state != "running" and r,
            120,
            f"shard {victim}'s attempt record to settle",
            lambda: read_json(record, AttemptRecord).state,
        )
        assert first.state == "failed" and first.reason == "cancelled", first
        done_before = resumable_rows(run_dir, victim)
        assert 3 <= done_before < 12
        set_gate(gate, "")  # open: every held request is answered, the other shard finishes

        retried = cli_json("retry", str(run_dir), "--json", env=env)
        assert retried["shards"] == [victim]
        final = cli_json("wait", str(run_dir), "--json", env=env)
        assert final["state"] == "succeeded" and final["records_done"] == 24, status

    # Cancelling one shard left the other alone: its only attempt ran its generation step once.
    untouched = [read_json(p, AttemptRecord) for p in run_dir.glob(f"shards/shard-{other:05d}/attempts/*/attempt.json")]
    assert [(r.state, r.client_runs) for r in untouched] == [("succeeded", 1)]
    attempts = sorted(run_dir.glob(f"shards/shard-{victim:05d}/attempts/*/attempt.json"))
    records = [read_json(p, AttemptRecord) for p in attempts]
    resumed = [r for r in records if r.resumed_from]
    assert resumed and resumed[-1].resumed_rows >= 3 and resumed[-1].state == "succeeded"
    dataset = Path(cli_json("collect", str(run_dir), "--local", "--json", env=env)["dataset"])
    ids = pq.read_table(dataset).column("record_id").to_pylist()
    assert len(ids) == 24 and len(set(ids)) == 24


def test_shard_killed_by_its_time_limit_is_retried_automatically(make_run_files: Any, tmp_path: Path) -> None:
    """The provider hangs during the first allocation (the run file's 2-minute limit, the shortest accepted,
    shortened by scontrol to 1 once the task runs: Slurm's time limit ends it), then recovers; the retry array
    submitted with the run (retries: 1) finishes the shard."""
    from fake_vllm.testing import free_port, start_server

    key = "sk-timeout-" + "7" * 16
    port = free_port()
    files = make_run_files(
        "timeout",
        num_records=4,
        shards=1,
        buffer_size=2,
        recipe=_recipe_with_ids(tmp_path),
        extra_run="retries: 1\n",
    )
    run_text = files.run_file.read_text().replace("time_limit: '00:10:00'", "time_limit: 2")
    files.run_file.write_text(run_text)
    # Data Designer's own request timeout (60 s by default) must not end the hanging requests before the limit.
    recipe = files.root / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("timeout: null", "timeout: 600"))
    (files.dd_home / "model_providers.yaml").write_text(
        f"providers:\n- {{name: demo-hosted, endpoint: 'http://127.0.0.1:{port}/v1', api_key: DEMO_HOSTED_API_KEY}}\n"
    )
    env = {**files.env, "DEMO_HOSTED_API_KEY": key}
    served = ["--served-model-name", "demo/writer-8b", "demo/judge-70b"]
    with start_server("demo", args=[*served, "--fake-latency", "600"], api_key=key, port=port):
        submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)
        run_dir = Path(submitted["run_dir"])
        subs = sorted(run_dir.glob("submissions/*.json"))
        assert len(subs) == 2  # the run and its automatic retry array
        until(lambda: list(run_dir.glob("shards/shard-00000/attempts/*/attempt.json")), 60, "the first attempt")
        first = next(run_dir.glob("shards/shard-00000/attempts/*/attempt.json"))
        # The provider hangs: shorten the running task's limit to Slurm's least (1 minute, which no run file may
        # ask for): Slurm's own time limit still ends it, a minute sooner than the run file's 2.
        slurm("scontrol", "update", f"JobId={submitted['job_id']}_0", "TimeLimit=1", check=True)
        until(lambda: read_json(first, AttemptRecord).state != "running", 300, "the time limit to end attempt 1")
    record = read_json(first, AttemptRecord)
    assert record.reason in {"time_limit", "cancelled"}, record
    with start_server("demo", args=served, api_key=key, port=port):
        final = cli_json("wait", str(run_dir), "--json", "--timeout", "240", env=env)
    assert final["state"] == "succeeded" and final["records_done"] == 4
    records = [read_json(p, AttemptRecord) for p in run_dir.glob("shards/shard-00000/attempts/*/attempt.json")]
    assert sorted(r.state for r in records) == ["failed", "succeeded"]


def _chat_requests(log: Path, model: str, *, messages: int | None = None) -> int:
    """The chat requests the stand-in's log holds of ``model`` (of ``messages`` messages only, when given)."""
    lines = log.read_text().splitlines() if log.exists() else []
    chats = [line for line in lines if f'"{model}"' in line and '"/v1/chat/completions"' in line]
    return len(chats) if messages is None else sum(json.loads(line)["n_messages"] == messages for line in chats)


def test_a_sixty_record_shard_without_buffer_size_cancelled_at_60_percent_redoes_at_most_one_batch(
    make_run_files: Any, tmp_path: Path
) -> None:
    """Checkpoints by default (issue 34): a run file without ``buffer_size`` gets the planner's batches (12
    records for a shard of 60), so a shard cancelled once 38 of its 60 records have their writer answer has 36 on
    disk; the retry resumes them and asks for the other 24 only. Every request the stand-in received is counted:
    those answered before the cancel, those it still held then (Data Designer's ``max_parallel_requests``, here
    its default 4, in flight), and the retry's (a new stand-in at the same address). A cancel costs the answers of
    the batch in progress and the requests in flight; with Data Designer's default batch (1000: one batch for the
    shard) the same cancel saved nothing: 98 requests."""
    from fake_vllm.testing import start_server

    writer, judge = "demo/writer-8b", "demo/judge-70b"
    key = "sk-batches-" + "7" * 16
    source = tmp_path / "src"
    source.mkdir()
    recipe = source / "recipe.yaml"
    seed_config = (
        "  seed_config:\n    sampling_strategy: ordered\n    selection_strategy: null\n"
        "    source: {seed_type: local, path: seed.parquet}\n"
    )
    text = (REPO / "examples" / "hosted-only" / "recipe.yaml").read_text().replace("  seed_config: null\n", seed_config)
    recipe.write_text(text.replace("max_parallel_requests: 16", "max_parallel_requests: 4"))  # Data Designer's default
    pq.write_table(pa.table({"seed_id": list(range(60))}), source / "seed.parquet")
    files = make_run_files("batches", num_records=60, shards=1, buffer_size=None, recipe=recipe)
    env = {**files.env, "DEMO_HOSTED_API_KEY": key}
    gate, first_log, retry_log = tmp_path / "gate", tmp_path / "first.jsonl", tmp_path / "retry.jsonl"
    set_gate(gate, "39")  # the writer's health check, then the writer answers of 38 records: over 60 %
    served = ["--served-model-name", writer, judge]
    args = [*served, "--fake-request-log", str(first_log), "--fake-gate", str(gate), "--fake-gate-model", writer]
    with start_server("demo", args=args, api_key=key) as held:
        (files.dd_home / "model_providers.yaml").write_text(
            "providers:\n- {name: demo-hosted, endpoint: '" + held.base_url + "', api_key: DEMO_HOSTED_API_KEY}\n"
        )
        submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)
        run_dir = Path(submitted["run_dir"])
        plan = json.loads(RunLayout(run_dir).plan.read_text())
        assert (plan["buffer_size"], plan["batching"]["by"], plan["batching"]["batches"]) == (12, "planner", 5)
        until(
            lambda: _chat_requests(first_log, writer) >= 39 and resumable_rows(run_dir, 0) >= 36,
            300,
            "38 records' writer answers and three batches on disk",
            lambda: (_chat_requests(first_log, writer), resumable_rows(run_dir, 0)),
        )
        until(
            lambda: requests_waiting(held.base_url.removesuffix("/v1")) >= 4,
            60,
            "the 4 writer requests Data Designer has in flight held",
        )
        cli_json("cancel", str(run_dir), "--shards", "0", "--json", env=env)
        until(
            lambda: cli_json("status", str(run_dir), "--json", env=env)["shards"][0]["state"] == "cancelled",
            120,
            "shard 0 to be cancelled",
        )
        saved = resumable_rows(run_dir, 0)
        sent = {m: _chat_requests(first_log, m) for m in (writer, judge)}
        sent[writer] += requests_waiting(held.base_url.removesuffix("/v1"))  # held, never answered
    assert saved == 36, saved  # three whole batches; the fourth, cut at 2 of 12 records, is lost
    port = int(held.base_url.rsplit(":", 1)[1].split("/")[0])
    with start_server("demo", args=[*served, "--fake-request-log", str(retry_log)], api_key=key, port=port):
        assert cli_json("retry", str(run_dir), "--json", env=env)["shards"] == [0]
        final = cli_json("wait", str(run_dir), "--json", env=env)
        assert final["state"] == "succeeded" and final["records_done"] == 60, final
    for model in (writer, judge):
        sent[model] += _chat_requests(retry_log, model)
    # 60 records and the gate's start-up check (two messages: at most one a client run, none where a client of the
    # run had it answered minutes before); the cancel cost the writer the 2 answered records of the fourth batch and
    # the 4 requests it held, the judge at most those 2
    checks = {m: _chat_requests(first_log, m, messages=2) + _chat_requests(retry_log, m, messages=2) for m in sent}
    assert all(1 <= n <= 2 for n in checks.values()), checks
    assert 60 + checks[judge] <= sent[judge] <= 60 + checks[judge] + 2, (sent, checks)
    assert sent[writer] == 60 + checks[writer] + 2 + 4 <= 75, (sent, checks)
    won = [read_json(p, AttemptRecord) for p in run_dir.glob("shards/shard-00000/attempts/*/attempt.json")]
    assert [(r.state, r.resumed_rows) for r in won if r.state == "succeeded"] == [("succeeded", 36)], won
    dataset = Path(cli_json("collect", str(run_dir), "--local", "--json", env=env)["dataset"])
    assert pq.read_table(dataset).column("seed_id").to_pylist() == list(range(60))  # every seed row once, in order


def test_a_hosted_column_that_hangs_until_the_time_limit_teaches_the_facts_nothing(
    make_run_files: Any, tmp_path: Path
) -> None:
    """Issue 35's poisoned facts: a run whose local judge column waits on a hosted writer that hangs until Slurm's
    time limit ends the allocation (its replica served no request), then succeeds on its automatic retry. Its
    report shows no GPU time generating for that allocation, the workspace gets no model fact from it, and a dry
    run with ``gpus: 8`` chooses what it chooses with no facts at all."""
    from fake_vllm.testing import free_port, start_server

    key = "sk-hung-" + "5" * 16
    port = free_port()
    judge_here = (
        "deployments:\n  - model_alias: judge\n    model: demo/judge-70b\n    served_model_name: demo/judge-70b\n"
        "    server: {cpus: 1, startup_timeout: 120}\nstages: single\nretries: 1\n"
    )
    files = make_run_files("hung", num_records=4, shards=1, buffer_size=2, recipe=_recipe_with_ids(tmp_path),
                           extra_run=judge_here)  # fmt: skip
    files.run_file.write_text(files.run_file.read_text().replace("time_limit: '00:10:00'", "time_limit: 2"))
    recipe = files.root / "recipe.yaml"  # Data Designer's own request timeout must not end the hang first
    recipe.write_text(recipe.read_text().replace("timeout: null", "timeout: 600"))
    (files.dd_home / "model_providers.yaml").write_text(
        f"providers:\n- {{name: demo-hosted, endpoint: 'http://127.0.0.1:{port}/v1', api_key: DEMO_HOSTED_API_KEY}}\n"
    )
    env = {**files.env, "DEMO_HOSTED_API_KEY": key}
    with start_server("demo", args=["--served-model-name", "demo/writer-8b", "--fake-latency", "600"], api_key=key,
                      port=port):  # fmt: skip
        # the judge's predicted load (the cost model's default, 3 min) outlasts the 2-minute limit: confirmed
        submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--accept-overrun",
                             "--json", env=env)  # fmt: skip
        run_dir = Path(submitted["run_dir"])
        until(lambda: list(run_dir.glob("shards/shard-00000/attempts/*/attempt.json")), 120, "the first attempt")
        first = next(run_dir.glob("shards/shard-00000/attempts/*/attempt.json"))
        slurm("scontrol", "update", f"JobId={submitted['job_id']}_0", "TimeLimit=1", check=True)
        until(lambda: read_json(first, AttemptRecord).state != "running", 300, "the time limit to end attempt 1")
    with start_server("demo", args=["--served-model-name", "demo/writer-8b"], api_key=key, port=port):
        final = cli_json("wait", str(run_dir), "--json", "--timeout", "240", env=env)  # records the facts
    assert final["state"] == "succeeded" and final["records_done"] == 4, final
    report = cli_json("report", str(run_dir), "--json", env=env)
    hung = next(a for a in report["gpu"]["allocations"] if a["job"] == f"{submitted['job_id']}_0")
    assert (hung["busy_from"], hung["generating_gpu_s"]) == ("proxy", 0.0), hung
    workspace = files.workspace
    facts = read_facts(facts_path(workspace))
    assert facts.models == (), facts.models  # the hung allocation's time is no measure of the judge's model

    def chosen() -> dict[str, Any]:
        budget = files.run_file.with_name("budget.yaml")
        budget.write_text(files.run_file.read_text().replace("retries: 1\n", "retries: 1\ngpus: 8\n"))
        dry = cli_json("submit", str(budget), "--profile", str(files.profile), "--dry-run", "--json", env=env)
        choice = dry.get("bill", dry)["prediction"]["chosen"]
        return {k: choice[k] for k in ("allocations", "replicas", "client_workers", "two_stage", "gpus_at_once")}

    with_facts = chosen()
    facts_path(workspace).rename(workspace / "facts.json.aside")
    assert with_facts == chosen()
