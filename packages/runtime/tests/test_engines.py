"""Engine command lines of every shape: vLLM on one node with pipeline, data and expert parallel, a replica that
spans nodes (its leader and its headless followers), SGLang on one node and on two, bare / Pyxis / Apptainer; the
SGLang boot program that hands the token over without a command line; versions; the node count and the leader's
address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import DeploymentPlan, ReplicaPlan, ServingPlan
from ddslurm.runtime import RankPlace, server_command
from ddslurm.runtime._follower_port import SGLANG_FOLLOWER_CHECK
from ddslurm.runtime._node_discovery import check_nodes, leader_address
from ddslurm.runtime._server_command import SGLANG_BOOT, engine_version, token_environment
from ddslurm.runtime._serving import NodeMismatchError
from ddslurm.runtime._vllm_boot import VLLM_BOOT

URL = "http://127.0.0.1:8100"
EXTRA = ("--max-num-seqs", "64")


def _dep(**kw: Any) -> DeploymentPlan:
    fields: dict[str, Any] = {
        "alias": "gen",
        "model": "M",
        "served_model_name": "s",
        "tensor_parallel": 2,
        "replicas": (ReplicaPlan(index=0, gpus=2, cpus=4),),
        "startup_timeout": 60,
        "extra_args": EXTRA,
    }
    return DeploymentPlan(**{**fields, **kw})


def _serving(dep: DeploymentPlan, **kw: Any) -> ServingPlan:
    return ServingPlan(deployments=(dep,), gpus=4, **kw)


LEADER = RankPlace(node_rank=0, nodes=2, address="10.0.0.1", port="29500")
FOLLOWER = RankPlace(node_rank=1, nodes=2, address="10.0.0.1", port="29500")
WHERE = ("--host", "127.0.0.1", "--port", "8100")

# --- vLLM ------------------------------------------------------------------------------------------------------


def test_vllm_on_one_node_with_pipeline_data_and_expert_parallel() -> None:
    dep = _dep(pipeline_parallel=2, data_parallel=2, expert_parallel=True)
    cmd = server_command(_serving(dep, vllm_executable="/v/bin/vllm"), dep, URL)
    assert cmd.argv == (
        "/v/bin/vllm", "serve", "M", *WHERE, "--served-model-name", "s", "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "2", "--data-parallel-size", "2", "--enable-expert-parallel", *EXTRA,
    )  # fmt: skip
    assert cmd.srun_extra == ()


def test_vllm_sizes_of_one_are_left_out() -> None:
    """A plain replica's command line is the one it always was: no parallelism flag but the tensor-parallel size."""
    dep = _dep()
    argv = server_command(_serving(dep), dep, URL).argv
    assert argv == ("vllm", "serve", "M", *WHERE, "--served-model-name", "s", "--tensor-parallel-size", "2", *EXTRA)


def test_vllm_tensor_x_pipeline_parallel_over_two_nodes_leader_and_follower() -> None:
    dep = _dep(tensor_parallel=4, pipeline_parallel=2, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),))
    serving = _serving(dep, nodes=2)
    rendezvous = ("--nnodes", "2", "--node-rank")
    meet = ("--master-addr", "10.0.0.1", "--master-port", "29500")
    common = ("--served-model-name", "s", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2")
    assert server_command(serving, dep, URL, LEADER).argv == (
        "vllm", "serve", "M", *WHERE, *common, *rendezvous, "0", *meet, *EXTRA,
    )  # fmt: skip
    assert server_command(serving, dep, URL, FOLLOWER).argv == (
        "vllm", "serve", "M", *common, *rendezvous, "1", *meet, "--headless", *EXTRA,
    )  # fmt: skip


def test_vllm_data_parallel_over_two_nodes_leader_and_follower() -> None:
    dep = _dep(tensor_parallel=1, data_parallel=8, expert_parallel=True,
               replicas=(ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),))  # fmt: skip
    serving = _serving(dep, nodes=2)
    dp = ("--data-parallel-size", "8", "--data-parallel-size-local", "4", "--data-parallel-address", "10.0.0.1",
          "--data-parallel-rpc-port", "29500")  # fmt: skip
    common = ("--served-model-name", "s", "--tensor-parallel-size", "1", *dp)
    leader = server_command(serving, dep, URL, LEADER).argv
    assert leader == ("vllm", "serve", "M", *WHERE, *common, "--enable-expert-parallel", *EXTRA)
    follower = server_command(serving, dep, URL, FOLLOWER).argv
    assert follower == (
        "vllm", "serve", "M", *common, "--headless", "--data-parallel-start-rank", "4", "--enable-expert-parallel",
        *EXTRA,
    )  # fmt: skip
    assert "--nnodes" not in leader and "--master-addr" not in follower  # data parallel meets at its own port


