"""A replica that spans nodes, run by the controller with real processes (LocalLauncher): its leader and its
headless follower are started with the rendezvous arguments (each step on its node: srun ``--relative``), the
replica is ready when its leader is, and the death of a follower, while the model loads or during generation,
fails the attempt at once with that rank's log and stops the other ranks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pytest

from ddslurm.config import AttemptRecord, DeploymentPlan, ReplicaPlan, RunLayout, ServingPlan, read_json
from ddslurm.config.testing import make_plan
from ddslurm.runtime import Inputs
from ddslurm.runtime._controller import Controller
from ddslurm.runtime._leader_address import LeaderAddress, leader_ip
from ddslurm.runtime._steps import LocalLauncher, Step, StepSpec, srun_argv
from ddslurm.runtime.testing import make_controller, write_plan

RANK = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
rendezvous = os.environ["FAKE_RANKS"]
given = [a.partition("=")[2] for a in args if a.startswith("--api-key=")]  # vLLM's boot program appends it
token = os.environ.get("VLLM_API_KEY") or opt("--api-key") or (given[0] if given else None)
follower = "--headless" in args or opt("--node-rank") not in (None, "0")
if follower:
    print("rank 1 starts, joining", opt("--master-addr") or opt("--dist-init-addr"), flush=True)
    if os.path.exists(os.path.join(rendezvous, "fail")):
        print("rank 1: NCCL error: the leader refused the connection", flush=True)
        sys.exit(3)
    with open(os.path.join(rendezvous, "joined"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":  # healthy once its follower joined, as an engine whose ranks all met
            code, body = (200 if os.path.exists(os.path.join(rendezvous, "joined")) else 503), b""
        elif self.headers.get("Authorization") != "Bearer " + token:
            code, body = 401, b""
        else:
            code, body = 200, json.dumps({"data": [{"id": opt("--served-model-name")}]}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
print("leader serving", flush=True)
ThreadingHTTPServer((opt("--host"), int(opt("--port"))), Handler).serve_forever()
"""

CLIENT = r"""
import sys, time, msgspec
from pathlib import Path
from ddslurm.config import AttemptRecord, atomic_write, encode, read_json
record_path, outcome, endpoints = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
while not endpoints.exists():
    time.sleep(0.02)
if outcome == "hang":
    time.sleep(120)
record = read_json(record_path, AttemptRecord)
atomic_write(record_path, encode(msgspec.structs.replace(
    record, state="succeeded", reason=None, retryable=False, client_runs=record.client_runs + 1)))
"""


class RankLauncher:
    """Servers and proxies are real processes of their command lines (:class:`LocalLauncher`: the engine is the
    rank stand-in, the proxy ``ddslurm-runtime proxy``); clients are a script that waits for the endpoints, then
    succeeds (``ok``) or runs until stopped (``hang``). Every step's spec is kept, to read its srun line.
    ``before``: called with each spec before its step starts (what another user does meanwhile)."""

    def __init__(self, outcome: str, before: Callable[[StepSpec], None] | None = None) -> None:
        self.outcome = outcome
        self.before = before
        self.specs: list[StepSpec] = []
        self.steps: dict[str, Step] = {}
        self._local = LocalLauncher()

    def start(self, spec: StepSpec) -> Step:
        if self.before is not None:
            self.before(spec)
        self.specs.append(spec)
        if spec.name.startswith("client"):
            argv = spec.argv
            shard = int(argv[argv.index("--shard") + 1])
            attempt = argv[argv.index("--attempt") + 1]
            record = RunLayout(Path(argv[argv.index("--run-dir") + 1])).shard(shard).attempt(attempt).record
            endpoints = argv[argv.index("--endpoints") + 1]
            script = [sys.executable, "-c", CLIENT, str(record), self.outcome, endpoints]
            step = Step(spec, subprocess.Popen(script, env=dict(spec.env), start_new_session=True))
        else:
            step = self._local.start(spec)
        self.steps[spec.name] = step
        return step


