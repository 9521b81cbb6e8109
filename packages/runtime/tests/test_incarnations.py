"""What a client waits for before it generates: the endpoints of its own allocation's incarnation (a requeued
pulling allocation never reads what the earlier one left), for as long as its controller runs (a spare client
outlives any shard, however long), and a spare that ended while it waited costs its shard no rerun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddslurm.config import (
    AttemptRecord,
    DeploymentPlan,
    ProviderSnapshot,
    ReplicaPlan,
    RunLayout,
    ServingPlan,
    SnapshotModel,
    SnapshotProvider,
    read_json,
)
from ddslurm.config.testing import make_plan
from ddslurm.runtime import Inputs
from ddslurm.runtime._client_step import await_endpoints
from ddslurm.runtime._controller import Controller, controller_alive, controller_identity
from ddslurm.runtime._steps import Step, StepSpec
from ddslurm.runtime._stop import StopSignal
from ddslurm.runtime._workers import ClaimPool
from ddslurm.runtime.testing import make_controller, write_plan

SCRIPTED = """
import json, sys, time, urllib.request
import msgspec
from pathlib import Path
from ddslurm.config import AttemptRecord, atomic_write, encode, read_json
record_path, outcome, endpoints, wait = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "wait"
if outcome == "die":  # ends before it is given endpoints (killed, out of memory while importing)
    sys.exit(3)
if outcome == "hang":
    time.sleep(120)
if wait:
    while not endpoints.exists():
        time.sleep(0.02)
# Generation: every endpoint must answer now (a server that is still loading refuses the connection).
for url in json.loads(endpoints.read_text()).values():
    urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5).read()
if outcome == "slow":
    time.sleep(float(sys.argv[5]))
record = read_json(record_path, AttemptRecord)
done = msgspec.structs.replace(record, state="succeeded", client_runs=record.client_runs + 1)
atomic_write(record_path, encode(done))
"""

REAL_CLIENT = """
import sys, time
import msgspec
from pathlib import Path
from ddslurm.config import AttemptRecord, RunLayout, atomic_write, encode, read_json
from ddslurm.runtime import _client_step, cli

real = time.monotonic
zero = real()
time.monotonic = lambda: zero + (real() - zero) * 1000.0  # a short clock: 300 s of waiting pass in 0.3 s
_client_step.preload_engine = lambda: None  # no Data Designer import


class Generating(Exception):
    pass


def generating(layout, **_):  # the client got past its wait: it would load the inputs and generate now
    raise Generating


_client_step.load_inputs = generating
argv = sys.argv[1:]
try:
    sys.exit(cli.main(argv))
except Generating:
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    shard, attempt = int(argv[argv.index("--shard") + 1]), argv[argv.index("--attempt") + 1]
    path = RunLayout(run_dir).shard(shard).attempt(attempt).record
    record = read_json(path, AttemptRecord)
    atomic_write(path, encode(msgspec.structs.replace(record, state="succeeded", client_runs=record.client_runs + 1)))
