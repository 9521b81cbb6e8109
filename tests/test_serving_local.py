"""The allocation controller outside Slurm (plain processes instead of srun steps): model servers started
from the plan, readiness, failures with reasons and log tails, secrets kept out of server environments.

The same code paths run under srun in tests/test_e2e_mixed.py.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import AttemptRecord, WinnerRecord, read_json
from tests.e2e import processes

pytestmark = pytest.mark.dd

REPO = Path(__file__).resolve().parents[1]
MIXED_RECIPE = REPO / "examples" / "mixed" / "recipe.yaml"
RUNTIME = Path(sys.executable).parent / "ddslurm-runtime"
FAKE_VLLM = Path(sys.executable).parent / "fake-vllm"
FAKE_SGLANG_PYTHON = Path(sys.executable).parent / "fake-sglang-python"


def _deployment(
    replicas: int = 1,
    tp: int = 1,
    timeout: int = 60,
    env: dict[str, str] | None = None,
    restarts: int = 0,
    engine: str = "vllm",
) -> str:
    """The generator's deployment; ``restarts``: ``server.restarts``, none unless a test asks (a replica that dies
    then fails the attempt at once)."""
    text = (
        "deployments:\n  - model_alias: generator\n    model: org/generator\n    served_model_name: qwen3-8b\n"
        f"    engine: {engine}\n"
        f"    replicas: {replicas}\n    tensor_parallel: {tp}\n    server:\n      startup_timeout: {timeout}\n"
        f"      cpus: 1\n      restarts: {restarts}\n"
    )
    if env:
        text += "      env:\n" + "".join(f"        {k}: '{v}'\n" for k, v in env.items())
    return text


def _env_dumping_vllm(tmp_path: Path) -> Path:
    """A `vllm` that records its environment, then becomes the stand-in with a request log of its own."""
    script = tmp_path / "vllm-wrapper"
    script.write_text(
        f'#!/bin/sh\nenv > "{tmp_path}/server-env-$$.txt"\n'
        f'FAKE_VLLM_REQUEST_LOG="{tmp_path}/requests-$$.jsonl" exec "{FAKE_VLLM}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def _run(start: Any, files: Any, job_id: str, *, gpus: str = "0", timeout: float = 240) -> tuple[Path, int]:
    """Run the attempt to its end; ``timeout`` bounds the wait (past it the test fails, the attempt is stopped)."""
    run_dir, proc = start(files, job_id, gpus=gpus)
    return run_dir, int(proc.returncode if proc.returncode is not None else _ended(proc, timeout))


def _ended(proc: subprocess.Popen[str], timeout: float) -> int:
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate(timeout=60)
        raise
    return proc.returncode


def _record(run_dir: Path, job_id: str) -> AttemptRecord:
    return read_json(
        run_dir / "shards" / "shard-00000" / "attempts" / f"attempt-{job_id}" / "attempt.json", AttemptRecord
    )


def _no_processes_left(run_dir: Path) -> None:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(run_dir) not in out


def scan_tree_for(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_local_generator_and_hosted_judge(
    make_run_files: Any, hosted_endpoint: Any, tmp_path: Path, local_attempt: Any
) -> None:
    wrapper = _env_dumping_vllm(tmp_path)
    files = make_run_files(
        "mixed",
        num_records=6,
        shards=1,
        recipe=MIXED_RECIPE,
        extra_run=_deployment(),
        vllm_executable=wrapper,
    )
    run_dir, code = _run(local_attempt, files, "11")
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / "attempt-11"
    assert code == 0, (attempt / "client.out").read_text()[-3000:]
    winner = read_json(run_dir / "shards" / "shard-00000" / "winner.json", WinnerRecord)
    assert winner.rows == 6
    served = [line for f in tmp_path.glob("requests-*.jsonl") for line in f.read_text().splitlines()]
    assert sum('"/v1/chat/completions"' in line for line in served) >= 6  # one generator request per record
    dumps = list(tmp_path.glob("server-env-*.txt"))
    assert dumps and all(files.env["DEMO_HOSTED_API_KEY"] not in d.read_text() for d in dumps)
    assert all("DEMO_HOSTED_API_KEY" not in d.read_text() for d in dumps)
    assert (attempt / "serving.json").is_file() and (attempt / "endpoints.json").is_file()
    # The server required the attempt's token (given in its environment), and every /v1 request carried it;
    # the health probes never do (whatever answers on a port may be another user's); the metrics scrape does, to a
    # listener proved this user's (an engine may guard /metrics).
    [token] = {line.partition("=")[2] for d in dumps for line in d.read_text().splitlines() if "VLLM_API_KEY=" in line}
    assert len(token) >= 32
    requests = [json.loads(line) for line in served]
    assert all(r["authorized"] for r in requests if r["path"].startswith("/v1/"))
    assert not any(r["auth_present"] for r in requests if r["path"] == "/health")
    assert all(r["authorized"] for r in requests if r["path"] == "/metrics")
    assert scan_tree_for(run_dir, token) == []
    _no_processes_left(run_dir)


def test_sglang_logs_its_key_and_the_server_log_keeps_none_of_it(
    make_run_files: Any, tmp_path: Path, local_attempt: Any
) -> None:
    """SGLang logs its arguments at INFO when it starts, ``api_key='…'`` among them (the stand-in as the real
    engine, sgl-project/sglang#37457): its output reaches the server log through the runtime, the token taken out,
    so the log keeps the line but not the token, and the secret scan publishes the shard instead of rejecting it."""
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(f'#!/bin/sh\nenv > "{tmp_path}/server-env-$$.txt"\nexec "{FAKE_SGLANG_PYTHON}" "$@"\n')
    wrapper.chmod(0o755)
    files = make_run_files(
        "sglang",
        num_records=6,
        shards=1,
        recipe=MIXED_RECIPE,
        extra_run=_deployment(engine="sglang"),
        extra_profile=f"sglang_executable: {wrapper}\n",
    )
    run_dir, code = _run(local_attempt, files, "12")
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / "attempt-12"
    logs = {str(p): p.read_text() for p in run_dir.rglob("server-generator-0.log")}
    assert code == 0, ((attempt / "client.out").read_text()[-3000:], _record(run_dir, "12").message, logs)
    assert read_json(run_dir / "shards" / "shard-00000" / "winner.json", WinnerRecord).rows == 6
    dumps = [d.read_text() for d in tmp_path.glob("server-env-*.txt")]
    [token] = {line.partition("=")[2] for d in dumps for line in d.splitlines() if line.startswith("VLLM_API_KEY=")}
    [log] = logs.values()
    assert "server_args=ServerArgs(model_path='org/generator', " in log and "api_key='[redacted]'" in log
    assert token not in log
    assert scan_tree_for(run_dir, token) == []
    _no_processes_left(run_dir)


def test_two_allocations_reuse_one_compile_cache_in_the_engine_cache_and_it_holds_no_token(
    make_run_files: Any, tmp_path: Path, local_attempt: Any
) -> None:
    """The stand-in as a vLLM before vllm-project/vllm#52523 (its compile cache hashes every ``VLLM_*`` variable,
    ``VLLM_API_KEY`` included): two runs, two allocations, two tokens. vLLM gets its key in its arguments (the
    boot program), never in its environment, so both servers name the same cache directory and the second loads
    what the first compiled; the cache is where the profile's ``engine_cache`` says (``VLLM_CACHE_ROOT`` inside
    it), and no byte of either token is under it or in a server log."""
    cache = tmp_path / "engine-cache"
    vllm = tmp_path / "bin" / "vllm"  # a Python script, as pip writes one: it records the key it was given
    vllm.parent.mkdir()
    vllm.write_text(
        f"#!{sys.executable}\nimport os, sys\nfrom fake_vllm.cli import main\n"
        "key = [a.partition('=')[2] for a in sys.argv if a.startswith('--api-key=')]\n"
        f"open(f'{tmp_path}/key-{{os.getpid()}}.txt', 'w').write(repr((key, os.environ.get('VLLM_API_KEY'))))\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    vllm.chmod(0o755)
    logs = []
    for name, job in (("first", "21"), ("second", "22")):
        files = make_run_files(
            name,
            num_records=3,
            shards=1,
            recipe=MIXED_RECIPE,
            extra_run=_deployment(env={"FAKE_VLLM_COMPILE_CACHE": "old"}),
            vllm_executable=vllm,
            extra_profile=f"engine_cache: {cache}\n",
        )
        run_dir, code = _run(local_attempt, files, job)
        assert code == 0, _record(run_dir, job).message
        [log] = [p.read_text() for p in run_dir.rglob("server-generator-0.log")]
        logs.append(log)
    given = [ast.literal_eval(p.read_text()) for p in tmp_path.glob("key-*.txt")]
    tokens = {key[0] for key, env in given if key}
    assert len(tokens) == 2 and all(env is None for _, env in given), given  # in its arguments, never its env
    compiled = list((cache / "vllm" / "torch_compile_cache").iterdir())
    assert len(compiled) == 1, compiled
    assert f"Using cache directory: {compiled[0]}/rank_0_0/backbone" in logs[0]
    assert "Compiling a graph" in logs[0] and "Directly load the compiled graph(s)" in logs[1]
    assert all(not scan_tree_for(cache, t) and not any(t in log for log in logs) for t in tokens)


@pytest.mark.parametrize(
    ("server_env", "timeout", "reason", "in_message", "bound_s"),
    [
        pytest.param(
            {"FAKE_VLLM_NEVER_HEALTHY": "1"}, 4, "server_not_ready", "not ready after 4 s", 120, id="never-healthy"
        ),
        pytest.param(
            {"FAKE_VLLM_FAIL_START": "1"},
            600,
            "server_start_failed",
            "Engine core initialization failed",
            120,
            id="fails-at-start",
        ),
        pytest.param(
            {"FAKE_VLLM_CRASH_AFTER": "3"}, 60, "server_died", "exited during generation", 90, id="crashes-mid-run"
        ),
    ],
)
def test_failing_server_fails_the_attempt_fast_with_reason_and_log_tail(
    make_run_files: Any,
    server_env: dict[str, str],
    timeout: int,
    reason: str,
    in_message: str,
    bound_s: float,
    local_attempt: Any,
) -> None:
    files = make_run_files(
        reason, num_records=12, shards=1, recipe=MIXED_RECIPE, extra_run=_deployment(timeout=timeout, env=server_env)
    )
    # Ports derive from the job id: each case its own, so cases running side by side never share a port.
    job = {"server_not_ready": "21", "server_start_failed": "22", "server_died": "23"}[reason]
    # Fast: the bound is far below what the slow failures would take (the startup timeout of 600 s, Data Designer
    # retrying a dead endpoint for minutes); past it the attempt is stopped and the test fails.
    run_dir, code = _run(local_attempt, files, job, timeout=bound_s)
    record = _record(run_dir, job)
    assert code == 1
    assert record.state == "failed" and record.reason == reason, record
    assert in_message in (record.message or "")
    assert not (run_dir / "shards" / "shard-00000" / "winner.json").exists()
    _no_processes_left(run_dir)


def test_gpu_mismatch_is_refused_before_any_server_starts(make_run_files: Any, local_attempt: Any) -> None:
    files = make_run_files("gpus", num_records=2, shards=1, recipe=MIXED_RECIPE, extra_run=_deployment(tp=2))
    run_dir, code = _run(local_attempt, files, "31", gpus="0")
    record = _record(run_dir, "31")
    assert code == 1 and record.reason == "gpu_mismatch"
    assert not list((run_dir / "shards" / "shard-00000" / "attempts" / "attempt-31").glob("server-*.log"))


def test_hosted_only_starts_no_server_or_proxy(run_files: Any, local_attempt: Any) -> None:
    run_dir, code = _run(local_attempt, run_files, "41", gpus="")
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / "attempt-41"
    assert code == 0
    assert not list(attempt.glob("server-*")) and not list(attempt.glob("proxy-*"))
    assert not (attempt / "serving.json").exists()
    assert os.environ.get("DEMO_HOSTED_API_KEY") is None  # the key lives only in the run's env mapping


def test_a_replica_that_keeps_crashing_is_restarted_in_place_and_the_attempt_gets_every_row(
    make_run_files: Any, local_attempt: Any
) -> None:
    """``server.restarts``: a replica that exits after every 5 requests is started again on the same GPU and
    socket, the proxy in front of it holds the clients' requests meanwhile, and the attempt ends with every row,
    its one client run never failed (issue 34)."""
    files = make_run_files(
        "restarts",
        num_records=12,
        shards=1,
        recipe=MIXED_RECIPE,
        extra_run=_deployment(env={"FAKE_VLLM_CRASH_AFTER": "5"}, restarts=4),
    )
    run_dir, proc = local_attempt(files, "24", gpus="0")
    controller_log = _finish(proc, 240)  # the controller logs to its standard error outside Slurm
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / "attempt-24"
    assert proc.returncode == 0, (attempt / "client.out").read_text()[-3000:]
    assert read_json(run_dir / "shards" / "shard-00000" / "winner.json", WinnerRecord).rows == 12
    record = _record(run_dir, "24")
    assert (record.state, record.client_runs) == ("succeeded", 1), record
    events = [json.loads(line) for line in controller_log.splitlines() if line.startswith("{") and '"server.' in line]
    restarted = [e for e in events if e.get("event") == "server.restarted"]
    died = [e for e in events if e.get("event") == "server.died"]
    # every death was restarted (its crash is in the server's log), and the log says how each restart ended: back
    # in rotation once the controller saw it healthy (during generation, or at its end: the proxy probes it sooner,
    # and the shard may end on its answers first), dead again before that, or still loading when the shard ended.
    crashes = (attempt / "server-generator-0.log").read_text().count("injected crash after answering 5 chat requests")
    restarting = [e for e in events if e.get("event") == "server.restarting"]
    assert 1 <= crashes == len(died) == len(restarting), [(e["event"], e.get("status")) for e in events]
    ends = ("server.restarted", "server.died", "server.restart_unfinished")
    outcomes = [
        next((x["event"] for x in events[i + 1 :] if x.get("event") in ends), None)
        for i, e in enumerate(events)
        if e.get("event") == "server.restarting"
    ]
    assert None not in outcomes and "server.restart_unfinished" not in outcomes[:-1], outcomes
    # the last restart answered the rows left after the last crash (12 rows, a crash after every 5 answers), so the
    # controller saw it healthy, at the latest when the shard ended
    assert outcomes[-1] == "server.restarted" and len(restarted) == outcomes.count("server.restarted"), outcomes
    assert all(e["load_s"] >= 0 for e in restarted)
    _no_processes_left(run_dir)


def test_a_hung_server_is_stopped_and_fails_the_attempt(make_run_files: Any, local_attempt: Any) -> None:
    """A replica that keeps its port but stops answering (SIGSTOP) leaves rotation after a few failed checks."""
    import json
    import signal

    files = make_run_files(
        "hung",
        num_records=40,
        shards=1,
        recipe=MIXED_RECIPE,
        extra_run=_deployment(env={"FAKE_VLLM_LATENCY": "0.5"}),
    )
    run_dir, proc = local_attempt(files, "51", gpus="0", extra=("--health-interval", "0.5", "--unhealthy-limit", "3"))
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / "attempt-51"
    deadline = time.monotonic() + 60
    while not (attempt / "endpoints.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    where = json.loads((attempt / "serving.json").read_text())["replicas"][0]["socket"]
    pids = subprocess.run(["pgrep", "-f", "--", f"--uds {where}"], capture_output=True, text=True, check=False).stdout
    assert pids.split()
    for pid in pids.split():
        os.kill(int(pid), signal.SIGSTOP)
    proc.communicate(timeout=120)  # the bound only keeps a replica that is never stopped from hanging the test
    assert proc.returncode == 1
    record = _record(run_dir, "51")
    assert record.reason == "server_died" and "every replica of 'generator'" in (record.message or "")
    _no_processes_left(run_dir)


def _proxy_pids(run_dir: Path) -> list[int]:
    """This run's proxy processes themselves (never an ``srun`` that started one), found by their log path."""
    return [
        pid
        for pid, argv in processes()
        if argv[0] != "srun" and " proxy --listen " in (args := " ".join(argv)) and str(run_dir) in args
    ]


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    """The attempt's stderr once it ended; one still running after ``timeout`` is cancelled (its teardown
    stops every step), so a failing test leaves nothing behind."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate(timeout=60)
        raise


def _wait_for_rows(attempt: Path, proc: subprocess.Popen[str], rows: int, timeout: float = 120) -> None:
    """Until the attempt's progress file shows ``rows`` (a batch is on disk: generation is under way)."""
    import json

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the attempt ended before {rows} rows: {proc.communicate()[1][-3000:]}"
        progress = attempt / "progress.json"
        if progress.is_file() and json.loads(progress.read_text())["rows"] >= rows:
            return
        time.sleep(0.05)
    raise AssertionError(f"no progress of {rows} rows in {timeout} s")