def test_vllm_data_parallel_that_does_not_divide_over_the_nodes_is_refused() -> None:
    dep = _dep(tensor_parallel=1, data_parallel=3)
    with pytest.raises(ValueError, match=r"data_parallel 3 of 'gen' does not divide over 2 node\(s\)"):
        server_command(_serving(dep, nodes=2), dep, URL, FOLLOWER)


@pytest.mark.parametrize(
    ("runtime", "head", "srun_extra"),
    [
        pytest.param(
            "pyxis",
            ("python3", "-c", VLLM_BOOT, "vllm"),
            ("--container-image=vimg", "--no-container-mount-home"),
            id="pyxis",
        ),
        pytest.param(
            "apptainer", ("apptainer", "exec", "--nv", "vimg", "python3", "-c", VLLM_BOOT, "vllm"), (), id="apptainer"
        ),
    ],
)
def test_vllm_follower_in_a_container_mounts_no_socket_directory(
    runtime: str, head: tuple[str, ...], srun_extra: tuple[str, ...]
) -> None:
    """The leader on a Unix-domain socket gets the socket's directory in its container; a headless follower
    serves no API, and that directory exists only on the leader's node: it gets the profile's mounts alone."""
    dep = _dep(tensor_parallel=4, pipeline_parallel=2, replicas=(ReplicaPlan(index=0, gpus=4, cpus=4, nodes=2),))
    serving = _serving(dep, nodes=2, container_runtime=runtime, vllm_image="vimg", sglang_image="simg")
    follower = server_command(serving, dep, "unix:/s/x/gen-0.sock", FOLLOWER)
    assert follower.argv[: len(head)] == head and follower.argv[len(head) : len(head) + 2] == ("serve", "M")
    assert "--uds" not in follower.argv and "/s/x" not in " ".join((*follower.argv, *follower.srun_extra))
    assert follower.srun_extra == srun_extra
    leader = server_command(serving, dep, "unix:/s/x/gen-0.sock", LEADER)
    assert "--uds" in leader.argv and "/s/x:/s/x" in " ".join((*leader.argv, *leader.srun_extra))


# --- SGLang ----------------------------------------------------------------------------------------------------

SGL = ("-c", SGLANG_BOOT, "--model-path", "M", *WHERE, "--served-model-name", "s", "--tp-size", "2")


def test_sglang_on_one_node() -> None:
    dep = _dep(engine="sglang", pipeline_parallel=2, data_parallel=2, expert_parallel=True)
    cmd = server_command(_serving(dep, sglang_executable="/sgl/bin/python"), dep, URL)
    assert cmd.argv == (
        "/sgl/bin/python", *SGL, "--pp-size", "2", "--dp-size", "2", "--ep-size", "2", "--enable-metrics", *EXTRA,
    )  # fmt: skip
    plain = _dep(engine="sglang")
    assert server_command(_serving(plain), plain, URL).argv == ("python3", *SGL, "--enable-metrics", *EXTRA)


def _sgl(place: RankPlace | None) -> tuple[str, ...]:
    """:data:`SGL`, a follower's program first checking the port of its dummy /health (issue 41, point 6)."""
    if place is None or place.node_rank == 0:
        return SGL
    return ("-c", SGLANG_FOLLOWER_CHECK + SGLANG_BOOT, *SGL[2:])


