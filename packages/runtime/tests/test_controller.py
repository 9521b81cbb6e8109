"""The controller's decisions with stand-in steps: reruns of the generation step inside the allocation."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

import pytest

from ddslurm.config import (
    AttemptRecord,
    ClaimRecord,
    ProviderSnapshot,
    RunLayout,
    SnapshotModel,
    SnapshotProvider,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.runtime import Inputs
from ddslurm.runtime._controller import Controller
from ddslurm.runtime._steps import Step, StepSpec
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._workers import ClaimPool
from ddslurm.runtime.testing import make_controller, write_plan

CLIENT = """
import sys, msgspec
from pathlib import Path
from typing import Literal
from ddslurm.config import AttemptRecord, atomic_write, encode, read_json
import time
record_path = Path(sys.argv[1]); outcome = sys.argv[2]
if len(sys.argv) > 3:  # started before its endpoints (model load, or a spare client): wait for them, as the client does
    while not Path(sys.argv[3]).exists():
        time.sleep(0.02)
record = read_json(record_path, AttemptRecord)
if outcome == "crash":
    sys.exit(3)
if outcome == "gated":  # runs until the test lets it finish
    while not (record_path.parent / "go").exists():
        time.sleep(0.02)
    outcome = "ok"
if outcome == "slow":  # one span of generation, for the tests of pulling allocations' client workers
    began = time.time(); time.sleep(0.5)
    (record_path.parent / "span.txt").write_text(f"{began} {time.time()}")
    outcome = "ok"
state = {"fail": "failed", "ok": "succeeded"}[outcome]
atomic_write(record_path, encode(msgspec.structs.replace(
    record, state=state, reason=None if state == "succeeded" else "generation_failed",
    retryable=state == "failed", client_runs=record.client_runs + 1)))
"""


class ScriptedLauncher:
    """Runs each client step as a tiny script whose outcome is scripted per run (first run, second run, ...)."""

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.client_argv: list[tuple[str, ...]] = []

    def start(self, spec: StepSpec) -> Step:
        assert spec.name == "client" or spec.name.startswith("client-")
        self.client_argv.append(spec.argv)
        run_dir = Path(spec.argv[spec.argv.index("--run-dir") + 1])
        shard = int(spec.argv[spec.argv.index("--shard") + 1])
        attempt = spec.argv[spec.argv.index("--attempt") + 1]
        record = RunLayout(run_dir).shard(shard).attempt(attempt).record
        outcome = self.outcomes[len(self.client_argv) - 1]
        wait = [spec.argv[spec.argv.index("--endpoints") + 1]] if "--wait-endpoints" in spec.argv else []
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(record), outcome, *wait], start_new_session=True)
        return Step(spec, proc)


def _controller(tmp_path: Path, launcher: ScriptedLauncher, client_retries: int) -> tuple[Controller, Inputs]:
    layout, inputs = write_plan(tmp_path / "run-1", make_plan("run-1", (4,), client_retries=client_retries))
    return make_controller(layout, launcher, scratch_home=tmp_path, poll=0.05), inputs


@pytest.mark.parametrize(
    ("outcomes", "retries", "code", "state", "runs"),
    [
        pytest.param(["fail", "ok"], 1, 0, "succeeded", 2, id="retryable-failure-then-success"),
        pytest.param(["crash", "ok"], 1, 0, "succeeded", 2, id="client-died-then-success"),
        pytest.param(["fail", "fail"], 1, 1, "failed", 2, id="retries-used-up"),
        pytest.param(["fail"], 0, 1, "failed", 1, id="no-retries"),
        pytest.param(["ok"], 1, 0, "succeeded", 1, id="first-run-succeeds"),
    ],
)
def test_generation_step_is_rerun_inside_the_allocation(
    tmp_path: Path, outcomes: list[str], retries: int, code: int, state: str, runs: int
) -> None:
    launcher = ScriptedLauncher(outcomes)
    controller, inputs = _controller(tmp_path, launcher, retries)
    assert controller.run(inputs, 0, "9", "n1") == code
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9").record, AttemptRecord)
    assert record.state == state
    assert len(launcher.client_argv) == runs
    assert "--resume" not in launcher.client_argv[0]
    assert all("--resume" in argv for argv in launcher.client_argv[1:])


def test_a_client_ended_by_the_jobs_own_cancellation_records_cancelled(tmp_path: Path) -> None:
    """scancel signals the steps and the batch step together: a client that dies a moment before the
    controller sees the signal is recorded `cancelled`, not `client_failed` (and not rerun)."""
    launcher = ScriptedLauncher(["crash", "ok"])
    controller, inputs = _controller(tmp_path, launcher, 1)
    stop: StopSignal = controller._stop  # the signal handler's view, set 0.3 s after the client died
    threading.Timer(0.3, lambda: (setattr(stop, "reason", "SIGTERM"), stop.event.set())).start()
    controller.run(inputs, 0, "9", "n1")
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9").record, AttemptRecord)
    assert (record.state, record.reason) == ("failed", "cancelled"), record
    assert len(launcher.client_argv) == 1


# --- a proxy that dies while the client depends on it -------------------------------------------------------

STAND_IN = """
import json, os, socket, socketserver, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
TOKEN = os.environ.get("VLLM_API_KEY")
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if TOKEN and self.path != "/health" and self.headers.get("Authorization") != "Bearer " + TOKEN:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"data": [{"id": "served"}]}).encode() if self.path == "/v1/models" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
class ReusePortServer(ThreadingHTTPServer):
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as the proxy's --reuse-port
        super().server_bind()