@pytest.mark.parametrize("client_retries", [0, 1])
def test_a_dead_proxy_fails_the_client_run_at_once_and_a_rerun_restarts_it(
    make_run_files: Any, local_attempt: Any, client_retries: int
) -> None:
    """Killing the proxy in front of two replicas mid-generation: without reruns the attempt fails at once with
    ``proxy_died``; with one rerun the proxy is started again and the shard gets exactly its records."""
    import json
    import signal

    files = make_run_files(
        f"proxy-{client_retries}",
        num_records=36,
        shards=1,
        buffer_size=6,
        recipe=MIXED_RECIPE,
        extra_run=_deployment(replicas=2, env={"FAKE_VLLM_LATENCY": "2"}) + f"client_retries: {client_retries}\n",
    )
    job = f"6{client_retries}"
    run_dir, proc = local_attempt(files, job, gpus="0,1")
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / f"attempt-{job}"
    _wait_for_rows(attempt, proc, 6)
    pids = _proxy_pids(run_dir)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    # Without a rerun the attempt ends within a minute (a bound, not a measurement): Data Designer retrying a dead
    # endpoint would take minutes, and _finish stops an attempt still running then and fails the test.
    stderr = _finish(proc, 60 if client_retries == 0 else 180)
    record = _record(run_dir, job)
    if client_retries == 0:
        assert proc.returncode == 1, stderr[-3000:]
        assert (record.state, record.reason, record.retryable) == ("failed", "proxy_died", True), record
        assert "proxy-generator" in (record.message or "") and "exited with status" in (record.message or "")
        assert not (run_dir / "shards" / "shard-00000" / "winner.json").exists()
    else:
        assert proc.returncode == 0, stderr[-3000:]
        assert record.state == "succeeded" and record.rows == 36 and record.client_runs == 2, record
        winner = read_json(run_dir / "shards" / "shard-00000" / "winner.json", WinnerRecord)
        import pyarrow.parquet as pq

        assert winner.rows == 36 and pq.read_table(Path(winner.dataset_dir) / "parquet-files").num_rows == 36
        events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
        assert "proxy.died" in events and "proxy.restarted" in events
        proxy_log = [json.loads(line)["event"] for line in (attempt / "proxy-generator.log").read_text().splitlines()]
        assert proxy_log.count("proxy.started") == 2
    _no_processes_left(run_dir)