def _engine(tmp_path: Path) -> Path:
    """The stand-in as an executable (``vllm_executable``): one rank of a replica."""
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n{RANK}")
    exe.chmod(0o755)
    return exe


def _stand_in(tmp_path: Path) -> Path:
    """The engine stand-in itself (``python -m fake_vllm``, with its real rendezvous) as ``vllm_executable``; a
    follower (``--headless``) first waits until ``$FAKE_RANKS/release`` exists: the real follower may come late."""
    pytest.importorskip("fake_vllm")
    exe = tmp_path / "stand-in" / "vllm"
    exe.parent.mkdir()
    exe.write_text(
        '#!/bin/sh\ncase " $* " in *" --headless "*) while [ ! -e "$FAKE_RANKS/release" ]; do sleep 0.05; done;; '
        f'esac\nexec "{sys.executable}" -m fake_vllm "$@"\n'
    )
    exe.chmod(0o755)
    return exe


def _sglang_stand_in(tmp_path: Path) -> Path:
    """The stand-in's SGLang Python (``python -m fake_vllm.sglang_python``) as ``sglang_executable``: it runs the
    ``-c`` program ddslurm gives each rank (a follower's port check, then SGLang's boot) as Python would."""
    pytest.importorskip("fake_vllm")
    exe = tmp_path / "stand-in" / "python3"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fake_vllm.sglang_python "$@"\n')
    exe.chmod(0o755)
    return exe


def _controller(
    tmp_path: Path,
    launcher: RankLauncher,
    *,
    nodes_seen: str = "2",
    engine: Literal["vllm", "sglang"] = "vllm",
    listen: Literal["tcp", "unix"] = "tcp",
    stand_in: bool = False,
    data_parallel: int = 1,
    **options: Any,
) -> tuple[Controller, Inputs]:
    """A one-shard task whose one deployment is one replica over two nodes (one GPU each, pipeline parallel 2, or
    data parallel ``data_parallel``), behind its proxy; the allocation says it has ``nodes_seen`` nodes.
    ``stand_in``: the engine is the stand-in (:func:`_stand_in`, :func:`_sglang_stand_in`), else the rank script.
    ``options``: the controller's (``locate_leader``, ``place_leader``...)."""
    rendezvous = tmp_path / "ranks"
    rendezvous.mkdir(exist_ok=True)
    replica = ReplicaPlan(index=0, gpus=1, cpus=1, nodes=2)
    pipeline = 1 if data_parallel > 1 else 2
    deployment = DeploymentPlan(
        alias="gen", model="m", served_model_name="served", engine=engine, tensor_parallel=1,
        pipeline_parallel=pipeline, data_parallel=data_parallel, replicas=(replica,), startup_timeout=30, proxy=True,
        listen=listen, env={"FAKE_RANKS": str(rendezvous)},
    )  # fmt: skip
    exe = _stand_in(tmp_path) if stand_in else _engine(tmp_path)
    sglang = _sglang_stand_in(tmp_path) if stand_in and engine == "sglang" else exe
    serving = ServingPlan(deployments=(deployment,), gpus=1, nodes=2, vllm_executable=str(exe),
                          sglang_executable=str(sglang))  # fmt: skip
    layout, inputs = write_plan(tmp_path / "run-1", make_plan("run-1", (4,), serving=serving))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_NUM_NODES": nodes_seen}
    env.pop("SLURMD_NODENAME", None)
    controller = make_controller(layout, launcher, env=env, grace=2.0, poll=0.05, **options)
    controller._runtime_exe = Path(sys.executable).with_name("ddslurm-runtime")  # the real proxy
    return controller, inputs


def _run(tmp_path: Path, launcher: RankLauncher, job: str, **kw: Any) -> tuple[int, AttemptRecord, float]:
    """Run the allocation; its exit status and the attempt's record."""
    controller, inputs = _controller(tmp_path, launcher, **kw)
    code = controller.run(inputs, 0, job, "n1")
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt(f"attempt-{job}").record, AttemptRecord)
    return code, record


