"""``ddslurm retry`` knows why shards failed (issue 40): after ``key_refused`` it asks the provider with this shell's
key first and submits nothing while the key is still refused; a failure the run's frozen plan would repeat is refused
(unless ``--force``) or named in a mix, and ``status`` says the same; ``retry --dry-run`` previews each shard's
attempt, the rows it resumes from the batches on disk and the resume mode. A fake Slurm records every ``sbatch``; the
provider is the vLLM stand-in, with a key of its own."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddslurm.config import RunLayout
from ddslurm.launcher import Slurm, prepare, submit_shards, write_run_dir
from ddslurm.launcher.api import Client, RetryRefusedError
from ddslurm.launcher.cli import main
from ddslurm.launcher.commands._output import ExitCode
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, accept_recipe, write_attempt, write_unit_run
from fake_vllm.testing import RunningServer, start_server

RIGHT = "sk-right-" + os.urandom(8).hex()
WRONG = "sk-wrong-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def provider() -> Iterator[RunningServer]:
    """The hosted provider: the stand-in serving the recipe's model, taking only :data:`RIGHT`."""
    with start_server("m-1", api_key=RIGHT) as server:
        yield server


def _submitted(root: Path, endpoint: str, key: str, *, shards: int = 3) -> tuple[RunLayout, dict[str, str]]:
    """A run of ``shards`` shards whose provider is ``endpoint``, submitted to a fake Slurm as array 4242 (task i runs
    shard i), and the environment holding ``key`` in HOSTED_KEY."""
    providers = f"- {{name: hosted, endpoint: '{endpoint}', api_key: HOSTED_KEY}}\n"
    run, profile, env = write_unit_run(root, key, providers=providers, num_records=10 * shards, shards=shards)
    now = datetime.now(UTC)
    prepared = prepare(run, profile, env, now, check_recipe=accept_recipe)
    write_run_dir(prepared)
    submit_shards(prepared.layout, prepared.plan, list(range(shards)), Slurm(FakeSlurm()), env, now)
    return prepared.layout, env


def _ended(shards: int) -> FakeSlurm:
    """Slurm after every task of array 4242 failed; new arrays from 5000."""
    slurm = FakeSlurm(sacct="".join(f"4242_{s}|FAILED|1:0|None\n" for s in range(shards)))
    slurm.next_id = 5000
    return slurm


def _failed(layout: RunLayout, shard: int, reason: str, job: str | None = None, **kwargs: Any) -> None:
    write_attempt(layout, shard, job or f"4242_{shard}", "failed", task=f"4242_{shard}", reason=reason, **kwargs)


def _cli(argv: list[str], env: dict[str, str], runner: FakeSlurm) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, env=env, slurm=Slurm(runner, env=env), stdout=out, stderr=err, sleep=lambda _: None)
    return code, out.getvalue(), err.getvalue()


# --- key_refused: the provider asked again ---


def test_retry_after_key_refused_submits_nothing_while_the_key_is_still_refused_and_submits_with_the_right_key(
    tmp_path: Path, provider: RunningServer
) -> None:
    layout, env = _submitted(tmp_path, provider.base_url, WRONG, shards=2)
    for shard in (0, 1):
        _failed(layout, shard, "key_refused")
    slurm = _ended(2)

    code, out, err = _cli(["retry", str(layout.root)], env, slurm)

    assert (code, out) == (ExitCode.FAILED, "")
    assert "shards 0-1 failed with key_refused" in err
    assert f"provider 'hosted' ({provider.base_url}) still refuses the key in HOSTED_KEY: key refused (HTTP 401)" in err
    assert "nothing was submitted: export the right key in HOSTED_KEY in this shell, then `ddslurm retry" in err
    assert WRONG not in err and RIGHT not in err
    assert slurm.commands("sbatch") == []

    code, out, err = _cli(["retry", str(layout.root), "--dry-run", "--json"], env, slurm)  # a dry run says the same
    assert code == ExitCode.FAILED and "HOSTED_KEY" in json.loads(out)["error"]["message"]
    assert slurm.commands("sbatch") == []

    code, out, err = _cli(["retry", str(layout.root)], {**env, "HOSTED_KEY": RIGHT}, slurm)

    assert code == ExitCode.OK, err
    assert out == "retrying 2 shard(s) as array job(s) 5000\n" and err == ""
    assert len(slurm.commands("sbatch")) == 1


