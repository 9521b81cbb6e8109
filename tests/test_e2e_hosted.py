"""A hosted-only run end to end through the `ddslurm` CLI, the real local Slurm cluster and the real engine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, KeyBudgetState, read_json
from fake_vllm.testing import set_gate
from tests.e2e import attempts, cli_json, resumable_rows, run_cli, shard_client, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

OUTPUTS: list[str] = []  # everything the CLI printed in this process, scanned for secrets


def test_hosted_only_run_end_to_end(make_run_files: Any, scan_for_secret: Any, tmp_path: Path) -> None:
    """Three shards against a key that admits 2 requests at once (429 with ``Retry-After`` above, the rate headers
    on every answer): the clients' gates share the key's budget and wait its 429s out, so the run succeeds; what
    they counted is what the key's own log says it received; nothing holds the key's value. Shard 0's client is
    killed (SIGKILL) after its first batch and the automatic retry resumes it: every figure of ``status`` and the
    report (requests, 429s, tokens, dollars; spent and kept) is recomputed from the key's own log and the price
    file."""
    from fake_vllm.testing import start_server

    key = "sk-limited-" + "3" * 20
    log, gate = tmp_path / "key.jsonl", tmp_path / "gate"
    set_gate(gate, "")  # open; the kill holds it
    limited = ["--served-model-name", "demo/writer-8b", "demo/judge-70b", "--fake-latency", "0.3",
               "--fake-rate-limit-in-flight", "2", "--fake-request-log", str(log),
               "--fake-gate", str(gate)]  # fmt: skip
    with start_server("demo", args=limited, api_key=key) as endpoint:
        _hosted_only_run(make_run_files, scan_for_secret, endpoint.base_url, key, log, gate)


PRICES = {"demo/writer-8b": (0.25, 1.5), "demo/judge-70b": (3.0, 9.0)}
"""Dollars per million input and output tokens, as the scenario's price file states them."""


