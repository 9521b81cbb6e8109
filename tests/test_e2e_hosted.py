"""A hosted-only run end to end through the `ddslurm` CLI, the real local Slurm cluster and the real engine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, HostedUsage, KeyBudgetState, read_json
from tests.e2e import attempts, cli_json, run_cli, until

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

OUTPUTS: list[str] = []  # everything the CLI printed in this process, scanned for secrets


def test_hosted_only_run_end_to_end(make_run_files: Any, scan_for_secret: Any, tmp_path: Path) -> None:
    """Three shards against a key that admits 2 requests at once (429 with ``Retry-After`` above, the rate headers
    on every answer): the clients' gates share the key's budget and wait its 429s out, so the run succeeds; what
    they counted is what the key's own log says it received; nothing holds the key's value."""
    from fake_vllm.testing import start_server

    key = "sk-limited-" + "3" * 20
    log = tmp_path / "key.jsonl"
    limited = ["--served-model-name", "demo/writer-8b", "demo/judge-70b", "--fake-latency", "0.3",
               "--fake-rate-limit-in-flight", "2", "--fake-request-log", str(log)]  # fmt: skip
    with start_server("demo", args=limited, api_key=key) as endpoint:
        _hosted_only_run(make_run_files, scan_for_secret, endpoint.base_url, key, log)


def _hosted_only_run(make_run_files: Any, scan_for_secret: Any, base_url: str, key: str, log: Path) -> None:
    files = make_run_files("e2e", num_records=9, shards=3, buffer_size=2)
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

    script = (run_dir / "generate.sbatch").read_text()
    assert "#SBATCH --gres=none" in script and "#SBATCH --partition=cpu" in script
    assert "#SBATCH --array=0-2" in script and "#SBATCH --mem=1G" in script

    final = cli_json("wait", str(run_dir), "--json", env=files.env, outputs=OUTPUTS)
    assert final["state"] == "succeeded", final
    assert final["records_done"] == 9
    assert [s["state"] for s in final["shards"]] == ["succeeded"] * 3

    status = cli_json("status", str(run_dir), "--json", env=files.env, outputs=OUTPUTS)
    assert status["state"] == "succeeded"
    _ran_on_cpus_without_servers(run_dir, submitted["job_id"])

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
    # Issue 36: every request the key received was counted by the gate of the client that sent it, per model.
    counted: dict[tuple[str, str], int] = {}
    for usage in run_dir.glob("shards/*/attempts/*/hosted-usage.json"):
        for entry in read_json(usage, HostedUsage).keys:
            for what in ("requests", "succeeded", "limited"):
                counted[entry.model, what] = counted.get((entry.model, what), 0) + getattr(entry, what)
    for model in ("demo/writer-8b", "demo/judge-70b"):
        statuses = [r["status"] for r in chats if r["model"] == model]
        assert (counted[model, "requests"], counted[model, "succeeded"], counted[model, "limited"]) == (
            len(statuses), statuses.count(200), statuses.count(429)
        ), model  # fmt: skip
    [budget] = (run_dir / "budgets").glob("*.json")
    assert read_json(budget, KeyBudgetState).members == {}  # every client gave its share back
    # Nothing the run left behind holds the key: scripts, plan, snapshot, records, logs, data, budgets.
    assert scan_for_secret(run_dir, key) == []
    assert scan_for_secret(files.root, key) == []
    assert not any(key in text for text in OUTPUTS)


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
    """The provider answers every chat request with HTTP 500 (or 429, rate-limited) when the run starts (Data
    Designer's start-up health check gets it) and heals once an attempt has logged that it waits: with no retry of
    any kind allowed (``retries: 0``, ``client_retries: 0``), the run succeeds with every row, one attempt a
    shard."""
    from conftest import hosted_stand_in, write_run_files

    outage = tmp_path / "outage"
    outage.write_text(str(status))
    with hosted_stand_in(tmp_path, "--fake-outage", str(outage)) as endpoint:
        extra = "retries: 0\nclient_retries: 0\n" + layout
        files = write_run_files(tmp_path / "run", endpoint, num_records=6, shards=2, buffer_size=2, extra_run=extra)
        submitted = cli_json("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
        run_dir = Path(submitted["run_dir"])
        try:
            until(
                lambda: any(
                    '"provider.unavailable"' in p.read_text() for p in run_dir.glob("shards/*/attempts/*/client.log")
                ),
                300,
                "an attempt waiting for the provider",
            )
        finally:
            outage.write_text("")
        final = cli_json("wait", str(run_dir), "--json", env=files.env)
    assert final["state"] == "succeeded" and final["records_done"] == 6, final
    for shard in range(2):
        (only,) = attempts(run_dir, shard)
        assert (only.state, only.client_runs) == ("succeeded", 1), only
    chats = [json.loads(line) for line in endpoint.request_log.read_text().splitlines() if "/completions" in line]
    assert chats[0]["status"] == status and chats[-1]["status"] == 200
