"""Issue 41, point 6: an SGLang follower serves a dummy ``/health`` on the leader's ``--host --port`` on its own
node. Its ``-c`` program checks that port first (``SGLANG_FOLLOWER_CHECK``), run here as a real Python runs it:
claimed by another ddslurm job, or in use, it exits ``FOLLOWER_PORT_TAKEN`` naming the port; free, it keeps the
claim for the process's life and SGLang starts; where the leader's address is this host's own, nothing is checked.
The controller's side (the attempt fails ``port_unavailable``) is ``test_multinode.py``'s."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ddslurm.config import DeploymentPlan, ReplicaPlan, ServingPlan
from ddslurm.runtime._follower_port import FOLLOWER_PORT_TAKEN, SGLANG_FOLLOWER_CHECK
from ddslurm.runtime._leader_address import interface_addresses
from ddslurm.runtime._ports import PortClaims
from ddslurm.runtime._server_command import SGLANG_BOOT, RankPlace, server_command

ELSEWHERE = "198.51.100.7"
"""A leader on another host (TEST-NET-2: never an address of this machine, checked)."""
BOOTED = "print('sglang starts', flush=True); import sys; sys.stdin.read()"
"""What stands for SGLang after the check: it says it started, then lives until its stdin closes."""


@pytest.fixture
def port() -> Iterator[int]:
    if ELSEWHERE in interface_addresses():
        pytest.skip(f"{ELSEWHERE} is an address of this machine")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    yield free


def _follower(port: int, leader: str = ELSEWHERE) -> subprocess.Popen[str]:
    args = ["--model-path", "m", "--host", "127.0.0.1", "--port", str(port), "--nnodes", "2", "--node-rank", "1"]
    return subprocess.Popen(
        [sys.executable, "-c", SGLANG_FOLLOWER_CHECK + BOOTED, *args, "--dist-init-addr", f"{leader}:29500"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ended(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_a_free_port_is_claimed_for_the_follower_s_life(port: int) -> None:
    """While the follower lives, no ddslurm job on its node can claim the port (as the controller claims its
    servers' ports); once it ends, the kernel lets the claim go."""
    follower = _follower(port)
    assert follower.stdout is not None and follower.stdout.readline().strip() == "sglang starts"
    claims = PortClaims("127.0.0.1")
    try:
        assert not claims.take(port)
    finally:
        code, _, err = _ended(follower)
    assert code == 0, err
    assert claims.take(port)
    claims.release()


def test_a_port_in_use_on_the_follower_s_node_ends_it_before_sglang(port: int) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        code, out, err = _ended(_follower(port))
    assert code == FOLLOWER_PORT_TAKEN and "sglang starts" not in out
    assert f"ddslurm: port {port} on 127.0.0.1 of this node (the leader's --host --port)" in err
    assert "serves its /health, is in use" in err and "Address already in use" in err


def test_a_port_another_ddslurm_job_claimed_ends_it_before_sglang(port: int) -> None:
    claims = PortClaims("127.0.0.1")
    assert claims.take(port)
    try:
        code, out, err = _ended(_follower(port))
    finally:
        claims.release()
    assert code == FOLLOWER_PORT_TAKEN and "sglang starts" not in out
    assert "claimed by another ddslurm job on this node" in err


def test_nothing_is_checked_where_the_leader_s_address_is_this_host_s(port: int) -> None:
    """One host for both ranks (the local test cluster): the port is the leader's own listener, not a follower's
    to check."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        follower = _follower(port, leader="127.0.0.1")
        assert follower.stdout is not None and follower.stdout.readline().strip() == "sglang starts"
        code, _, err = _ended(follower)
    assert code == 0, err


def test_only_sglang_followers_run_the_check() -> None:
    serving = ServingPlan(deployments=(), gpus=1, nodes=2)
    deps = {
        engine: DeploymentPlan(alias="gen", model="m", served_model_name="s", engine=engine, tensor_parallel=1,
                               pipeline_parallel=2, startup_timeout=30,
                               replicas=(ReplicaPlan(index=0, gpus=1, cpus=1, nodes=2),))
        for engine in ("sglang", "vllm")
    }  # fmt: skip
    for engine, dep in deps.items():
        for rank in (0, 1):
            argv = server_command(serving, dep, "http://127.0.0.1:20001", RankPlace(rank, 2, "10.1.0.7", "29500")).argv
            programs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-c"]
            if engine == "vllm":
                assert programs == []
            else:
                assert programs == [SGLANG_FOLLOWER_CHECK + SGLANG_BOOT if rank else SGLANG_BOOT]
                assert argv[argv.index("--dist-init-addr") + 1] == "10.1.0.7:29500"
    ipv6 = server_command(serving, deps["sglang"], "http://127.0.0.1:20001", RankPlace(1, 2, "fd00::7", "29500")).argv
    assert ipv6[ipv6.index("--dist-init-addr") + 1] == "[fd00::7]:29500"  # SGLang's [IPv6]:PORT