def _hosted_only_run(make_run_files: Any, scan_for_secret: Any, base_url: str, key: str, log: Path, gate: Path) -> None:
    extra = "retries: 1\nclient_retries: 0\nprices: prices.yaml\nhosted_limits:\n  demo-hosted: {in_flight: 4}\n"
    extra += "run_config: {write_scheduler_events: true, max_in_flight_tasks: 512}\n"
    files = make_run_files("e2e", num_records=9, shards=3, buffer_size=1, extra_run=extra)  # 3 batches a shard
    (files.root / "prices.yaml").write_text(
        "version: 1\nmodels:\n" + "".join(f"  {m}: {{input: {i}, output: {o}}}\n" for m, (i, o) in PRICES.items())
    )
    (files.dd_home / "model_providers.yaml").write_text(
        "providers:\n- {name: demo-hosted, endpoint: '" + base_url + "', api_key: DEMO_HOSTED_API_KEY}\n"
    )
    files.env["DEMO_HOSTED_API_KEY"] = key
    submitted = cli_json(
        "submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env, outputs=OUTPUTS
    )
    run_dir = Path(submitted["run_dir"])
    assert submitted["shards"] == 3 and submitted["job_id"].isdigit()
    # The job reads the snapshot captured at submit time, never the settings directory: break it now.
    (files.dd_home / "model_providers.yaml").write_text("providers:\n- {name: demo-hosted, endpoint: 'http://x'}\n")
    _kill_the_client_after_its_first_batch(run_dir, gate, shard=0)

    script = (run_dir / "generate.sbatch").read_text()
    assert "#SBATCH --gres=none" in script and "#SBATCH --partition=cpu" in script
    assert "#SBATCH --array=0-2" in script and "#SBATCH --mem=1G" in script

    final = cli_json("wait", str(run_dir), "--json", env=files.env, outputs=OUTPUTS)
    assert final["state"] == "succeeded", final
    assert final["records_done"] == 9
    assert [s["state"] for s in final["shards"]] == ["succeeded"] * 3
    killed, resumed = sorted(attempts(run_dir, 0), key=lambda a: a.started_at)
    assert (killed.state, resumed.state, resumed.resumed_from) == ("failed", "succeeded", killed.attempt)

    status = cli_json("status", str(run_dir), "--json", env=files.env, outputs=OUTPUTS)
    assert status["state"] == "succeeded"
    _ran_on_cpus_without_servers(run_dir, submitted["job_id"])
    _run_config_reached_every_client(run_dir)

    # The collection job runs on the CPU partition without the key in its environment.
    env_without_key = {k: v for k, v in files.env.items() if k != "DEMO_HOSTED_API_KEY"}
    collected = cli_json("collect", str(run_dir), "--json", env=env_without_key, outputs=OUTPUTS)
    dataset = Path(collected["dataset"])
    assert collected["rows"] == 9 and dataset == run_dir / "dataset"
    assert Path(collected["manifest"]).is_file()
    assert pq.read_table(dataset).num_rows == 9
    assert len(pd.read_parquet(dataset)) == 9
    assert duckdb.sql(f"select count(*) from read_parquet('{dataset}/*.parquet')").fetchone() == (9,)
    assert "--gres=none" in next(run_dir.glob("collect-*.sbatch")).read_text()

    requests = [json.loads(line) for line in log.read_text().splitlines()]
    chats = [r for r in requests if r["path"].endswith("/chat/completions")]
    assert any(r["authorized"] and r["model"] == "demo/judge-70b" for r in chats)
    [budget] = (run_dir / "budgets").glob("*.json")
    # every client gave its share back, but the killed one: gone from the deal 15 s after its last report
    assert set(read_json(budget, KeyBudgetState).members) <= {f"{killed.job_id}-{killed.attempt}"}
    assert read_json(budget, KeyBudgetState).ceiling <= 4  # the run file's cap
    report = cli_json("report", str(run_dir), "--json", env=files.env, outputs=OUTPUTS)
    _accounting_is_the_keys_own(run_dir, chats, status["hosted"], report["hosted"])
    _the_next_dry_run_predicts_from_this_runs_facts(files, base_url, run_dir)
    # Nothing the run left behind holds the key: scripts, plan, snapshot, records, logs, data, budgets.
    assert scan_for_secret(run_dir, key) == []
    assert scan_for_secret(files.root, key) == []
    assert not any(key in text for text in OUTPUTS)


def _the_next_dry_run_predicts_from_this_runs_facts(files: Any, base_url: str, run_dir: Path) -> None:
    """``wait`` recorded what the run measured per record (the workspace's facts); the dry run of the same run file
    predicts each hosted alias's requests, tokens and dollars as the run's records times those, at the price file's
    prices (recomputed here from the facts file itself)."""
    (files.dd_home / "model_providers.yaml").write_text(
        "providers:\n- {name: demo-hosted, endpoint: '" + base_url + "', api_key: DEMO_HOSTED_API_KEY}\n"
    )
    dry = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--dry-run", "--json",
                   env=files.env, outputs=OUTPUTS)  # fmt: skip
    facts = json.loads((run_dir.parent.parent / "facts.json").read_text())
    [recipe] = [r for r in facts["recipes"] if r["run_id"] == run_dir.name]
    spend = dry["bill"]["spend"]
    models = {m["alias"]: m["model"] for m in spend["hosted"]}
    assert spend["records"] == 9 and set(models) == set(recipe["input_tokens_per_record"]) == {"writer", "judge"}
    for alias, predicted in ((a["alias"], a) for a in spend["hosted"]):
        tokens = (
            round(9 * recipe["input_tokens_per_record"][alias]),
            round(9 * recipe["output_tokens_per_record"][alias]),
        )
        assert tokens[0] > 0 and tokens[1] > 0, alias
        assert (predicted["requests"], predicted["input_tokens"], predicted["output_tokens"]) == (
            round(9 * recipe["requests_per_record"][alias]), *tokens), alias  # fmt: skip
        price = PRICES[models[alias]]
        assert predicted["cost"] == pytest.approx((tokens[0] * price[0] + tokens[1] * price[1]) / 1e6, rel=1e-9)
    assert spend["currency"] == "USD" and spend["gpu_hours"] == 0.0