"""

STAND_IN = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
time.sleep(float(sys.argv[2]))  # loading the model: the port is not open yet
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data": [{"id": "served"}]}' if self.path == "/v1/models" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


class Launcher:
    """Servers are HTTP stand-ins that open their port after ``load`` seconds; each client runs the next of
    ``outcomes``: ``ok``, ``slow`` (generates ``slow`` seconds), ``hang``, ``die`` (ends at once, before its
    endpoints), or ``real`` (the real ``ddslurm-runtime client`` up to where it would generate, on a short clock)."""

    def __init__(self, outcomes: list[str], *, load: float = 0.0, slow: float = 0.0, env: dict[str, str]) -> None:
        self.outcomes, self.load, self.slow, self.env = outcomes, load, slow, env
        self.clients: list[Step] = []
        self.servers: list[Step] = []

    def start(self, spec: StepSpec) -> Step:
        argv = spec.argv
        if not (spec.name == "client" or spec.name.startswith("client-")):
            port = argv[argv.index("--port") + 1]
            proc = subprocess.Popen([sys.executable, "-c", STAND_IN, port, str(self.load)], start_new_session=True)
            self.servers.append(Step(spec, proc))
            return self.servers[-1]
        outcome = self.outcomes[len(self.clients)]
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        with spec.log.open("ab") as log:
            if outcome == "real":
                cmd = [sys.executable, "-c", REAL_CLIENT, *argv[1:]]
            else:
                layout = RunLayout(Path(argv[argv.index("--run-dir") + 1]))
                record = layout.shard(int(argv[argv.index("--shard") + 1])).attempt(argv[argv.index("--attempt") + 1])
                wait = "wait" if "--wait-endpoints" in argv else "no-wait"
                endpoints = argv[argv.index("--endpoints") + 1]
                cmd = [sys.executable, "-c", SCRIPTED, str(record.record), outcome, endpoints, wait, str(self.slow)]
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.clients.append(Step(spec, proc))
        return self.clients[-1]


LOCAL = ProviderSnapshot(
    providers=(SnapshotProvider(name="ddslurm-local-gen", endpoint="", api_key_env="DDSLURM_LOCAL_TOKEN", local=True),),
    models=(SnapshotModel(alias="gen", model="served", provider="ddslurm-local-gen"),),
)


def _controller(
    tmp_path: Path, launcher: Launcher, shards: int, *, serving: bool, workers: int = 1
) -> tuple[Controller, Inputs, StopSignal]:
    plan_serving = None
    if serving:
        deployment = DeploymentPlan(
            alias="gen", model="m", served_model_name="served", tensor_parallel=1,
            replicas=(ReplicaPlan(index=0, gpus=1, cpus=1),), startup_timeout=30, proxy=False,
        )  # fmt: skip
        plan_serving = ServingPlan(deployments=(deployment,), gpus=1, vllm_executable=str(tmp_path / "no-vllm"))
    plan = make_plan(
        "run-1", (2,) * shards, client_retries=0, client_workers=workers, allocations=1, serving=plan_serving
    )
    layout, inputs = write_plan(tmp_path / "run-1", plan, snapshot=LOCAL if serving else None)
    stop = StopSignal()
    controller = make_controller(layout, launcher, env={"CUDA_VISIBLE_DEVICES": "0"}, stop=stop, grace=2.0, poll=0.05)
    return controller, inputs, stop


def _pool(tmp_path: Path, shards: int, job: str) -> ClaimPool:
    return ClaimPool(
        RunLayout(tmp_path / "run-1"),
        range(shards),
        array_job_id="88",
        task=0,
        job_id=job,
        node="n1",
        clock=lambda: "-",
    )


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path)}


# --- 3. a requeued pulling allocation serves anew, from its own directory ------------------------------------


def test_a_requeued_pulling_allocation_never_reads_the_endpoints_its_earlier_incarnation_left(tmp_path: Path) -> None:
    """Slurm requeues a pulling allocation (same job id, SLURM_RESTART_COUNT 1) after it had served: the first
    incarnation's endpoints.json names the very ports the new servers take while they load. The new incarnation's
    first clients must wait for its own endpoints, not send requests to servers still loading."""
    job, layout = "9531", RunLayout(tmp_path / "run-1")  # ports derive from job ids: 9501 is test_multinode's
    first = Launcher(["hang", "hang"], env=_env(tmp_path))
    controller, inputs, stop = _controller(tmp_path, first, 2, serving=True, workers=2)

    def requeue() -> None:  # scontrol requeue: SIGTERM once the first incarnation serves
        deadline = time.monotonic() + 30
        while not (layout.allocation(job) / "endpoints.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set("SIGTERM")

    threading.Thread(target=requeue, daemon=True).start()
    assert controller.run(inputs, _pool(tmp_path, 2, job), job, "n1") != 0
    earlier = (layout.allocation(job) / "endpoints.json").read_bytes()

    second = Launcher(["ok", "ok"], load=1.5, env=_env(tmp_path))
    controller, inputs, _ = _controller(tmp_path, second, 2, serving=True, workers=2)
    assert controller.run(inputs, _pool(tmp_path, 2, job), job, "n1", restart=1) == 0, [
        c.spec.log.read_text()[-2000:] for c in second.clients
    ]
    own = layout.allocation(job, restart=1)
    assert own == layout.allocations / f"allocation-{job}-r1"
    for shard in range(2):
        record = read_json(layout.shard(shard).attempt(f"attempt-{job}-r1").record, AttemptRecord)
        assert (record.state, record.allocation) == ("succeeded", str(own))
    assert all("--wait-endpoints" in c.spec.argv for c in second.clients)
    assert {c.spec.argv[c.spec.argv.index("--endpoints") + 1] for c in second.clients} == {str(own / "endpoints.json")}
    assert [s.spec.log.parent for s in second.servers] == [own]
    assert (layout.allocation(job) / "endpoints.json").read_bytes() == earlier  # left as it was, never read
    assert json.loads((own / "endpoints.json").read_text())


def test_an_endpoints_file_the_controller_did_not_write_is_removed_and_waited_past(tmp_path: Path) -> None:
    """Whatever the directory holds when serving starts (a restart count Slurm did not pass on), a client is told
    to wait unless this controller wrote the file it reads."""
    job, layout = "9532", RunLayout(tmp_path / "run-1")  # ports derive from job ids: 9502 is test_multinode's
    stale = layout.allocation(job) / "endpoints.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"ddslurm-local-gen": "http://127.0.0.1:9/v1"}))
    launcher = Launcher(["ok"], load=1.0, env=_env(tmp_path))
    controller, inputs, _ = _controller(tmp_path, launcher, 1, serving=True)
    assert controller.run(inputs, _pool(tmp_path, 1, job), job, "n1") == 0
    assert "--wait-endpoints" in launcher.clients[0].spec.argv
    assert "127.0.0.1:9/" not in stale.read_text()


# --- 4. a spare client waits as long as its controller runs ---------------------------------------------------


def test_a_spare_client_outwaits_a_long_shard_and_generates_when_promoted(tmp_path: Path) -> None:
    """The spare (the real client, on a clock 1000 times fast: seconds here are over 30 minutes to it) waits for its
    endpoints while the worker's shard generates, without a deadline, and generates once promoted; with
    client_retries 0 a spare that had given up failed the shard (client_failed)."""
    launcher = Launcher(["slow", "real"], slow=2.0, env=_env(tmp_path))
    controller, inputs, _ = _controller(tmp_path, launcher, 2, serving=False)
    assert controller.run(inputs, _pool(tmp_path, 2, "9511"), "9511", "n1") == 0, launcher.clients[1].spec.log
    layout = RunLayout(tmp_path / "run-1")
    spare = read_json(layout.shard(1).attempt("attempt-9511").record, AttemptRecord)
    assert (spare.state, spare.reason, spare.client_runs) == ("succeeded", None, 1)
    assert len(launcher.clients) == 2 and launcher.clients[1].spec.srun_extra == ("--overlap",)


def test_a_spare_that_ended_while_waiting_is_started_again_without_spending_a_rerun(tmp_path: Path) -> None:
    launcher = Launcher(["slow", "die", "ok"], slow=1.0, env=_env(tmp_path))
    controller, inputs, _ = _controller(tmp_path, launcher, 2, serving=False)
    assert controller.run(inputs, _pool(tmp_path, 2, "9512"), "9512", "n1") == 0
    layout = RunLayout(tmp_path / "run-1")
    record = read_json(layout.shard(1).attempt("attempt-9512").record, AttemptRecord)
    assert (record.state, record.client_runs) == ("succeeded", 1), record
    died, started_again = launcher.clients[1:]
    assert died.poll() == 3 and "--resume" not in started_again.spec.argv
    assert "--wait-endpoints" not in started_again.spec.argv  # its endpoints were written before it started


def test_a_waiting_client_ends_when_its_controller_has_gone(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = controller_identity(dead.pid)
    dead.wait()
    assert controller_alive(controller_identity())()
    assert not controller_alive(identity)()
    assert controller_alive(f"{os.getpid()}::")()
    with pytest.raises(ValueError, match="PID:START:PIDNS"):
        controller_alive("not-a-pid")
    checks = iter([True, True, False])
    with pytest.raises(SystemExit, match="the controller ended before"):
        await_endpoints(tmp_path / "never.json", lambda: next(checks), check_every=0.0, sleep=lambda s: None)