def test_a_replica_over_two_nodes_serves_from_its_leader_each_step_on_its_node(tmp_path: Path) -> None:
    launcher = RankLauncher("ok")
    controller, inputs = _controller(tmp_path, launcher)
    code = controller.run(inputs, 0, "9501", "n1")
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9501").record, AttemptRecord)
    assert (code, record.state) == (0, "succeeded"), (record.reason, record.message)
    names = [spec.name for spec in launcher.specs]
    assert names[:3] == ["server-gen-0", "server-gen-0-rank1", "proxy-gen"] and names[3] == "client"
    nodes = {spec.name: spec.node for spec in launcher.specs}
    assert nodes == {"server-gen-0": 0, "server-gen-0-rank1": 1, "proxy-gen": 0, "client": 0}
    srun = {spec.name: srun_argv(spec) for spec in launcher.specs}
    assert "--relative=1" in srun["server-gen-0-rank1"]
    assert all("--relative=0" in srun[name] for name in ("server-gen-0", "proxy-gen", "client"))
    leader, follower = launcher.steps["server-gen-0"].spec, launcher.steps["server-gen-0-rank1"].spec
    port = leader.argv[leader.argv.index("--port") + 1]
    master = follower.argv[follower.argv.index("--master-port") + 1]
    assert leader.argv[leader.argv.index("--master-port") + 1] == master != port  # a port of its own
    assert follower.argv[follower.argv.index("--master-addr") + 1] == "127.0.0.1"  # outside Slurm: loopback
    assert "--headless" in follower.argv and "--port" not in follower.argv
    assert follower.log == leader.log.with_name("server-gen-0-rank1.log")
    assert follower.env["VLLM_API_KEY"] == leader.env["VLLM_API_KEY"]  # every rank has the token's environment
    assert all(leader.env["VLLM_API_KEY"] not in " ".join(spec.argv) for spec in launcher.specs)
    proxy = launcher.steps["proxy-gen"].spec.argv
    assert [proxy[i + 1] for i, a in enumerate(proxy) if a == "--upstream"] == [f"http://127.0.0.1:{port}"]
    assert master not in proxy[proxy.index("--listen") + 1]
    serving = json.loads(next((tmp_path / "run-1").rglob("serving.json")).read_text())
    assert serving["nodes"] == 2 and serving["deployments"][0]["engine"] == "vllm"
    (replica,) = serving["replicas"]
    assert replica["step"] == "server-gen-0"
    assert [(r["node_rank"], r["step"]) for r in replica["ranks"]] == [(1, "server-gen-0-rank1")]
    assert all(step.poll() is not None for step in launcher.steps.values())  # teardown: every step


def test_a_follower_that_dies_while_the_model_loads_fails_the_start_at_once(tmp_path: Path) -> None:
    """The leader would wait for its follower until the startup timeout (30 s here); the follower's exit is the
    start's failure as soon as it happens, with the follower's log."""
    launcher = RankLauncher("ok")
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "fail").write_text("")
    code, record = _run(tmp_path, launcher, "9502")
    assert code == 1 and (record.state, record.reason) == ("failed", "server_start_failed"), record
    message = record.message or ""
    assert "server-gen-0-rank1 exited with status 3 before server-gen-0 was ready" in message
    assert "server-gen-0-rank1.log" in message and "NCCL error: the leader refused the connection" in message
    # ended by the follower's exit, not by the 30 s startup timeout (whose message says "not ready after")
    assert "not ready after" not in message
    assert all(step.poll() is not None for step in launcher.steps.values())


