"""Serving units: vLLM command lines (bare, Pyxis, Apptainer), srun steps, ports, GPUs, memory shares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddslurm.config import DeploymentPlan, ReplicaPlan, ServingPlan
from ddslurm.runtime._controller import split_memory
from ddslurm.runtime._node_discovery import check_gpus
from ddslurm.runtime._ports import PortClaims, choose_ports, listening_ports
from ddslurm.runtime._server_command import server_command, token_environment
from ddslurm.runtime._serving import GpuMismatchError, PortUnavailableError
from ddslurm.runtime._steps import StepSpec, srun_argv, without
from ddslurm.runtime._vllm_boot import VLLM_BOOT

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

DEP = DeploymentPlan(
    alias="gen",
    model="Qwen/Qwen3-8B",
    served_model_name="qwen3-8b",
    tensor_parallel=2,
    replicas=(ReplicaPlan(index=0, gpus=2, cpus=4),),
    startup_timeout=60,
    extra_args=("--max-model-len", "8192"),
)
SERVE = (
    "serve",
    "Qwen/Qwen3-8B",
    "--host",
    "127.0.0.1",
    "--port",
    "8100",
    "--served-model-name",
    "qwen3-8b",
    "--tensor-parallel-size",
    "2",
    "--max-model-len",
    "8192",
)

BOOTED = ("python3", "-c", VLLM_BOOT, "vllm")
"""vLLM in a container: the image's Python runs its ``vllm`` with the key moved into its arguments."""


def _serving(**kw: object) -> ServingPlan:
    return ServingPlan(deployments=(DEP,), gpus=2, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("serving", "argv", "srun_extra"),
    [
        pytest.param(_serving(vllm_executable="/opt/venv/bin/vllm"), ("/opt/venv/bin/vllm", *SERVE), (), id="bare"),
        pytest.param(
            _serving(container_runtime="pyxis", vllm_image="nvcr.io#vllm:0.9", container_mounts=("/models:/models",)),
            (*BOOTED, *SERVE),
            ("--container-image=nvcr.io#vllm:0.9", "--no-container-mount-home", "--container-mounts=/models:/models"),
            id="pyxis",
        ),
        pytest.param(
            _serving(container_runtime="apptainer", vllm_image="/images/vllm.sif", container_mounts=("/models",)),
            ("apptainer", "exec", "--nv", "--bind=/models", "/images/vllm.sif", *BOOTED, *SERVE),
            (),
            id="apptainer",
        ),
    ],
)
def test_server_command_lines(serving: ServingPlan, argv: tuple[str, ...], srun_extra: tuple[str, ...]) -> None:
    cmd = server_command(serving, DEP, "http://127.0.0.1:8100")
    assert cmd.argv == argv
    assert cmd.srun_extra == srun_extra


@pytest.mark.parametrize(
    ("runtime", "argv_head", "srun_extra"),
    [
        pytest.param("none", ("/opt/venv/bin/vllm",), (), id="bare"),
        pytest.param(
            "pyxis",
            BOOTED,
            ("--container-image=img", "--no-container-mount-home", "--container-mounts=/models:/models,/s/x:/s/x"),
            id="pyxis",
        ),
        pytest.param(
            "apptainer",
            ("apptainer", "exec", "--nv", "--bind=/models", "--bind=/s/x:/s/x", "img", *BOOTED),
            (),
            id="apptainer",
        ),
    ],
)
def test_a_replica_on_a_unix_socket_gets_uds_and_its_directory_inside_a_container(
    runtime: str, argv_head: tuple[str, ...], srun_extra: tuple[str, ...]
) -> None:
    """vLLM's ``--uds PATH`` replaces ``--host``/``--port``; a container sees the socket's directory at the same
    path, or the socket it binds would be invisible to the proxy outside."""
    mounts = ("/models:/models",) if runtime == "pyxis" else ("/models",)
    serving = _serving(
        container_runtime=runtime, vllm_image="img", container_mounts=mounts, vllm_executable="/opt/venv/bin/vllm"
    )
    cmd = server_command(serving, DEP, "unix:/s/x/gen-0.sock")
    assert cmd.argv[: len(argv_head)] == argv_head
    serve = cmd.argv[len(argv_head) :]
    assert serve[:4] == ("serve", DEP.model, "--uds", "/s/x/gen-0.sock")
    assert "--host" not in serve and "--port" not in serve
    assert cmd.srun_extra == srun_extra