def _kill_the_client_after_its_first_batch(run_dir: Path, gate: Path, *, shard: int) -> None:
    """SIGKILL the client step of ``shard``'s first attempt once a batch of it is on disk (its progress says so):
    the stand-in then holds every request, so the shard's third batch cannot be answered and its client is still
    there to kill (an event, not a race); the stand-in answers again once it is killed."""
    import signal

    until(lambda: resumable_rows(run_dir, shard) > 0, 300, f"shard {shard}'s first batch, resumable")

    set_gate(gate, "hold")
    os.kill(until(lambda: shard_client(run_dir, shard), 60, f"shard {shard}'s client process"), signal.SIGKILL)
    set_gate(gate, "")


def _accounting_is_the_keys_own(
    run_dir: Path, chats: list[dict[str, Any]], status: list[dict[str, Any]], report: dict[str, Any]
) -> None:
    """Every hosted figure recomputed from the key's own request log (joined to the gates' records by the
    ``X-Client-Request-Id`` each request carried) and the price file."""
    answered: dict[str, int | None] = {}  # request id -> status the gate recorded (None: never answered)
    for journal in run_dir.glob("shards/*/attempts/*/hosted-requests.jsonl"):
        for line in journal.read_text().splitlines():
            entry = json.loads(line)
            answered[entry["id"]] = entry.get("status") if entry["id"] not in answered else (
                entry.get("status") or answered[entry["id"]]
            )  # fmt: skip
    provider = {c["client_request_id"]: c for c in chats}
    assert set(provider) <= set(answered) and None not in provider  # every request came through a gate
    # a request the gate got no answer to (in flight at the kill) may be in the provider's log: billed, not seen
    seen = [c for rid, c in provider.items() if answered[rid] is not None]
    unanswered = [rid for rid, st in answered.items() if st is None]
    tokens = {m: (sum(c["prompt_tokens"] or 0 for c in seen if c["model"] == m),
                  sum(c["completion_tokens"] or 0 for c in seen if c["model"] == m)) for m in PRICES}  # fmt: skip
    cost = {m: (i * PRICES[m][0] + o * PRICES[m][1]) / 1e6 for m, (i, o) in tokens.items()}
    [key] = status
    assert (key["requests"], key["limited"], key["unanswered"]) == (len(answered), sum(
        c["status"] == 429 for c in seen), len(unanswered))  # fmt: skip
    assert key["input_tokens"] + key["output_tokens"] == sum(i + o for i, o in tokens.values())
    assert key["cost"] == pytest.approx(sum(cost.values()), rel=1e-9) and key["currency"] == "USD"
    by_model = {m["model"]: m for m in report["models"]}
    for model, (tokens_in, tokens_out) in tokens.items():
        mine = [c for c in seen if c["model"] == model]
        row = by_model[model]
        assert (row["input_tokens"], row["output_tokens"], row["limited"]) == (
            tokens_in, tokens_out, sum(c["status"] == 429 for c in mine)
        ), model  # fmt: skip
        assert row["cost"] == pytest.approx(cost[model], rel=1e-9), model
        # every attempt is a winner's or one it resumed from (the killed attempt): all of it kept
        assert (row["kept_requests"], row["kept_cost"]) == (row["requests"], pytest.approx(row["cost"])), model
    assert report["cost"] == pytest.approx(sum(cost.values()), rel=1e-9) and report["kept_rows"] == 9
    assert report["cost_per_1000_kept_rows"] == pytest.approx(sum(cost.values()) / 9 * 1000, rel=1e-9)