def test_a_follower_that_dies_during_generation_fails_the_attempt_within_seconds(tmp_path: Path) -> None:
    """The client is generating (it never ends by itself); the follower is killed: the attempt fails
    ``server_died`` with the dead rank's and the leader's logs, and the leader and the client are stopped."""
    launcher = RankLauncher("hang")
    controller, inputs = _controller(tmp_path, launcher)
    killed: list[int] = []

    def kill_the_follower() -> None:
        # the event: generation has begun (the endpoints are published and the client step runs), not a delay
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            "client" in launcher.steps and any((tmp_path / "run-1").rglob("endpoints.json"))
        ):
            time.sleep(0.02)
        follower = launcher.steps["server-gen-0-rank1"].proc
        follower.kill()
        killed.append(follower.pid)

    killer = threading.Thread(target=kill_the_follower, daemon=True)
    killer.start()
    code = controller.run(inputs, 0, "9503", "n1")
    killer.join()
    assert killed, "the follower was never killed"
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9503").record, AttemptRecord)
    assert code == 1 and (record.state, record.reason) == ("failed", "server_died"), record
    message = record.message or ""
    assert "every replica of 'gen' exited during generation" in message
    assert "server-gen-0-rank1.log (server-gen-0-rank1 exited with status -9)" in message
    assert "rank 1 starts, joining 127.0.0.1" in message  # the dead rank's log
    assert "server-gen-0.log" in message and "leader serving" in message  # and the leader's
    leader, client = launcher.steps["server-gen-0"], launcher.steps["client"]
    assert leader.poll() is not None and leader.poll() != 0  # stopped, it did not exit by itself
    # stopped by a signal, not waited for: the client hangs for 120 s and would then exit 0
    client_code = client.poll()
    assert client_code is not None and client_code < 0, client_code
    assert all(step.poll() is not None for step in launcher.steps.values())


def test_an_allocation_with_other_nodes_than_the_plan_starts_nothing(tmp_path: Path) -> None:
    launcher = RankLauncher("ok")
    code, record = _run(tmp_path, launcher, "9504", nodes_seen="1")
    assert code == 1 and (record.state, record.reason) == ("failed", "node_mismatch"), record
    assert "places its servers on 2 node(s) but this allocation has 1" in (record.message or "")
    assert not [spec for spec in launcher.specs if spec.name.startswith(("server", "proxy"))]


def test_sglang_over_two_nodes_gives_each_rank_its_node_rank(tmp_path: Path) -> None:
    """SGLang's ranks run the same command but ``--node-rank``; the stand-in reads the token the boot program
    would hand it as ``--api-key`` from its environment here (the boot program is tested on its own)."""
    launcher = RankLauncher("ok")
    code, record = _run(tmp_path, launcher, "9505", engine="sglang")
    assert (code, record.state) == (0, "succeeded"), (record.reason, record.message)
    leader, follower = launcher.steps["server-gen-0"].spec.argv, launcher.steps["server-gen-0-rank1"].spec.argv
    assert leader[leader.index("--node-rank") + 1] == "0" and follower[follower.index("--node-rank") + 1] == "1"
    assert leader[leader.index("--dist-init-addr") + 1] == follower[follower.index("--dist-init-addr") + 1]
    serving = json.loads(next((tmp_path / "run-1").rglob("serving.json")).read_text())
    assert serving["deployments"][0]["engine"] == "sglang" and "vllm_version" not in serving


def test_a_shape_no_engine_can_start_fails_the_attempt_before_any_server(tmp_path: Path) -> None:
    """SGLang has no Unix-domain socket: a plan that asks for one (the planner gives SGLang ``listen: tcp``) fails
    the attempt with the step and the reason, not with a traceback."""
    launcher = RankLauncher("ok")
    code, record = _run(tmp_path, launcher, "9506", engine="sglang", listen="unix")
    assert code == 1 and record.state == "failed", record
    assert "server-gen-0 cannot be started: SGLang listens on a TCP port" in (record.message or "")
    assert not [spec for spec in launcher.specs if spec.name.startswith(("server", "proxy"))]


NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # one another user can run (the project's venv may not be readable by it)


def _attempt_dir(tmp_path: Path, job: str) -> Path:
    return RunLayout(tmp_path / "run-1").shard(0).attempt(f"attempt-{job}").record.parent