def test_sglang_over_two_nodes_every_rank_the_same_arguments_but_its_rank() -> None:
    dep = _dep(engine="sglang", pipeline_parallel=2, replicas=(ReplicaPlan(index=0, gpus=2, cpus=4, nodes=2),))
    serving = _serving(dep, nodes=2)
    for place in (LEADER, FOLLOWER):
        assert server_command(serving, dep, URL, place).argv == (
            "python3", *_sgl(place), "--pp-size", "2", "--enable-metrics", "--nnodes", "2", "--node-rank",
            str(place.node_rank), "--dist-init-addr", "10.0.0.1:29500", *EXTRA,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("runtime", "head", "srun_extra"),
    [
        pytest.param(
            "pyxis",
            ("python3",),
            ("--container-image=simg", "--no-container-mount-home", "--container-mounts=/models:/models"),
            id="pyxis",
        ),
        pytest.param(
            "apptainer", ("apptainer", "exec", "--nv", "--bind=/models:/models", "simg", "python3"), (), id="apptainer"
        ),
    ],
)
@pytest.mark.parametrize("place", [None, FOLLOWER], ids=["one-node", "follower"])
def test_sglang_in_a_container_runs_the_images_python(
    runtime: str, head: tuple[str, ...], srun_extra: tuple[str, ...], place: RankPlace | None
) -> None:
    dep = _dep(engine="sglang")
    serving = _serving(
        dep, container_runtime=runtime, vllm_image="vimg", sglang_image="simg", container_mounts=("/models:/models",)
    )
    cmd = server_command(serving, dep, URL, place)
    assert cmd.argv[: len(head)] == head
    assert cmd.argv[len(head) : len(head) + len(SGL)] == _sgl(place)
    assert cmd.srun_extra == srun_extra


def test_sglang_has_no_unix_socket() -> None:
    dep = _dep(engine="sglang")
    with pytest.raises(ValueError, match="SGLang listens on a TCP port"):
        server_command(_serving(dep), dep, "unix:/s/x/gen-0.sock")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("runtime", ["none", "pyxis", "apptainer"])
@pytest.mark.parametrize("place", [None, LEADER, FOLLOWER], ids=["one-node", "leader", "follower"])
def test_the_token_is_on_no_command_line(engine: str, runtime: str, place: RankPlace | None) -> None:
    """Neither engine ever gets the token (or an ``--api-key`` option) on its command line: vLLM reads it from
    its environment, SGLang's boot program appends it inside the process."""
    dep = _dep(engine=engine, pipeline_parallel=2, replicas=(ReplicaPlan(index=0, gpus=2, cpus=4, nodes=2),))
    serving = _serving(dep, nodes=2, container_runtime=runtime, vllm_image="vimg", sglang_image="simg")
    token = "tok-" + "x" * 40
    cmd = server_command(serving, dep, URL, place)
    words = (*cmd.argv, *cmd.srun_extra)
    assert not any(token in word for word in words)
    assert "--api-key" not in words
    assert token_environment(serving, token)["VLLM_API_KEY"] == token


FAKE_SGLANG = """
import json, sys
print(json.dumps({"name": __name__, "argv": sys.argv[1:],
                  "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0")}))
"""


def _fake_sglang(root: Path) -> Path:
    package = root / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text('__version__ = "0.5.9-fake"\n')
    (package / "launch_server.py").write_text(FAKE_SGLANG)
    return root


def test_the_sglang_boot_program_hands_the_token_over_inside_the_process(tmp_path: Path) -> None:
    """``python3 -c BOOT ARGS``: SGLang's launch_server runs as ``__main__`` with ARGS and ``--api-key=TOKEN``,
    while the process's own command line (what ``ps`` shows) never holds the token."""
    token = "-tok-secret-" + "y" * 30  # token_urlsafe may start with "-": one item, --api-key=TOKEN
    env = {**os.environ, "PYTHONPATH": str(_fake_sglang(tmp_path)), "VLLM_API_KEY": token}
    out = subprocess.run(
        [sys.executable, "-c", SGLANG_BOOT, "--model-path", "M", "--port", "8100"],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    )  # fmt: skip
    seen = json.loads(out.stdout)
    assert seen["name"] == "__main__"
    assert seen["argv"] == ["--model-path", "M", "--port", "8100", f"--api-key={token}"]
    assert not any(token in word for word in seen["cmdline"])
    env.pop("VLLM_API_KEY")
    refused = subprocess.run(
        [sys.executable, "-c", SGLANG_BOOT, "--model-path", "M"], capture_output=True, text=True, env=env, timeout=60
    )
    assert refused.returncode == 1 and "VLLM_API_KEY is unset" in refused.stderr and refused.stdout == ""


def test_engine_versions(tmp_path: Path) -> None:
    dep = _dep(engine="sglang")
    serving = _serving(dep, sglang_executable=sys.executable)
    env = {**os.environ, "PYTHONPATH": str(_fake_sglang(tmp_path))}
    assert engine_version(serving, "sglang", env) == "0.5.9-fake"
    boxed = _serving(dep, container_runtime="pyxis", sglang_image="simg", vllm_image="vimg")
    assert engine_version(boxed, "sglang", env) == "unknown (pyxis image simg)"
    assert engine_version(boxed, "vllm", env) == "unknown (pyxis image vimg)"
    assert engine_version(_serving(dep, vllm_executable=str(tmp_path / "none")), "vllm", env).startswith("unknown (")


