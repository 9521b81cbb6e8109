"""A dead proxy on the real local Slurm cluster: the proxy is an ``srun`` step in front of two replicas (each
its own step on its own fake GPU). Killing the proxy's task mid-generation fails the client run at once with
``proxy_died``; the in-allocation rerun starts a new proxy step and the shard gets exactly its records. Another
user (``nobody``) racing for the proxy's port all along never binds it, gets no request, and no row is its.

The same controller paths run with plain processes in tests/test_serving_local.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import AttemptRecord, WinnerRecord, read_json
from tests.e2e import MIXED_RECIPE, generator, processes
from tests.e2e import run_cli as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

RECORDS = 36
GENERATOR = generator(model="m", replicas=2, env={"FAKE_VLLM_LATENCY": "2"})


SQUATTER = r"""
import json, os, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port, stop = int(sys.argv[1]), sys.argv[2]
class Impostor(BaseHTTPRequestHandler):
    def _answer(self):
        print(json.dumps({"request": self.path, "auth": self.headers.get("Authorization")}), flush=True)
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "IMPOSTOR"}}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *a): pass
class Server(HTTPServer):
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
tries, errors, server = 0, set(), None
while not os.path.exists(stop):
    tries += 1
    try:
        server = Server(("127.0.0.1", port), Impostor)
    except OSError as exc:
        errors.add(exc.strerror); time.sleep(0.005); continue
    print(json.dumps({"bound": True, "at": time.time()}), flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while not os.path.exists(stop):
        time.sleep(0.1)
print(json.dumps({"tries": tries, "errors": sorted(errors), "bound": server is not None}), flush=True)
"""


def _proxy_tasks(attempt: Path) -> list[int]:
    """The proxy step's task (started by slurmstepd), never the ``srun`` that asked for it; found by the
    attempt's log path in its command line."""
    log = str(attempt / "proxy-generator.log")
    return [pid for pid, argv in processes() if argv[0] != "srun" and "proxy" in argv and log in argv]


def _attempt_with_rows(run_dir: Path, rows: int, timeout: float = 240) -> Path:
    """The running attempt once its progress file shows ``rows`` (a batch on disk: generation under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for progress in run_dir.glob("shards/shard-00000/attempts/attempt-*/progress.json"):
            try:
                if json.loads(progress.read_text())["rows"] >= rows:
                    return progress.parent
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    raise AssertionError(f"no attempt of {run_dir} reached {rows} rows in {timeout} s")


@pytest.mark.parametrize("client_retries", [0, 1])
def test_killed_proxy_step_fails_fast_and_the_rerun_starts_a_new_one(make_run_files: Any, client_retries: int) -> None:
    files = make_run_files(
        f"proxy-fault-{client_retries}",
        num_records=RECORDS,
        shards=1,
        buffer_size=6,
        recipe=MIXED_RECIPE,
        extra_run=GENERATOR + f"client_retries: {client_retries}\nstages: single\n",  # the judge behind the proxy
    )
    submitted = _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=files.env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    run_dir = Path(json.loads(submitted.stdout)["run_dir"])
    job_id = json.loads(submitted.stdout)["job_id"]
    stop = Path(tempfile.mkdtemp(prefix="squat-", dir="/tmp"))
    stop.chmod(0o755)  # the other user looks for its stop file here
    squatter: subprocess.Popen[str] | None = None
    try:
        attempt = _attempt_with_rows(run_dir, 6)
        [proxy_url] = json.loads((attempt / "endpoints.json").read_text()).values()
        if os.getuid() == 0 and Path("/usr/bin/python3").exists():
            # Another user races for the proxy's port from now until the shard ends: before, while and after the
            # proxy dies and is started again. The controller holds the port: the squatter never binds it.
            port = proxy_url.removesuffix("/v1").rpartition(":")[2]
            squatter = subprocess.Popen(
                ["/usr/bin/python3", "-c", SQUATTER, port, str(stop / "stop")], user=65534, group=65534, cwd="/",
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(0.5)
        [pid] = _proxy_tasks(attempt)
        os.kill(pid, signal.SIGKILL)
        done = _cli("wait", str(run_dir), "--json", "--timeout", "240", env=files.env, timeout=300)
    except BaseException:
        _cli("cancel", str(run_dir), env=files.env, timeout=60)  # leave no job behind
        raise
    finally:
        (stop / "stop").write_text("")
        squatted = squatter.communicate(timeout=60)[0] if squatter is not None else ""
        shutil.rmtree(stop, ignore_errors=True)
    final = json.loads(done.stdout)
    record = read_json(attempt / "attempt.json", AttemptRecord)
    lines = [json.loads(line) for line in squatted.splitlines()]
    assert not any("request" in line for line in lines), lines  # no token, no traffic
    if squatter is not None:
        assert lines[-1]["errors"] == ["Address already in use"] and lines[-1]["tries"] > 10, lines
        # The port is free again once the allocation has ended, and only then.
        ended = datetime.fromisoformat(record.ended_at or "9999-01-01T00:00:00+00:00").timestamp()
        assert all(line["at"] > ended for line in lines if "at" in line), (lines, record.ended_at)
    steps = subprocess.run(
        ["sacct", "-n", "-P", "-j", str(job_id), "--format=JobName"], capture_output=True, text=True, check=True
    ).stdout.split()
    if client_retries == 0:
        assert done.returncode == 1 and final["state"] == "failed", done.stdout
        assert (record.state, record.reason, record.retryable) == ("failed", "proxy_died", True), record
        assert "proxy-generator" in (record.message or "")
        assert record.ended_at is not None and (record.rows or 0) < RECORDS  # it ended with the proxy, not later
        assert steps.count("proxy-generator") == 1
    else:
        assert done.returncode == 0 and final["state"] == "succeeded", (attempt / "client.out").read_text()[-3000:]
        assert record.state == "succeeded" and record.rows == RECORDS and record.client_runs == 2, record
        winner = read_json(run_dir / "shards" / "shard-00000" / "winner.json", WinnerRecord)
        assert winner.rows == RECORDS
        table = pq.read_table(Path(winner.dataset_dir) / "parquet-files")
        assert table.num_rows == RECORDS
        assert not any("IMPOSTOR" in str(value) for column in table.to_pylist() for value in column.values())
        # a new proxy step and a new client step, each under its own Slurm name (NAME.2: the second start of NAME)
        assert steps.count("proxy-generator") == steps.count("proxy-generator.2") == 1, steps
        assert steps.count("client") == steps.count("client.2") == 1, steps
        proxy_log = [json.loads(line)["event"] for line in (attempt / "proxy-generator.log").read_text().splitlines()]
        assert proxy_log.count("proxy.started") == 2