def test_the_stand_in_s_own_ranks_meet_and_serve_through_the_rendezvous_check(tmp_path: Path) -> None:
    """The engine stand-in's real rendezvous (its follower connects to the leader's port) under the controller:
    the ranks' own connections, this user's, are no intruders."""
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "release").write_text("")
    code, record = _run(tmp_path, RankLauncher("ok"), "9507", stand_in=True)
    assert (code, record.state) == (0, "succeeded"), (record.reason, record.message)
    assert "node rank 1 joined (1/1 followers)" in (_attempt_dir(tmp_path, "9507") / "server-gen-0.log").read_text()


def test_a_vllm_older_than_multi_node_pipeline_parallel_fails_engine_too_old_before_any_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41, point 2: the stand-in acts as vLLM 0.11.0 (``FAKE_VLLM_AS_VLLM``), which has no ``--nnodes``,
    ``--node-rank``, ``--master-addr``, ``--master-port`` (vllm-project/vllm#23691, 0.11.1). Its servers would exit
    with "unrecognized arguments" (before the check the attempt failed ``server_start_failed`` after starting
    them); the server step asks the version first and fails the attempt ``engine_too_old``, naming each flag, the
    version found and the version needed, without starting any server or proxy. Never retried automatically."""
    monkeypatch.setenv("FAKE_VLLM_AS_VLLM", "0.11.0")
    launcher = RankLauncher("ok")
    code, record = _run(tmp_path, launcher, "9509", stand_in=True)
    assert code == 1 and (record.state, record.reason, record.retryable) == ("failed", "engine_too_old", False)
    message = record.message or ""
    assert "is vLLM 0.11.0, too old for the run's command lines" in message, message
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port"):
        assert f"{flag} (tensor x pipeline parallel over nodes) needs vLLM >= 0.11.1 (vllm-project/vllm#23691)" in (
            message
        )
    assert message.endswith("install vLLM >= 0.11.1 there")
    assert not [spec for spec in launcher.specs if spec.name.startswith(("server", "proxy"))]
    monkeypatch.setenv("FAKE_VLLM_AS_VLLM", "0.11.1")  # the release that has them: the same run serves
    again = tmp_path / "again"
    (again / "ranks").mkdir(parents=True)
    (again / "ranks" / "release").write_text("")
    code, record = _run(again, RankLauncher("ok"), "9510", stand_in=True)
    assert (code, record.state) == (0, "succeeded"), (record.reason, record.message)
    serving = json.loads((_attempt_dir(again, "9510") / "serving.json").read_text())
    assert serving["vllm_version"] == "0.11.1"


@pytest.mark.skipif(
    os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists(), reason="a joiner of another uid needs root to start it"
)
def test_another_user_who_joins_the_rendezvous_first_is_caught_and_the_replica_never_serves(tmp_path: Path) -> None:
    """Issue 37, item 6: ``nobody`` reads the leader's command line (the rendezvous port, the sizes, the model),
    joins as rank 1 before the real follower (held back here: it comes late) and is counted by the engine, which
    cannot tell it from a rank of its own; unchecked, the leader becomes healthy and serves the run with a stranger
    as its second node. The controller sees the stranger's socket on the rendezvous port (the kernel's tables) and
    fails the attempt ``rendezvous_intruder`` before any endpoint is published."""
    from fake_vllm.testing import impersonation, start_joiner

    joiners: list[Any] = []
    with contextlib.ExitStack() as stack:

        def join_first(spec: StepSpec) -> None:
            if spec.name == "server-gen-0-rank1":  # the leader runs; its command line is what ps shows
                leader = next(s for s in launcher.specs if s.name == "server-gen-0").argv
                address, port = leader[leader.index("--master-addr") + 1], leader[leader.index("--master-port") + 1]
                hello = impersonation(leader)
                joiners.append(
                    stack.enter_context(start_joiner(address, int(port), hello, user=NOBODY, python=SYSTEM_PYTHON))
                )

        launcher = RankLauncher("ok", before=join_first)
        code, record = _run(tmp_path, launcher, "9508", stand_in=True)
        (joiner,) = joiners
        assert joiner.said.get("reply") == {"ok": True}, joiner.said  # the engine took it for rank 1
    assert code == 1 and (record.state, record.reason) == ("failed", "rendezvous_intruder"), record
    leader = launcher.steps["server-gen-0"].spec.argv
    port = leader[leader.index("--master-port") + 1]
    message = record.message or ""
    assert f"uid {NOBODY}" in message and f"rendezvous port {port}" in message, message
    assert not (_attempt_dir(tmp_path, "9508") / "endpoints.json").exists()  # never served to the client
    assert all(step.poll() is not None for step in launcher.steps.values())


@pytest.mark.skipif(
    os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists(), reason="a joiner of another uid needs root to start it"
)
def test_another_user_who_joins_during_generation_fails_the_attempt_as_an_intruder_not_a_death(tmp_path: Path) -> None:
    """The ranks met and the client generates; then ``nobody`` connects to the rendezvous and holds the connection
    without a word (as a real engine's store keeps a client that has not spoken, and the stand-in waits for its
    hello): the attempt fails ``rendezvous_intruder`` during generation, the replica and the client stopped. (A
    joiner whose hello makes the engine die at once may leave nothing for the controller to see: the attempt then
    records the death, ``server_died``; docs/architecture.md lists such visits among what remains.)"""
    from fake_vllm.testing import impersonation, start_joiner

    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "release").write_text("")
    launcher = RankLauncher("hang")
    controller, inputs = _controller(tmp_path, launcher, stand_in=True)
    joiners: list[Any] = []
    with contextlib.ExitStack() as stack:

        def join_while_generating() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                "client" in launcher.steps and any((tmp_path / "run-1").rglob("endpoints.json"))
            ):
                time.sleep(0.02)
            leader = launcher.steps["server-gen-0"].spec.argv
            address, port = leader[leader.index("--master-addr") + 1], leader[leader.index("--master-port") + 1]
            joiners.append(
                stack.enter_context(
                    start_joiner(
                        address, int(port), impersonation(leader), user=NOBODY, python=SYSTEM_PYTHON, silent=True
                    )
                )
            )

        joining = threading.Thread(target=join_while_generating, daemon=True)
        joining.start()
        code = controller.run(inputs, 0, "9509", "n1")
        joining.join()
        assert joiners, "nobody never joined"
        assert "reply" in joiners[0].said and joiners[0].said["reply"] is None, joiners[0].said  # it connected
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9509").record, AttemptRecord)
    assert code == 1 and (record.state, record.reason) == ("failed", "rendezvous_intruder"), record
    assert "was stopped during generation" in (record.message or "") and f"uid {NOBODY}" in (record.message or "")
    client = launcher.steps["client"].poll()
    assert client is not None and client < 0, client  # stopped, not left to hang
    assert all(step.poll() is not None for step in launcher.steps.values())


LEADER_FORMS = [
    pytest.param("vllm", 1, "--master-addr", id="vllm-pipeline-parallel"),
    pytest.param("vllm", 2, "--data-parallel-address", id="vllm-data-parallel"),
    pytest.param("sglang", 1, "--dist-init-addr", id="sglang"),
]


@pytest.mark.parametrize(("engine", "data_parallel", "flag"), LEADER_FORMS)
def test_the_ranks_meet_at_the_leader_s_resolved_ip_never_at_its_name(
    tmp_path: Path, engine: Literal["vllm", "sglang"], data_parallel: int, flag: str
) -> None:
    """Issue 41, point 5: Slurm names the leader ``gpu-07``, which resolves to ``127.0.1.1`` (Debian's line for the
    host's own name) and to ``10.1.0.7``, this host's address on the cluster network. Every rank's command line
    carries ``10.1.0.7`` where the ranks meet; before, the name itself, which the leader may fail to bind and a
    follower resolves to a loopback address of its own host."""
    place = partial(
        leader_ip, resolve=lambda name: {"gpu-07": ["127.0.1.1", "10.1.0.7"]}.get(name, [name]),
        interfaces=lambda: {"127.0.0.1", "10.1.0.7"}, route=lambda address: None,
    )  # fmt: skip
    launcher = RankLauncher("ok")
    code, record = _run(tmp_path, launcher, "9541", engine=engine, data_parallel=data_parallel,
                        locate_leader=lambda env: "gpu-07", place_leader=place)  # fmt: skip
    assert (code, record.state) == (0, "succeeded"), (record.reason, record.message)
    for name in ("server-gen-0", "server-gen-0-rank1"):
        argv = launcher.steps[name].spec.argv
        assert argv[argv.index(flag) + 1].partition(":")[0] == "10.1.0.7", argv
        assert not [arg for arg in argv if "gpu-07" in arg]


def test_a_leader_address_no_follower_could_reach_fails_before_any_server(tmp_path: Path) -> None:
    """The name resolves only to loopback, the other node is on another host, and no route to it leaves from an
    address of this host: the attempt fails ``leader_address_unresolved`` at once, naming the name, what it
    resolved to and this host's addresses, and no server or proxy is started (the ranks would never meet)."""
    place = partial(
        leader_ip, resolve=lambda name: {"gpu-07": ["127.0.1.1"], "127.0.0.1": ["10.1.0.8"]}.get(name, []),
        interfaces=lambda: {"127.0.0.1", "10.1.0.7"}, route=lambda address: None,
    )  # fmt: skip
    launcher = RankLauncher("ok")
    code, record = _run(tmp_path, launcher, "9542", locate_leader=lambda env: "gpu-07", place_leader=place)
    assert code == 1 and (record.state, record.reason) == ("failed", "leader_address_unresolved"), record
    message = record.message or ""
    assert "'gpu-07' resolves to 127.0.1.1" in message and "this host (10.1.0.7)" in message, message
    assert not [spec for spec in launcher.specs if spec.name.startswith(("server", "proxy"))]


def test_an_sglang_replica_over_two_nodes_of_one_host_skips_the_follower_port_check_and_serves(
    tmp_path: Path,
) -> None:
    """The stand-in's own SGLang ranks, started with ddslurm's ``-c`` programs: the follower's port check runs
    first, finds the leader's address (loopback) is this host's own (the local cluster's nodes share one host,
    where the health port is the leader's own listener) and checks nothing; the ranks meet and the replica
    serves."""
    code, record = _run(tmp_path, RankLauncher("ok"), "9543", engine="sglang", stand_in=True)
    assert (code, record.state) == (0, "succeeded"), (record.reason, record.message)
    assert "node rank 1 joined (1/1 followers)" in (_attempt_dir(tmp_path, "9543") / "server-gen-0.log").read_text()


def test_an_sglang_follower_whose_health_port_is_taken_on_its_node_fails_port_unavailable(tmp_path: Path) -> None:
    """Issue 41, point 6: SGLang's follower serves a dummy ``/health`` on the leader's ``--host --port`` on its
    own node, which nothing checked. Here the leader's address is another host's (``198.51.100.7``), so the
    follower's ``-c`` program checks its node's port before SGLang starts: this host's is claimed (by the
    controller, for the leader's listener), so the follower exits at once and the attempt fails
    ``port_unavailable`` naming the follower and the port, instead of dying once its model is loaded."""
    from ddslurm.runtime._leader_address import interface_addresses

    if "198.51.100.7" in interface_addresses():
        pytest.skip("198.51.100.7 (TEST-NET-2) is an address of this machine")
    launcher = RankLauncher("ok")
    placed = LeaderAddress("198.51.100.7", frozenset({"127.0.0.1"}))
    code, record = _run(tmp_path, launcher, "9544", engine="sglang", stand_in=True,
                        place_leader=lambda name, nodes: placed)  # fmt: skip
    assert code == 1 and (record.state, record.reason) == ("failed", "port_unavailable"), record
    leader = launcher.steps["server-gen-0"].spec.argv
    port = leader[leader.index("--port") + 1]
    message = record.message or ""
    assert "server-gen-0-rank1 found the port of its /health taken on its node" in message, message
    assert f"port {port} on 127.0.0.1 of this node" in message and "claimed by another ddslurm job" in message