def _installed(site: Path, name: str, version: str) -> Path:
    """A distribution's metadata alone (``NAME-VERSION.dist-info/METADATA``) in ``site``: installed, not importable."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


def test_an_installed_engine_s_version_is_read_from_its_metadata_without_importing_it(tmp_path: Path) -> None:
    """``vllm --version`` and ``import sglang`` import the engine and torch (seconds, with the GPUs idle): the version
    comes from the distribution's metadata, read by the engine's own Python (``vllm``'s ``#!`` line). The engines
    here are metadata alone: importing either, or running a ``vllm --version`` that fails, would not give it."""
    site = _installed(_installed(tmp_path / "site", "vllm", "0.10.1.1"), "sglang", "0.4.6.post2")
    env = {**os.environ, "PYTHONPATH": str(site)}
    vllm = tmp_path / "vllm"
    vllm.write_text(f"#!{sys.executable}\nimport sys\nsys.exit('not vllm: --version must not be asked')\n")
    vllm.chmod(0o755)
    assert engine_version(_serving(_dep(), vllm_executable=str(vllm)), "vllm", env) == "0.10.1.1"
    assert engine_version(_serving(_dep(engine="sglang"), sglang_executable=sys.executable), "sglang", env) == (
        "0.4.6.post2"
    )
    shell = tmp_path / "vllm-wrapper"  # no Python script: asked --version
    shell.write_text("#!/bin/sh\necho 0.11.1\n")
    shell.chmod(0o755)
    assert engine_version(_serving(_dep(), vllm_executable=str(shell)), "vllm", env) == "0.11.1"


# --- the allocation's nodes and the leader's address -----------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        pytest.param({"SLURM_JOB_NUM_NODES": "2"}, None, id="matches"),
        pytest.param({}, None, id="outside-slurm"),
        pytest.param({"SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "2"}, "has 1 (SLURM_JOB_NUM_NODES='1')", id="job"),
        pytest.param({"SLURM_NNODES": "3"}, "has 3 (SLURM_NNODES='3')", id="nnodes"),
    ],
)
def test_the_allocation_has_the_plans_nodes(env: dict[str, str], refused: str | None) -> None:
    serving = _serving(_dep(), nodes=2)
    if refused is None:
        check_nodes(serving, env)
        return
    with pytest.raises(NodeMismatchError) as caught:
        check_nodes(serving, env)
    assert caught.value.reason == "node_mismatch"
    assert f"places its servers on 2 node(s) but this allocation {refused}" in caught.value.message


class FakeScontrol:
    def __init__(self, stdout: str = "", code: int = 0, error: Exception | None = None) -> None:
        self.stdout, self.code, self.error = stdout, code, error
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if self.error is not None:
            raise self.error
        return subprocess.CompletedProcess(argv, self.code, self.stdout, "")


NODE_LINE = "NodeName=gpu-07 Arch=x86_64 CoresPerSocket=16 NodeAddr=10.4.0.7 NodeHostName=gpu-07 Version=24.05\n"


@pytest.mark.parametrize(
    ("runner", "want"),
    [
        pytest.param(FakeScontrol(NODE_LINE), "10.4.0.7", id="node-addr"),
        pytest.param(FakeScontrol("NodeName=gpu-07 NodeAddr=(null)\n"), "gpu-07", id="no-addr"),
        pytest.param(FakeScontrol("", code=1), "gpu-07", id="scontrol-failed"),
        pytest.param(FakeScontrol(error=FileNotFoundError("scontrol")), "gpu-07", id="no-scontrol"),
    ],
)
def test_the_leaders_address_is_the_node_address_slurm_knows(runner: FakeScontrol, want: str) -> None:
    assert leader_address({"SLURMD_NODENAME": "gpu-07"}, run=runner) == want
    assert runner.calls == [["scontrol", "show", "node", "gpu-07", "-o"]]


def test_outside_slurm_the_leader_is_loopback() -> None:
    runner = FakeScontrol(NODE_LINE)
    assert leader_address({}, run=runner) == "127.0.0.1"
    assert runner.calls == []