def _run_config_reached_every_client(run_dir: Path) -> None:
    """The run file's ``run_config`` is what Data Designer's ``RunConfig`` held in every client step (the killed
    one and its retry too), read back from the engine into the client log; ``write_scheduler_events`` took effect
    (Data Designer's scheduler diagnostics beside each winner's batches)."""
    clients = sorted(run_dir.glob("shards/*/attempts/*/client.log"))
    assert len(clients) == 4  # three shards, shard 0 twice
    for log in clients:
        events = [json.loads(line) for line in log.read_text().splitlines()]
        applied = [e["applied"] for e in events if e["event"] == "engine.run_config"]
        assert applied == [{"write_scheduler_events": True, "max_in_flight_tasks": 512}], log
    for winner in sorted(run_dir.glob("shards/*/winner.json")):
        dataset = Path(json.loads(winner.read_text())["dataset_dir"])
        assert (dataset / "scheduler_events.jsonl").stat().st_size > 0, dataset


def _ran_on_cpus_without_servers(run_dir: Path, job_id: str) -> None:
    """A hosted-only run's jobs hold no GPU, on the CPU partition, and start no server or proxy: only clients."""
    for attempt in run_dir.glob("shards/*/attempts/*"):
        # n3 (the lowest weight) when it is free, a GPU node's CPUs when other tests' jobs fill n3 (the suite runs
        # four cluster tests at once): which node is Slurm's choice, not the run's
        assert read_json(attempt / "attempt.json", AttemptRecord).node in {"n1", "n2", "n3"}
        assert not list(attempt.glob("server-*")) and not list(attempt.glob("proxy-*"))
        assert not (attempt / "serving.json").exists()
    sacct = ["sacct", "-n", "-P", "-j", job_id]
    tasks = subprocess.run([*sacct, "-X", "--format=Partition,AllocTRES"], capture_output=True, text=True, check=True)
    for line in tasks.stdout.splitlines():
        partition, tres = line.split("|")
        assert partition == "cpu" and "gpu" not in tres, line
    steps = subprocess.run([*sacct, "--format=JobName"], capture_output=True, text=True, check=True).stdout.split()
    assert "client" in steps and not any(s.startswith(("server-", "proxy-")) for s in steps)


def test_status_and_wait_report_a_failed_run(make_run_files: Any) -> None:
    files = make_run_files("fail", num_records=2, shards=1, buffer_size=2)
    submitted = cli_json(
        "submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env, outputs=OUTPUTS
    )
    run_dir = Path(submitted["run_dir"])
    # The snapshot is checked against the plan's sha256 on the node: tampering makes the attempt fail.
    snapshot = run_dir / "inputs" / "snapshot.json"
    snapshot.write_bytes(snapshot.read_bytes().replace(b"demo-hosted", b"demo-hostex"))
    done = run_cli("wait", str(run_dir), "--json", env=files.env, outputs=OUTPUTS)
    assert done.returncode == 1
    final = json.loads(done.stdout)
    assert final["state"] == "failed"
    assert final["shards"][0]["state"] == "failed"
    assert "sha256 differs from the plan" in final["shards"][0]["message"]  # from the task's batch output
    collect = run_cli("collect", str(run_dir), "--local", env=files.env, outputs=OUTPUTS)
    assert collect.returncode != 0 and "no published result" in collect.stderr
    assert not (run_dir / "dataset").exists()