where = sys.argv[1]
if where.startswith("unix:"):
    UnixServer(where[len("unix:"):], Handler).serve_forever()
server = ReusePortServer if "--reuse-port" in sys.argv else ThreadingHTTPServer
server(("127.0.0.1", int(where)), Handler).serve_forever()
"""


class ServingLauncher(ScriptedLauncher):
    """Servers and proxies are tiny HTTP stand-ins (200 on /health, the served name on /v1/models; like vLLM,
    ``/v1/*`` needs ``Authorization: Bearer $VLLM_API_KEY`` when the step's environment sets it); clients are
    scripted as above, plus ``hang`` (runs until stopped)."""

    def __init__(self, outcomes: list[str]) -> None:
        super().__init__(outcomes)
        self.proxies: list[Step] = []
        self.servers: list[Step] = []
        self.clients: list[Step] = []

    def start(self, spec: StepSpec) -> Step:
        if spec.name == "client" or spec.name.startswith("client-"):
            outcome = self.outcomes[len(self.client_argv)]
            if outcome == "hang":
                self.client_argv.append(spec.argv)
                hang = [sys.executable, "-c", "import time; time.sleep(120)"]
                step = Step(spec, subprocess.Popen(hang, start_new_session=True))
            else:
                step = super().start(spec)
            self.clients.append(step)
            return step
        if spec.name.startswith("proxy-"):
            where = spec.argv[spec.argv.index("--listen") + 1].rpartition(":")[2]
        elif "--uds" in spec.argv:
            where = "unix:" + spec.argv[spec.argv.index("--uds") + 1]
        else:
            where = spec.argv[spec.argv.index("--port") + 1]
        stand_in = [sys.executable, "-c", STAND_IN, where, *[a for a in spec.argv if a == "--reuse-port"]]
        step = Step(spec, subprocess.Popen(stand_in, env={**os.environ, **spec.env}, start_new_session=True))
        (self.proxies if spec.name.startswith("proxy-") else self.servers).append(step)
        return step


def _serving_controller(
    tmp_path: Path,
    launcher: ServingLauncher,
    client_retries: int,
    *,
    env: dict[str, str] | None = None,
    snapshot: ProviderSnapshot | None = None,
    env_from: tuple[str, ...] = (),
    secret_env: tuple[str, ...] = (),
    shard_rows: tuple[int, ...] = (4,),
    workers: int = 1,
    listen: Literal["tcp", "unix"] = "tcp",
    calibrate: tuple[int, ...] = (),
) -> tuple[Controller, Inputs]:
    from ddslurm.config import DeploymentPlan, ReplicaPlan, ServingPlan

    replicas = tuple(ReplicaPlan(index=i, gpus=1, cpus=1) for i in range(2))
    deployment = DeploymentPlan(
        alias="gen", model="m", served_model_name="served", tensor_parallel=1, replicas=replicas, startup_timeout=30,
        proxy=True, env={"VLLM_LOGGING_LEVEL": "INFO"}, env_from=env_from, listen=listen,
    )  # fmt: skip
    serving = ServingPlan(deployments=(deployment,), gpus=2, vllm_executable=str(tmp_path / "no-vllm"))
    plan = make_plan(
        "run-1",
        shard_rows,
        client_retries=client_retries,
        client_workers=workers,
        allocations=None if len(shard_rows) == 1 else 1,
        serving=serving,
        secret_env=secret_env,
        server_secret_env=env_from,
        calibrate=calibrate,
    )
    layout, inputs = write_plan(tmp_path / "run-1", plan, snapshot=snapshot)
    controller = make_controller(
        layout, launcher, env={"CUDA_VISIBLE_DEVICES": "0,1", **(env or {})}, grace=2.0, poll=0.05
    )
    return controller, inputs


def _kill_first_proxy_once_the_client_runs(launcher: ServingLauncher, run_dir: Path) -> threading.Thread:
    """Once generation has begun: the client step runs and the endpoints were handed to it (the client starts
    while the servers load and waits for ``endpoints.json``)."""

    def kill() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (launcher.clients and any(run_dir.rglob("endpoints.json"))):
            time.sleep(0.02)
        launcher.proxies[0].proc.kill()

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("outcomes", "retries", "code", "state", "proxies"),
    [
        pytest.param(["hang"], 0, 1, "failed", 1, id="no-rerun-fails-with-proxy-died"),
        pytest.param(["hang", "ok"], 1, 0, "succeeded", 2, id="rerun-restarts-the-proxy-first"),
    ],
)
def test_a_dead_proxy_stops_the_client_and_the_rerun_restarts_it(
    tmp_path: Path, outcomes: list[str], retries: int, code: int, state: str, proxies: int
) -> None:
    launcher = ServingLauncher(outcomes)
    controller, inputs = _serving_controller(tmp_path, launcher, retries)
    killer = _kill_first_proxy_once_the_client_runs(launcher, tmp_path / "run-1")
    job = f"910{retries}"  # ports derive from the job id: distinct ones for tests running side by side
    assert controller.run(inputs, 0, job, "n1") == code
    killer.join()
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt(f"attempt-{job}").record, AttemptRecord)
    assert record.state == state
    if state == "failed":
        assert (record.reason, record.retryable) == ("proxy_died", True)
        assert "proxy-gen" in (record.message or "") and "exited with status -9" in (record.message or "")
    assert len(launcher.proxies) == proxies and len(launcher.clients) == len(outcomes)
    # the hanging client was stopped (a signal ended it), not waited for: it would have exited 0 after 120 s
    assert launcher.clients[0].proc.returncode is not None and launcher.clients[0].proc.returncode < 0
    if proxies == 2:  # the new proxy was up before the client ran again, in front of both replicas
        argv = launcher.proxies[1].spec.argv
        assert argv.count("--upstream") == 2
        # each upstream's busy log is named by its replica's index (not its place among the replicas left)
        pairs = [(argv[i + 1], argv[i + 3]) for i, a in enumerate(argv) if a == "--upstream"]
        assert [Path(log).name for _, log in pairs] == ["busy-gen-0.jsonl", "busy-gen-1.jsonl"]
    assert all(s.poll() is not None for s in [*launcher.proxies, *launcher.servers, *launcher.clients])


NOBODY = 65534
SQUAT = r"""
import json, os, socket, sys, time
port, stop = int(sys.argv[1]), sys.argv[2]
tries, errors = 0, set()
while not os.path.exists(stop):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    tries += 1
    try:
        sock.bind(("127.0.0.1", port)); sock.listen()
    except OSError as exc:
        errors.add(exc.strerror); sock.close(); time.sleep(0.002); continue
    print(json.dumps({"bound": True, "tries": tries}), flush=True)
    conn, _ = sock.accept()  # whatever connects: the client would have sent its token here
    print(json.dumps({"got": conn.recv(65536).decode("latin-1")}), flush=True)
    sys.exit(0)
print(json.dumps({"bound": False, "tries": tries, "errors": sorted(errors)}), flush=True)
"""


@pytest.mark.skipif(os.getuid() != 0 or not Path("/usr/bin/python3").exists(), reason="another uid needs root")
def test_replicas_on_unix_sockets_and_a_held_proxy_port_leave_a_squatter_nothing(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Another user races for the proxy's port from before serving starts until after the proxy was killed and
    restarted: it never binds it (the controller holds the port for the allocation), and the replicas are sockets
    in a directory only this user can enter, removed at teardown with the hold released."""
    launcher = ServingLauncher(["hang", "gated"])
    scratch = Path(tempfile.mkdtemp(prefix="tmp", dir="/tmp"))  # short: a socket path has at most 107 bytes
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    scratch.chmod(0o755)  # the squatter looks for its stop file here
    controller, inputs = _serving_controller(tmp_path, launcher, 1, env={"TMPDIR": str(scratch)}, listen="unix")
    killer = _kill_first_proxy_once_the_client_runs(launcher, tmp_path / "run-1")
    squatters: list[subprocess.Popen[str]] = []

    def squat_once_the_proxy_starts() -> None:
        deadline = time.monotonic() + 30
        while not launcher.proxies and time.monotonic() < deadline:
            time.sleep(0.005)
        port = launcher.proxies[0].spec.argv[launcher.proxies[0].spec.argv.index("--listen") + 1].rpartition(":")[2]
        squatters.append(
            subprocess.Popen(
                ["/usr/bin/python3", "-c", SQUAT, port, str(scratch / "stop")],
                user=NOBODY,
                group=NOBODY,
                cwd="/",
                stdout=subprocess.PIPE,
                text=True,
            )
        )

    outputs: list[str] = []

    def stop_squatting_then_let_the_rerun_finish() -> None:
        deadline = time.monotonic() + 60
        while len(launcher.clients) < 2 and time.monotonic() < deadline:  # the proxy died, came back, rerun began
            time.sleep(0.01)
        (scratch / "stop").write_text("")
        racer.join()
        try:
            outputs.append(squatters[0].communicate(timeout=30)[0])
        except subprocess.TimeoutExpired:  # it bound the port and waits for a connection: the test fails below
            squatters[0].kill()
            outputs.append(squatters[0].communicate()[0])
        attempt = RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9301")
        (attempt.record.parent / "go").write_text("")

    racer = threading.Thread(target=squat_once_the_proxy_starts, daemon=True)
    racer.start()
    finisher = threading.Thread(target=stop_squatting_then_let_the_rerun_finish, daemon=True)
    finisher.start()
    code = controller.run(inputs, 0, "9301", "n1")
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9301").record, AttemptRecord)
    assert (code, record.state) == (0, "succeeded"), (record.reason, record.message)
    killer.join()
    finisher.join()
    outcome = json.loads(outputs[0].splitlines()[0])
    assert outcome["bound"] is False and outcome["errors"] == ["Address already in use"], outcome
    assert outcome["tries"] > 10  # it kept trying while the proxy died and came back
    assert len(launcher.proxies) == 2  # killed once, restarted on the same (held) port
    ports = {p.spec.argv[p.spec.argv.index("--listen") + 1] for p in launcher.proxies}
    assert len(ports) == 1 and all("--reuse-port" in p.spec.argv for p in launcher.proxies)
    sockets = [Path(s.spec.argv[s.spec.argv.index("--uds") + 1]) for s in launcher.servers]
    assert len(sockets) == 2 and all("--port" not in s.spec.argv for s in launcher.servers)
    (directory,) = {path.parent for path in sockets}
    assert directory.parent == scratch and directory.name.startswith("ddslurm-scratch-")
    assert not directory.exists()  # removed at teardown
    upstreams = launcher.proxies[0].spec.argv
    assert [upstreams[i + 1] for i, a in enumerate(upstreams) if a == "--upstream"] == [f"unix:{p}" for p in sockets]
    serving = json.loads(next((tmp_path / "run-1").rglob("serving.json")).read_text())
    assert [(r["port"], r["socket"]) for r in serving["replicas"]] == [(None, str(p)) for p in sockets]
    port = int(next(iter(ports)).rpartition(":")[2])
    assert _binds_within(port, 5.0)  # the hold went with the allocation


def _binds_within(port: int, seconds: float) -> bool:
    """Whether this process can bind ``port`` (past the killed proxy's closing connections) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
                continue
            return True


# --- the attempt's token and the server-only variables ------------------------------------------------------

HOSTED_KEY = "sk-hosted-key-value-for-the-client-only"
HF_TOKEN = "hf_server-only-value-planted-by-the-test"
LOCAL_AND_HOSTED = ProviderSnapshot(
    providers=(
        SnapshotProvider(name="ddslurm-local-gen", endpoint="", api_key_env="DDSLURM_LOCAL_TOKEN", local=True),
        SnapshotProvider(name="hosted", endpoint="http://127.0.0.1:9/v1", api_key_env="HOSTED_KEY"),
    ),
    models=(SnapshotModel(alias="gen", model="served", provider="ddslurm-local-gen"),),
)


def _files_holding(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_each_attempt_has_its_own_token_in_step_environments_only(tmp_path: Path) -> None:
    """Servers and proxies get the attempt's token in their environment (never on a command line), the client gets
    it as the local provider's key variable, the readiness probes send it (the stand-ins answer /v1/models only
    with it), and no file of the run holds it. The hosted key reaches only the client, server.env_from only the
    server steps."""
    tokens = []
    for job in ("9201", "9202"):
        launcher = ServingLauncher(["ok"])
        controller, inputs = _serving_controller(
            tmp_path,
            launcher,
            0,
            env={"HOSTED_KEY": HOSTED_KEY, "HF_TOKEN": HF_TOKEN},
            snapshot=LOCAL_AND_HOSTED,
            env_from=("HF_TOKEN",),
            secret_env=("HOSTED_KEY",),
        )
        assert controller.run(inputs, 0, job, "n1") == 0
        [client] = launcher.clients
        token = client.spec.env["DDSLURM_LOCAL_TOKEN"]
        assert len(token) >= 32
        tokens.append(token)
        steps = [*launcher.servers, *launcher.proxies, client]
        assert len(launcher.servers) == 2 and len(launcher.proxies) == 1
        for step in steps:
            assert not any(token in arg for arg in step.spec.argv), step.name
        for server in launcher.servers:
            assert server.spec.env["VLLM_API_KEY"] == token
            assert server.spec.env["HF_TOKEN"] == HF_TOKEN and server.spec.env["VLLM_LOGGING_LEVEL"] == "INFO"
            assert "HOSTED_KEY" not in server.spec.env and "DDSLURM_LOCAL_TOKEN" not in server.spec.env
        for proxy in launcher.proxies:
            assert proxy.spec.env["VLLM_API_KEY"] == token
            assert not {"HF_TOKEN", "HOSTED_KEY", "DDSLURM_LOCAL_TOKEN"} & set(proxy.spec.env)
        assert client.spec.env["HOSTED_KEY"] == HOSTED_KEY
        assert not {"HF_TOKEN", "VLLM_API_KEY"} & set(client.spec.env)
        for secret in (token, HF_TOKEN, HOSTED_KEY):
            assert _files_holding(tmp_path, secret) == []
    assert tokens[0] != tokens[1]


def test_a_server_variable_unset_in_the_job_fails_before_any_server_starts(tmp_path: Path) -> None:
    launcher = ServingLauncher(["ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 0, env_from=("HF_TOKEN",))
    assert controller.run(inputs, 0, "9203", "n1") == 1
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9203").record, AttemptRecord)
    assert record.reason == "secret_missing" and "HF_TOKEN" in (record.message or "")
    assert "server.env_from" in (record.message or "")
    assert launcher.servers == [] and launcher.clients == []


def test_a_plan_of_another_data_designer_fails_before_any_server_starts(tmp_path: Path) -> None:
    """The plan records the Data Designer of python_env at submit; this node's is another (reinstalled since):
    the allocation's attempts fail ``recipe_invalid`` before a server or a client starts."""
    import dataclasses
    from importlib.metadata import version

    import msgspec

    launcher = ServingLauncher(["ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 1)
    planned = msgspec.structs.replace(inputs.plan, data_designer_version="0.8.1")
    assert version("data-designer") != "0.8.1"
    assert controller.run(dataclasses.replace(inputs, plan=planned), 0, "9204", "n1") == 1
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9204").record, AttemptRecord)
    assert (record.reason, record.retryable) == ("recipe_invalid", False)
    assert "data-designer 0.8.1" in (record.message or "") and version("data-designer") in (record.message or "")
    assert launcher.servers == [] and launcher.clients == []


# --- pulling allocations: servers started once, shards claimed, client workers --------------------------------


def _pool(tmp_path: Path, shards: int, job: str, task: int = 0) -> ClaimPool:
    return ClaimPool(
        RunLayout(tmp_path / "run-1"),
        range(shards),
        array_job_id="77",
        task=task,
        job_id=job,
        node="n1",
        clock=lambda: "2026-11-30T00:00:00+00:00",
    )


def _claim_all(args: tuple[Path, int, str, int]) -> list[int]:
    root, shards, job, task = args
    pool, taken = _pool(root, shards, job, task), []
    while (shard := pool.next()) is not None:
        taken.append(shard)
    return taken


CLAIMER = """
import sys, time
from pathlib import Path
from typing import Literal
from ddslurm.config import RunLayout
from ddslurm.runtime._workers import ClaimPool
root, job, task, start = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
pool = ClaimPool(RunLayout(root), range(60), array_job_id="77", task=task, job_id=job, node="n1", clock=lambda: "-")
while time.time() < start:
    pass
taken = []
while (shard := pool.next()) is not None:
    taken.append(shard)
print(" ".join(map(str, taken)))
"""


def test_racing_allocations_claim_every_shard_exactly_once(tmp_path: Path) -> None:
    (tmp_path / "run-1" / "shards").mkdir(parents=True)
    start = str(time.time() + 2.0)  # every process starts claiming at the same moment
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(tmp_path / "run-1"), f"10{i}", str(i), start],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    taken = [[int(s) for s in proc.communicate(timeout=60)[0].split()] for proc in procs]
    every = sorted(s for part in taken for s in part)
    assert every == list(range(60))
    claims = [read_json(p, ClaimRecord) for p in (tmp_path / "run-1" / "shards").glob("shard-*/claims/77.json")]
    assert len(claims) == 60
    assert {c.shard: c.job_id for c in claims} == {s: f"10{i}" for i, part in enumerate(taken) for s in part}


def test_a_requeued_allocation_takes_its_own_claims_again_and_nobody_elses(tmp_path: Path) -> None:
    (tmp_path / "run-1" / "shards").mkdir(parents=True)
    first = _pool(tmp_path, 3, "501")
    assert first.next() == 0
    assert _claim_all((tmp_path, 3, "502", 1)) == [1, 2]  # another allocation: shard 0 is taken
    assert _claim_all((tmp_path, 3, "501", 0)) == [0]  # the same job, requeued: its own claim only


def test_a_pool_skips_winners_and_cancelled_shards_and_stops_when_the_run_is_cancelled(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run-1")
    for index in range(4):
        layout.shard(index).dir.mkdir(parents=True)
    layout.shard(0).winner.write_text("{}")
    layout.shard(2).cancelled.write_text("{}")
    pool = _pool(tmp_path, 4, "601")
    assert pool.next() == 1
    layout.cancelled.write_text("{}")
    assert pool.next() is None
    assert not layout.shard(3).claim("77").exists()


def test_a_pulling_allocation_starts_servers_once_and_runs_its_workers_side_by_side(tmp_path: Path) -> None:
    launcher = ServingLauncher(["slow"] * 5)
    controller, inputs = _serving_controller(tmp_path, launcher, 0, shard_rows=(2,) * 5, workers=2)
    assert controller.run(inputs, _pool(tmp_path, 5, "9301"), "9301", "n1") == 0
    layout = RunLayout(tmp_path / "run-1")
    assert len(launcher.servers) == 2 and len(launcher.proxies) == 1  # once for five shards
    assert sorted(s.name for s in launcher.clients) == [f"client-{i}" for i in range(5)]
    allocation = layout.allocation("9301")
    assert (allocation / "serving.json").is_file() and (allocation / "endpoints.json").is_file()
    spans = []
    for index in range(5):
        record = read_json(layout.shard(index).attempt("attempt-9301").record, AttemptRecord)
        assert (record.state, record.allocation) == ("succeeded", str(allocation))
        began, ended = map(float, (layout.shard(index).attempt("attempt-9301").dir / "span.txt").read_text().split())
        spans.append((began, ended))
    # Two client workers: two generation steps overlapped, never three.
    busiest = max(sum(b <= t < e for b, e in spans) for t, _ in spans)
    assert busiest == 2
    # The clients were started while the servers loaded and waited for the endpoints file.
    assert all("--wait-endpoints" in argv for argv in launcher.client_argv[:2])
    # Each later shard's client was started early as the spare (sharing the workers' CPUs) and waited for its own
    # endpoints file, written when a worker's shard ended.
    by_shard = {int(c.spec.argv[c.spec.argv.index("--shard") + 1]): c for c in launcher.clients}
    spares = [i for i in range(5) if by_shard[i].spec.srun_extra == ("--overlap",)]
    assert spares and set(spares) <= {2, 3, 4}  # two workers ended at once: one slot took a new claim instead
    for index in spares:
        own = layout.shard(index).attempt("attempt-9301").dir / "endpoints.json"
        assert own.read_bytes() == (allocation / "endpoints.json").read_bytes()


def test_a_failed_shard_does_not_stop_the_allocation_but_fails_its_exit_status(tmp_path: Path) -> None:
    launcher = ServingLauncher(["ok", "fail", "ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 0, shard_rows=(2,) * 3, workers=1)
    assert controller.run(inputs, _pool(tmp_path, 3, "9302"), "9302", "n1") == 1
    layout = RunLayout(tmp_path / "run-1")
    states = [read_json(layout.shard(i).attempt("attempt-9302").record, AttemptRecord).state for i in range(3)]
    assert states == ["succeeded", "failed", "succeeded"]


def test_cancelling_one_shard_stops_its_client_and_the_allocation_goes_on(tmp_path: Path) -> None:
    launcher = ServingLauncher(["hang", "ok", "ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 0, shard_rows=(2,) * 3, workers=1)
    layout = RunLayout(tmp_path / "run-1")

    def cancel_shard_0() -> None:
        deadline = time.monotonic() + 30
        while not launcher.clients and time.monotonic() < deadline:
            time.sleep(0.02)
        layout.shard(0).cancelled.write_text("{}")

    threading.Thread(target=cancel_shard_0, daemon=True).start()
    assert controller.run(inputs, _pool(tmp_path, 3, "9303"), "9303", "n1") == 0
    # its hanging client was stopped (a signal ended it), not waited for: it would have exited 0 after 120 s
    assert launcher.clients[0].proc.returncode is not None and launcher.clients[0].proc.returncode < 0
    record = read_json(layout.shard(0).attempt("attempt-9303").record, AttemptRecord)
    assert (record.state, record.reason) == ("cancelled", "shard_cancelled")
    for index in (1, 2):
        assert read_json(layout.shard(index).attempt("attempt-9303").record, AttemptRecord).state == "succeeded"
    assert len(launcher.servers) == 2


def test_an_allocation_with_nothing_left_to_pull_starts_nothing(tmp_path: Path) -> None:
    launcher = ServingLauncher([])
    controller, inputs = _serving_controller(tmp_path, launcher, 0, shard_rows=(2,) * 2, workers=2)
    layout = RunLayout(tmp_path / "run-1")
    for index in range(2):
        layout.shard(index).dir.mkdir(parents=True, exist_ok=True)
        layout.shard(index).winner.write_text("{}")
    assert controller.run(inputs, _pool(tmp_path, 2, "9304"), "9304", "n1") == 0
    assert launcher.servers == [] and launcher.clients == []


def test_a_proxy_that_died_is_started_again_before_the_next_shards_client(tmp_path: Path) -> None:
    """Reruns used up (client_retries 0): the shard whose proxy died fails with proxy_died, and the allocation
    starts the proxy again before it runs the next shard, which succeeds."""
    launcher = ServingLauncher(["hang", "ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 0, shard_rows=(2, 2), workers=1)
    killer = _kill_first_proxy_once_the_client_runs(launcher, tmp_path / "run-1")
    assert controller.run(inputs, _pool(tmp_path, 2, "9305"), "9305", "n1") == 1
    killer.join()
    layout = RunLayout(tmp_path / "run-1")
    first = read_json(layout.shard(0).attempt("attempt-9305").record, AttemptRecord)
    second = read_json(layout.shard(1).attempt("attempt-9305").record, AttemptRecord)
    assert (first.state, first.reason) == ("failed", "proxy_died")
    assert second.state == "succeeded"
    assert len(launcher.proxies) == 2 and len(launcher.servers) == 2


def test_a_spare_client_whose_shard_is_cancelled_never_generates(tmp_path: Path) -> None:
    launcher = ServingLauncher(["slow", "ok", "ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 0, shard_rows=(2, 2, 2), workers=1)
    layout = RunLayout(tmp_path / "run-1")

    def cancel_the_spare() -> None:  # shard 1's client is started while shard 0 generates
        deadline = time.monotonic() + 30
        while len(launcher.clients) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        layout.shard(1).cancelled.write_text("{}")

    threading.Thread(target=cancel_the_spare, daemon=True).start()
    assert controller.run(inputs, _pool(tmp_path, 3, "9306"), "9306", "n1") == 0
    states = [read_json(layout.shard(i).attempt("attempt-9306").record, AttemptRecord) for i in range(3)]
    assert [(r.state, r.reason) for r in states] == [
        ("succeeded", None), ("cancelled", "shard_cancelled"), ("succeeded", None),
    ]  # fmt: skip
    assert not (layout.shard(1).attempt("attempt-9306").dir / "endpoints.json").exists()  # it never got endpoints


def test_a_tune_allocation_records_prompts_and_fails_its_attempt_when_the_sweep_cannot_run(tmp_path: Path) -> None:
    """With ``Plan.calibrate`` the proxies record the bodies they forward and, the generation done, the sweep runs
    before teardown; here nothing was recorded (a scripted client sends no request): the attempt that succeeded
    fails with ``calibration_failed``, and so does the allocation."""
    launcher = ServingLauncher(["ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 0, calibrate=(1, 2))
    assert controller.run(inputs, 0, "9301", "n1") == 1
    attempt = RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9301")
    record = read_json(attempt.record, AttemptRecord)
    assert (record.state, record.reason) == ("failed", "calibration_failed")
    assert "recorded no chat completion request" in (record.message or "")
    argv = launcher.proxies[0].spec.argv
    assert argv[argv.index("--record-prompts") + 1] == str(attempt.dir / "prompts-gen.jsonl")
    assert not (attempt.dir / "calibration.json").exists()
    assert all(s.poll() is not None for s in [*launcher.proxies, *launcher.servers, *launcher.clients])


def test_an_ordinary_allocation_records_no_prompts(tmp_path: Path) -> None:
    launcher = ServingLauncher(["ok"])
    controller, inputs = _serving_controller(tmp_path, launcher, 0)
    assert controller.run(inputs, 0, "9302", "n1") == 0
    assert "--record-prompts" not in launcher.proxies[0].spec.argv