@pytest.mark.parametrize("runtime", ["none", "pyxis", "apptainer"])
def test_the_token_reaches_vllm_by_environment_not_on_the_command_line(runtime: str) -> None:
    """vLLM reads VLLM_API_KEY as it reads --api-key (the boot program moves it into its arguments inside the
    process); on a command line ``ps`` would show the token to everyone. Apptainer also gets
    APPTAINERENV_VLLM_API_KEY, which reaches the container even with --cleanenv."""
    serving = _serving(container_runtime=runtime, vllm_image="img")
    token = "tok-" + "x" * 40
    for python in (None, "/opt/venv/bin/python"):
        cmd = server_command(serving, DEP, "http://127.0.0.1:8100", vllm_python=python)
        words = [arg for arg in (*cmd.argv, *cmd.srun_extra) if arg != VLLM_BOOT]
        assert not any(token in arg or "--api-key" in arg for arg in words)
    env = token_environment(serving, token)
    assert env["VLLM_API_KEY"] == token
    assert (env.get("APPTAINERENV_VLLM_API_KEY") == token) == (runtime == "apptainer")
    assert set(env) <= {"VLLM_API_KEY", "APPTAINERENV_VLLM_API_KEY"}


@pytest.mark.parametrize(
    ("gpus", "mode", "mem", "want"),
    [
        pytest.param(2, "gres", 4096, ["--mem=4096M", "--gres=gpu:2"], id="gres"),
        pytest.param(2, "gpus", None, ["--gpus=2"], id="gpus"),
        pytest.param(0, "gres", 512, ["--mem=512M", "--gres=none"], id="cpu-step"),
    ],
)
def test_srun_step_asks_for_exactly_its_share(gpus: int, mode: str, mem: int | None, want: list[str]) -> None:
    spec = StepSpec(
        name="s",
        argv=("prog", "--x"),
        env={},
        log=Path("/tmp/x.log"),
        cpus=3,
        mem_mb=mem,
        gpus=gpus,
        gpu_request=mode,
        srun_extra=("--container-image=i",),
    )  # type: ignore[arg-type]
    argv = srun_argv(spec)
    assert argv[:2] == ["srun", "--exact"] and "--cpus-per-task=3" in argv and "--export=ALL" in argv
    for flag in want:
        assert flag in argv
    assert argv[-3:] == ["--container-image=i", "prog", "--x"]


def test_ports_fixed_are_checked_and_planned_ones_skip_taken_ports() -> None:
    span = range(20000, 32768)
    busy = {20000 + (123 * 64) % len(span)}
    ports = choose_ports([None, 8100, None], "123", lambda p: p not in busy, span)
    assert ports[1] == 8100 and len(set(ports)) == 3 and not busy & set(ports)
    assert all(p in span for p in (ports[0], ports[2]))
    with pytest.raises(PortUnavailableError, match="8100"):
        choose_ports([8100], "1", lambda p: p != 8100)
    assert choose_ports([None], "1")[0] != choose_ports([None], "2")[0]  # jobs sharing a node start apart


def test_two_controllers_choosing_at_once_never_choose_the_same_port() -> None:
    """Both see every port free (a server binds its port only once started): the claim made at the choice keeps
    the second controller off the first's ports; it is the first's until released, or until its process dies."""
    span = range(24000, 24016)
    first, second = PortClaims(), PortClaims()
    try:
        mine = choose_ports([None] * 3, "5", lambda p: first.take(p, lambda _: True), span)
        theirs = choose_ports([None] * 3, "5", lambda p: second.take(p, lambda _: True), span)
        assert not set(mine) & set(theirs) and len(set(mine)) == 3
        assert not first.take(mine[0], lambda _: True)  # not twice either
        assert not second.take(span[-1], lambda _: False) and first.take(span[-1], lambda _: True)  # taken only free
        first.release()
        assert second.take(mine[0], lambda _: True)
    finally:
        first.release()
        second.release()
    holder = "from ddslurm.runtime._ports import PortClaims; import sys; c = PortClaims(); "
    holder += "assert c.take(24100, lambda _: True); print('held', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    claims = PortClaims()
    assert not claims.take(24100, lambda _: True)  # another process's claim
    child.kill()
    child.wait()
    assert claims.take(24100, lambda _: True)  # gone with the process that made it
    claims.release()