def test_a_key_the_endpoint_refuses_fails_key_refused_once_and_ddslurm_retry_with_the_right_key_succeeds(
    make_run_files: Any, hosted_endpoint: Any, scan_for_secret: Any
) -> None:
    files = make_run_files("refused", num_records=2, shards=1, buffer_size=2, extra_run="retries: 1\n")
    wrong = "sk-wrong-" + os.urandom(12).hex()
    env = {**files.env, "DEMO_HOSTED_API_KEY": wrong}  # the shell exports a key the endpoint does not take
    outputs: list[str] = []
    submitted = cli_json(
        "submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env, outputs=outputs
    )
    run_dir = Path(submitted["run_dir"])

    final = cli_json("wait", str(run_dir), "--json", env=env, codes=(1,), outputs=outputs)
    assert final["state"] == "failed", final
    refused, not_retried = attempts(run_dir, 0)  # the attempt, then the automatic retry array's task
    assert (refused.state, refused.reason, refused.retryable, refused.client_runs) == (
        "failed",
        "key_refused",
        False,
        1,
    )
    assert (refused.message or "").startswith(
        "the endpoint of provider 'demo-hosted' refused the API key in DEMO_HOSTED_API_KEY (HTTP 401): export the "
        "right key in the shell you submit from, then `ddslurm retry RUN`"
    )
    assert (not_retried.state, not_retried.reason) == ("failed", "not_retried")  # retries: 1 started nothing
    assert "failed with key_refused" in (not_retried.message or "")
    (shard,) = final["shards"]
    assert shard["reason"] == "not_retried" and "refused the API key in DEMO_HOSTED_API_KEY" in shard["message"]

    retried = cli_json("retry", str(run_dir), "--json", env=files.env, outputs=outputs)  # the right key, as told
    assert retried["shards"] == [0]
    assert cli_json("wait", str(run_dir), "--json", env=files.env, outputs=outputs)["state"] == "succeeded"
    assert scan_for_secret(files.root, wrong) == [] and not any(wrong in text for text in outputs)


def _waiting_for_the_provider(run_dir: Path) -> bool:
    """Whether an attempt has logged that it waits out an unavailable provider, or its gate has counted a 429."""
    for attempt in run_dir.glob("shards/*/attempts/*"):
        log, journal = attempt / "client.log", attempt / "hosted-requests.jsonl"
        if log.is_file() and '"provider.unavailable"' in log.read_text():
            return True
        with contextlib.suppress(OSError):
            if '"status":429' in journal.read_text():
                return True
    return False


@pytest.mark.parametrize(
    ("layout", "status"),
    [
        pytest.param("", 500, id="a-task-a-shard-500"),
        pytest.param("allocations: 1\n", 429, id="pulling-429"),  # the waiting is the attempt's, whatever the layout
    ],
)
def test_a_provider_outage_at_the_start_of_a_hosted_run_is_waited_out_with_no_retry(
    tmp_path: Path, layout: str, status: int
) -> None:
    """The provider answers every chat request with HTTP 500 (or 429, rate-limited) when the run starts (the
    start-up check the client's gate makes in place of Data Designer's gets it) and heals once an attempt waits: a
    500 is waited out by the attempt (it logs ``provider.unavailable``), a 429 by the gate under the key's budget
    (recorded in ``hosted-requests.jsonl``, never shown to Data Designer). With no retry of any kind allowed
    (``retries: 0``, ``client_retries: 0``), the run succeeds with every row, one attempt a shard."""
    from conftest import hosted_stand_in, write_run_files

    outage = tmp_path / "outage"
    outage.write_text(str(status))
    with hosted_stand_in(tmp_path, "--fake-outage", str(outage)) as endpoint:
        extra = "retries: 0\nclient_retries: 0\n" + layout
        files = write_run_files(tmp_path / "run", endpoint, num_records=6, shards=2, buffer_size=2, extra_run=extra)
        submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
        run_dir = Path(submitted["run_dir"])
        try:
            until(lambda: _waiting_for_the_provider(run_dir), 300, "an attempt waiting for the provider")
        finally:
            outage.write_text("")
        final = cli_json("wait", str(run_dir), "--json", env=files.env)
    assert final["state"] == "succeeded" and final["records_done"] == 6, final
    for shard in range(2):
        (only,) = attempts(run_dir, shard)
        assert (only.state, only.client_runs) == ("succeeded", 1), only
    chats = [json.loads(line) for line in endpoint.request_log.read_text().splitlines() if "/completions" in line]
    assert chats[0]["status"] == status and chats[-1]["status"] == 200