def test_the_api_refuses_an_automatic_retrys_not_retried_after_key_refused_too(
    tmp_path: Path, provider: RunningServer
) -> None:
    """An automatic retry array's task recorded ``not_retried`` after the ``key_refused``: the cause behind it is
    what is weighed. ``Client.retry`` raises :class:`RetryRefusedError`; with the right key it submits."""
    layout, env = _submitted(tmp_path, provider.base_url, WRONG, shards=1)
    _failed(layout, 0, "key_refused", started="2026-01-01T00:00:00+00:00", ended="2026-01-01T00:01:00+00:00")
    _failed(
        layout, 0, "not_retried", job="4243_0", started="2026-01-01T00:02:00+00:00", ended="2026-01-01T00:02:01+00:00"
    )
    slurm = _ended(1)

    def client(key: str) -> Client:
        environ = {**env, "HOSTED_KEY": key}
        return Client(env=environ, slurm=Slurm(slurm, env=environ), engine_host=InProcessHost(), sleep=lambda _: None)

    with pytest.raises(RetryRefusedError, match=r"shard 0 failed with key_refused, and provider 'hosted' .*HOSTED_KEY"):
        client(WRONG).retry(layout.root)
    assert slurm.commands("sbatch") == []
    assert client(RIGHT).retry(layout.root).job_ids == ("5000",)


# --- failures the frozen plan repeats ---


def test_a_retry_of_only_server_start_failed_shards_is_refused_unless_forced_and_status_says_why(
    tmp_path: Path, provider: RunningServer
) -> None:
    layout, env = _submitted(tmp_path, provider.base_url, RIGHT, shards=2)
    for shard in (0, 1):
        _failed(layout, shard, "server_start_failed")
    slurm = _ended(2)
    said = (
        "shards 0-1 failed with server_start_failed, and a retry would fail the same way: the model servers' command "
        "lines (the model, server.extra_args, server.env, the container image) are frozen in the plan, so every new "
        "attempt starts the same servers; fix the run file and submit it again (`ddslurm submit RUN_FILE`; the run's "
        f"copy is {layout.run_file}); `ddslurm logs {layout.root} --step server` shows why the server exited"
    )

    code, out, err = _cli(["retry", str(layout.root)], env, slurm)

    assert (code, out) == (ExitCode.FAILED, "")
    assert err == (
        f"error: nothing was submitted: {said}\n  (`ddslurm retry {layout.root} --force` retries anyway, for a cause "
        "outside the plan that is gone now)\n"
    )
    assert slurm.commands("sbatch") == []

    code, out, _ = _cli(["status", str(layout.root)], env, slurm)  # status names the same way out
    assert code == ExitCode.OK and f"a retry would fail the same way: {said}" in " ".join(out.split())

    code, out, err = _cli(["retry", str(layout.root), "--force"], env, slurm)
    assert code == ExitCode.OK, err
    assert out == f"retrying 2 shard(s) as array job(s) 5000\nwarning: --force: {said}\n"
    assert len(slurm.commands("sbatch")) == 1


def test_a_server_killed_before_it_was_ready_is_retried_without_a_word(tmp_path: Path, provider: RunningServer) -> None:
    """A server killed by a signal before it was ready (``server_killed``: kill -9, the OOM killer) is not the plan's
    doing: retry submits it as any failure, and status gives no "would fail the same way" (the fault campaign's seed
    461692 killed a starting server and its retries were refused)."""
    layout, env = _submitted(tmp_path, provider.base_url, RIGHT, shards=2)
    for shard in (0, 1):
        _failed(layout, shard, "server_killed")
    slurm = _ended(2)
    code, out, _ = _cli(["status", str(layout.root)], env, slurm)
    assert code == ExitCode.OK and "would fail the same way" not in out
    code, out, err = _cli(["retry", str(layout.root)], env, slurm)
    assert code == ExitCode.OK, err
    assert out == "retrying 2 shard(s) as array job(s) 5000\n" and len(slurm.commands("sbatch")) == 1


def test_a_mix_retries_every_shard_and_names_those_that_would_fail_the_same_way(
    tmp_path: Path, provider: RunningServer
) -> None:
    layout, env = _submitted(tmp_path, provider.base_url, RIGHT, shards=3)
    _failed(layout, 0, "generation_failed")
    _failed(layout, 1, "recipe_invalid")
    _failed(layout, 2, "node_fail")
    slurm = _ended(3)

    code, out, err = _cli(["retry", str(layout.root), "--json"], env, slurm)

    assert code == ExitCode.OK, err
    done = json.loads(out)
    assert (done["shards"], done["job_ids"]) == ([0, 1, 2], ["5000"])
    [warning] = done["warnings"]
    assert warning.startswith("shard 1 failed with recipe_invalid, and a retry would fail the same way: the recipe is")
    assert "`ddslurm retry" in warning and warning.endswith("(retried with the others; --shards leaves them out)")