def test_listening_ports_avoid_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    """A client connection's source port comes from the ephemeral range; a server planned there can lose its port
    to one between the check and its bind (CI saw a replica die with "address already in use")."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert listening_ports(ranges) == range(20000, 32768)
    ranges.write_text("10000 50000\n")
    assert listening_ports(ranges) == range(50001, 65536)
    ranges.write_text("1024 65535\n")
    assert listening_ports(ranges) == range(20000, 50000)
    assert listening_ports(tmp_path / "absent") == range(20000, 50000)
    chosen = choose_ports([None] * 3, "1725", ports=listening_ports(ranges.with_name("absent")))
    ranges.write_text("32768 60999\n")
    below = choose_ports([None] * 3, "1725", ports=listening_ports(ranges))
    assert not any(32768 <= p <= 60999 for p in below) and len(chosen) == 3


def test_gpu_discovery_must_match_the_plan() -> None:
    assert check_gpus(_serving(), {"CUDA_VISIBLE_DEVICES": "0,1"}) == ["0", "1"]
    assert check_gpus(_serving(), {"SLURM_JOB_GPUS": "2,3"}) == ["2", "3"]
    with pytest.raises(GpuMismatchError, match="places 2 GPU"):
        check_gpus(_serving(), {"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(GpuMismatchError, match="sees 3"):
        check_gpus(_serving(), {"CUDA_VISIBLE_DEVICES": "0,1,2"})  # more than planned is a mismatch too


@pytest.mark.parametrize(
    ("env", "servers", "proxies", "want"),
    [
        pytest.param({"SLURM_MEM_PER_NODE": "16384"}, 2, 1, (4032, 6048, 256), id="per-node"),
        pytest.param({"SLURM_MEM_PER_CPU": "500", "SLURM_CPUS_ON_NODE": "2"}, 0, 0, (1000, None, None), id="hosted"),
        pytest.param({}, 2, 1, (None, None, None), id="unknown"),
    ],
)
def test_memory_shares_fit_the_allocation(
    env: dict[str, str], servers: int, proxies: int, want: tuple[int | None, ...]
) -> None:
    split = split_memory(env, servers, proxies)
    assert (split.client, split.server, split.proxy) == want
    if split.client is not None and "SLURM_MEM_PER_NODE" in env:
        total = split.client + servers * (split.server or 0) + proxies * (split.proxy or 0)
        assert total <= int(env["SLURM_MEM_PER_NODE"])


def test_secrets_are_removed_from_server_environments() -> None:
    assert without({"A": "1", "KEY": "s", "PATH": "/bin"}, ("KEY",)) == {"A": "1", "PATH": "/bin"}


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        pytest.param({"array_job_id": "278", "array_task_id": "0"}, "278_0.0", id="array-task-0"),
        pytest.param({"array_job_id": "278", "array_task_id": "1"}, "278_1.0", id="array-task-1"),
        pytest.param({}, None, id="plain-job-sees-no-array-steps"),
    ],
)
def test_teardown_finds_only_this_tasks_step(kwargs: dict[str, str], want: str | None) -> None:
    """Every task of an array has a step named "client": TERM must reach this task's, never a sibling's."""
    import subprocess

    from ddslurm.runtime._steps import SrunLauncher

    listing = "278_1.0|client\n278_1.batch|batch\n278_0.0|client\n278_0.batch|batch\n"

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, listing, "")

    assert SrunLauncher("279", run=run, **kwargs).step_id("client") == want


def test_the_runtime_raises_its_soft_open_file_limit_to_the_hard_one() -> None:
    import resource
    import subprocess
    import sys

    script = (
        "import resource; from ddslurm.runtime.cli import raise_open_files_limit; "
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); "
        "print(raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert [int(v) for v in out] == [hard, hard, hard]