def test_a_hung_proxy_is_stopped_and_fails_the_client_run(make_run_files: Any, local_attempt: Any) -> None:
    """A proxy that keeps its port but answers nothing (SIGSTOP) is stopped after a few checks: proxy_died."""
    import signal

    files = make_run_files(
        "proxy-hung",
        num_records=36,
        shards=1,
        buffer_size=6,
        recipe=MIXED_RECIPE,
        extra_run=_deployment(replicas=2, env={"FAKE_VLLM_LATENCY": "2"}) + "client_retries: 0\n",
    )
    run_dir, proc = local_attempt(files, "71", gpus="0,1", extra=("--health-interval", "0.5", "--unhealthy-limit", "2"))
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / "attempt-71"
    _wait_for_rows(attempt, proc, 6)
    [pid] = _proxy_pids(run_dir)
    os.kill(pid, signal.SIGSTOP)
    _finish(proc, 60)  # the bound only keeps a proxy that is never stopped from hanging the test
    record = _record(run_dir, "71")
    assert proc.returncode == 1
    assert (record.state, record.reason) == ("failed", "proxy_died"), record
    assert "without an answer" in (record.message or "")
    _no_processes_left(run_dir)


@pytest.mark.parametrize("limit", ["0", "null"])
def test_answers_without_choices_fail_the_attempt_with_counts_per_column(
    make_run_files: Any, local_attempt: Any, tmp_path: Path, limit: str
) -> None:
    """The generator answers about half of its requests with HTTP 200 and no ``choices``; Data Designer stores
    those as empty text (an llm-code column would retry them: its parser finds no code). With
    ``max_empty_outputs: 0`` (the default) nothing is published and the record says how many values of which
    column were empty; ``null`` turns the check off."""
    import yaml

    recipe_dir = tmp_path / f"recipe-{limit}"
    recipe_dir.mkdir()
    recipe = yaml.safe_load(MIXED_RECIPE.read_text())
    for column in recipe["data_designer"]["columns"]:
        if column["name"] == "sql":  # the generator's column as LLM text
            column["column_type"] = "llm-text"
            del column["code_lang"]
    (recipe_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (recipe_dir / "questions.csv").write_bytes((MIXED_RECIPE.parent / "questions.csv").read_bytes())
    files = make_run_files(
        f"no-choices-{limit}",
        num_records=12,
        shards=1,
        buffer_size=6,
        recipe=recipe_dir / "recipe.yaml",
        extra_run=_deployment(env={"FAKE_VLLM_NO_CHOICES_RATE": "0.5"})
        + f"client_retries: 0\nmax_empty_outputs: {limit}\n",
    )
    run_dir, code = _run(local_attempt, files, f"8{len(limit)}")
    record = _record(run_dir, f"8{len(limit)}")
    winner = run_dir / "shards" / "shard-00000" / "winner.json"
    if limit == "null":  # what every run did before the check: the empty answers are published
        assert code == 0 and record.state == "succeeded" and winner.exists(), record
        import pyarrow.parquet as pq

        published = read_json(winner, WinnerRecord)
        assert "" in pq.read_table(Path(published.dataset_dir) / "parquet-files").column("sql").to_pylist()
        return
    assert code == 1
    assert (record.state, record.reason, record.retryable) == ("failed", "empty_outputs", True), record
    assert "sql: " in (record.message or "") and " of 12" in (record.message or "")
    assert "max_empty_outputs: 0" in (record.message or "")
    assert not winner.exists()
    attempt = run_dir / "shards" / "shard-00000" / "attempts" / f"attempt-8{len(limit)}"
    assert not (attempt / "output" / "shard-00000").exists()  # set aside: no rerun or retry resumes it
    assert len(list((attempt / "output").glob("rejected-shard-00000-*"))) == 1
    _no_processes_left(run_dir)