def _batches(dataset: Path, sizes: list[int], *, metadata: bool = True) -> None:
    """Data Designer's dataset directory of an attempt: one batch file of ``sizes[i]`` rows each (LLM column ``q``
    filled), and its ``metadata.json`` unless not."""
    (dataset / "parquet-files").mkdir(parents=True)
    for i, n in enumerate(sizes):
        table = pa.table({"topic": ["a"] * n, "q": [f"row {i}.{j}" for j in range(n)]})
        pq.write_table(table, dataset / "parquet-files" / f"batch_{i:05d}.parquet")
    if metadata:
        (dataset / "metadata.json").write_text(json.dumps({"target_num_records": 10, "buffer_size": 3}))


def _resumable_rows(shard_dir: Path) -> dict[str, int]:
    """The oracle: per attempt, the rows of its batch files when its dataset has Data Designer's metadata (without
    it Data Designer resumes nothing)."""
    rows = {}
    for dataset in shard_dir.glob("attempts/attempt-*/output/shard-*"):
        if (dataset / "metadata.json").is_file():
            files = sorted((dataset / "parquet-files").glob("batch_*.parquet"))
            rows[dataset.parent.parent.name] = sum(pq.read_metadata(f).num_rows for f in files)
    return rows


def test_a_time_limit_with_no_saved_batch_would_repeat_and_one_with_batches_resumes(
    tmp_path: Path, provider: RunningServer
) -> None:
    layout, env = _submitted(tmp_path, provider.base_url, RIGHT, shards=2)
    _failed(layout, 0, "time_limit")
    _failed(layout, 1, "time_limit")
    _batches(layout.shard(1).attempt("attempt-4242_1").output / "shard-00001", [3])
    slurm = _ended(2)

    code, out, err = _cli(["retry", str(layout.root), "--shards", "0"], env, slurm)
    assert code == ExitCode.FAILED and "shard 0 failed with time_limit, and a retry would fail the same way" in err
    assert "raise submission.time_limit, use more shards or a smaller buffer_size" in err

    code, out, err = _cli(["retry", str(layout.root), "--shards", "1", "--json"], env, slurm)
    assert code == ExitCode.OK, err
    assert json.loads(out)["warnings"] == []  # it resumes its 3 rows: not the same attempt again


# --- retry --dry-run: the preview ---


def test_the_dry_run_previews_each_shards_attempt_the_rows_it_resumes_and_the_resume_mode(
    tmp_path: Path, provider: RunningServer
) -> None:
    layout, env = _submitted(tmp_path, provider.base_url, RIGHT, shards=3)
    shard1 = layout.shard(1)
    _failed(layout, 1, "client_failed", job="4242_1", started="2026-01-01T00:00:00+00:00")
    _batches(shard1.attempt("attempt-4242_1").output / "shard-00001", [3, 3])
    _failed(layout, 1, "generation_failed", job="5001_0", started="2026-01-01T01:00:00+00:00")
    _batches(shard1.attempt("attempt-5001_0").output / "shard-00001", [3, 3, 3], metadata=False)  # resumes nothing
    _failed(layout, 2, "generation_failed")
    slurm = _ended(3)
    oracle = _resumable_rows(shard1.dir)
    best = max(oracle, key=lambda a: oracle[a])
    attempts = len(list(shard1.attempts.glob("attempt-*")))

    code, out, err = _cli(["retry", str(layout.root), "--shards", "1,2", "--dry-run", "--json"], env, slurm)

    assert code == ExitCode.OK, err
    shown = json.loads(out)["preview"]
    assert shown == [
        {"shard": 1, "attempt": attempts + 1, "stage": None, "resume": "if_possible", "resume_rows": oracle[best],
         "resume_from": best, "repeats": None},
        {"shard": 2, "attempt": 2, "stage": None, "resume": "if_possible", "resume_rows": 0, "resume_from": None,
         "repeats": None},
    ]  # fmt: skip
    assert (oracle[best], best) == (6, "attempt-4242_1")  # the one with metadata, not the larger one without

    code, out, err = _cli(["retry", str(layout.root), "--shards", "1,2", "--dry-run"], env, slurm)
    assert code == ExitCode.OK, err
    assert out.splitlines()[:3] == [
        "dry run: a retry would submit 2 shard(s): 1-2",
        f"  shard 1: attempt {attempts + 1}, resumes {oracle[best]} rows of {best} (resume: if_possible)",
        "  shard 2: attempt 2, starts from nothing: no saved batch to resume (resume: if_possible)",
    ]

    code, out, err = _cli(["retry", str(layout.root), "--shards", "1", "--dry-run", "--fresh", "--json"], env, slurm)
    assert code == ExitCode.OK, err
    [fresh] = json.loads(out)["preview"]
    assert (fresh["resume"], fresh["resume_rows"], fresh["resume_from"]) == ("fresh", 0, None)
    assert slurm.commands("sbatch") == [] and not shard1.fresh.exists()  # a dry run changes nothing
