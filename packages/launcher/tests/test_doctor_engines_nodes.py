"""The checks of multi-node allocations and of the engines: a job of several nodes needs as many nodes with
``gpus_per_node`` GPUs in its partition (against canned ``sinfo``); the vLLM and SGLang commands are checked when
a deployment uses them."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ddslurm.config import (
    ClusterProfile,
    Deployment,
    ProviderSnapshot,
    RunFile,
    RunLayout,
    ServerSpec,
    load_profile,
)
from ddslurm.launcher import Slurm
from ddslurm.launcher.cluster._doctor_checks import Check, ClusterFacts, job_checks, profile_checks
from ddslurm.launcher.cluster._slurm import Completed
from ddslurm.planner import PlanInputs, compile_plan

SINFO = (
    "n1|gpu*|16|32000|gpu:4|up|infinite\n"
    "n2|gpu*|16|32000|gpu:4(S:0-1)|up|infinite\n"
    "n3|gpu*|16|32000|gpu:2|up|infinite\n"
    "c1|cpu|8|16000|(null)|up|infinite\n"
)
"""Two nodes of 4 GPUs and one of 2 in partition gpu, one CPU node."""


def _runner(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
    args = list(argv)
    if args[0] == "sinfo":
        return Completed(0, SINFO, "")
    if args[:3] == ["scontrol", "show", "config"]:
        return Completed(0, "ClusterName = canned\nSelectType = select/cons_tres\n", "")
    if args[0] == "sbatch" and "--test-only" in args:
        return Completed(0, "", "sbatch: Job 7 to start at 2026-01-01T00:00:00")
    raise AssertionError(f"unexpected command {args}")


def _files(tmp_path: Path, profile_body: str, run_body: str) -> tuple[Path, Path]:
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"workspace: /ws\npython_env: /venv\npartition: gpu\ngpus_per_node: 4\n{profile_body}")
    run = tmp_path / "run.yaml"
    run.write_text(f"name: demo\nrecipe: recipe.yaml\nnum_records: 10\n{run_body}")
    return profile, run


def _job_checks(tmp_path: Path, deployment: Deployment) -> dict[str, Check]:
    profile_path, run_path = _files(tmp_path, "", "deployments:\n  - model_alias: big\n    model: m\n")
    profile = load_profile(profile_path)
    run = RunFile(name="demo", recipe="recipe.yaml", num_records=10, deployments=(deployment,))
    plan = compile_plan(
        PlanInputs(
            run=run,
            profile=profile,
            snapshot=ProviderSnapshot(),
            layout=RunLayout.in_workspace(Path("/ws"), "run-1"),
            recipe_sha256="1" * 64,
            snapshot_sha256="2" * 64,
        )
    )
    facts = ClusterFacts(Slurm(_runner, user="alice"), {"PATH": "/usr/bin"}, run_path, profile_path)
    return {c.name: c for c in job_checks(facts, run, profile, plan, "#!/bin/bash\n")}


def test_a_replica_over_more_nodes_than_the_partition_has_is_a_problem_at_deployments(tmp_path: Path) -> None:
    checks = _job_checks(tmp_path, Deployment(model_alias="big", model="m", tensor_parallel=4, pipeline_parallel=3))
    check = checks["generation nodes"]
    assert check.status == "problem"
    assert check.message == (
        f"{tmp_path / 'run.yaml'}:4:1: deployments: one replica spans 3 nodes of 4 GPUs, but partition gpu has 2 "
        "node(s) with 4 GPUs or more (sinfo); use a smaller replica (tensor_parallel x pipeline_parallel x "
        "data_parallel at most 8 GPUs) or a partition with more such nodes"
    )
    assert checks["sbatch --test-only"].status == "skipped"


def test_a_two_node_replica_fits_two_nodes_of_four_gpus(tmp_path: Path) -> None:
    checks = _job_checks(tmp_path, Deployment(model_alias="big", model="m", tensor_parallel=4, pipeline_parallel=2))
    check = checks["generation nodes"]
    assert (check.status, check.detail) == ("ok", "2 nodes of 4 GPUs: partition gpu has 2")


def test_one_node_jobs_have_no_node_count_check(tmp_path: Path) -> None:
    assert "generation nodes" not in _job_checks(tmp_path, Deployment(model_alias="big", model="m"))


def _engine_checks(tmp_path: Path, profile_body: str, engines: Sequence[str] | None) -> dict[str, Check]:
    deployments = "".join(
        f"  - model_alias: a{i}\n    model: m\n    engine: {engine}\n" for i, engine in enumerate(engines or ())
    )
    profile_path, run_path = _files(tmp_path, profile_body, f"deployments:\n{deployments}" if deployments else "")
    profile: ClusterProfile = load_profile(profile_path)
    run = None
    if engines is not None:
        run = RunFile(
            name="demo",
            recipe="recipe.yaml",
            num_records=10,
            deployments=tuple(
                Deployment(model_alias=f"a{i}", model="m", engine=e)  # type: ignore[arg-type]
                for i, e in enumerate(engines)
            ),
        )
    facts = ClusterFacts(Slurm(_runner, user="alice"), {"PATH": str(tmp_path / "bin")}, run_path, profile_path)
    return {c.name: c for c in profile_checks(facts, profile, run)}


@pytest.fixture
def sglang_python(tmp_path: Path) -> Path:
    exe = tmp_path / "sglang-env" / "python3"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def test_sglang_executable_is_checked_when_a_deployment_uses_sglang(tmp_path: Path, sglang_python: Path) -> None:
    checks = _engine_checks(tmp_path, f"sglang_executable: {sglang_python}\n", ["sglang"])
    sglang, vllm = checks["sglang"], checks["vllm"]
    assert (sglang.status, sglang.detail) == (
        "ok",
        f"sglang_executable {sglang_python} (checked on the submit host)",
    )
    assert (vllm.status, vllm.detail) == ("skipped", "no deployment of the run uses vllm")


def test_a_missing_sglang_executable_is_a_problem_at_its_field(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "python3"
    checks = _engine_checks(tmp_path, f"sglang_executable: {missing}\n", ["vllm", "sglang"])
    sglang = checks["sglang"]
    assert sglang.status == "problem"
    assert sglang.message == (
        f"{tmp_path / 'profile.yaml'}:5:1: sglang_executable: {missing} does not exist or is not executable on the "
        "submit host (the nodes run it at the same path)"
    )
    assert checks["vllm"].status == "problem"  # the run's vLLM deployment needs vllm, not on this PATH


def test_a_container_run_with_sglang_needs_the_sglang_image(tmp_path: Path) -> None:
    checks = _engine_checks(tmp_path, "container_runtime: pyxis\nvllm_image: vllm.sqsh\n", ["sglang"])
    sglang = checks["sglang"]
    assert sglang.status == "problem"
    assert "container_runtime pyxis needs sglang_image, which is not set" in sglang.message


def test_without_a_run_sglang_is_checked_only_when_the_profile_sets_it(tmp_path: Path, sglang_python: Path) -> None:
    unset = _engine_checks(tmp_path, "", None)["sglang"]
    assert unset.status == "skipped"
    set_here = _engine_checks(tmp_path, f"sglang_executable: {sglang_python}\n", None)["sglang"]
    assert set_here.status == "ok"


def _version_checks(tmp_path: Path, deployment: Deployment, env: Mapping[str, str]) -> dict[str, Check]:
    """``job_checks`` of a run whose vLLM is the stand-in (``python -m fake_vllm``) as a bare executable."""
    pytest.importorskip("fake_vllm")
    exe = tmp_path / "venv" / "vllm"
    exe.parent.mkdir(parents=True)
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fake_vllm "$@"\n')
    exe.chmod(0o755)
    profile_path, run_path = _files(tmp_path, f"vllm_executable: {exe}\n", "deployments:\n  - model_alias: big\n")
    profile = load_profile(profile_path)
    run = RunFile(name="demo", recipe="recipe.yaml", num_records=10, deployments=(deployment,))
    inputs = PlanInputs(
        run=run, profile=profile, snapshot=ProviderSnapshot(), layout=RunLayout.in_workspace(Path("/ws"), "run-1"),
        recipe_sha256="1" * 64, snapshot_sha256="2" * 64,
    )  # fmt: skip
    facts = ClusterFacts(Slurm(_runner, user="alice"), {"PATH": "/usr/bin", **env}, run_path, profile_path)
    return {c.name: c for c in job_checks(facts, run, profile, compile_plan(inputs), "#!/bin/bash\n")}


def test_doctor_reads_the_engine_version_and_names_the_version_the_run_needs(tmp_path: Path) -> None:
    """Issue 41, point 2: a replica over two nodes (tensor x pipeline parallel) needs vLLM 0.11.1's ``--nnodes``,
    ``--node-rank``, ``--master-addr``, ``--master-port``; doctor (and submit, which refuses its problems) asks the
    profile's vLLM its version on the submit host and says so before any allocation is paid for."""
    two_nodes = Deployment(model_alias="big", model="m", tensor_parallel=4, pipeline_parallel=2)
    check = _version_checks(tmp_path / "old", two_nodes, {"FAKE_VLLM_AS_VLLM": "0.11.0"})["vllm version"]
    assert check.status == "problem" and check.field == "vllm_executable"
    assert check.where == f"{tmp_path / 'old' / 'profile.yaml'}:5:1"
    exe = tmp_path / "old" / "venv" / "vllm"
    assert check.detail.startswith(f"{exe} is vLLM 0.11.0, too old for the run's command lines (--nnodes ")
    assert "--master-port (tensor x pipeline parallel over nodes) needs vLLM >= 0.11.1 (vllm-project/vllm#23691)" in (
        check.detail
    )
    assert check.detail.endswith("install vLLM >= 0.11.1 there")
    ok = _version_checks(tmp_path / "new", two_nodes, {"FAKE_VLLM_AS_VLLM": "0.11.1"})["vllm version"]
    assert ok.status == "ok" and "0.11.1, which has every flag the run's servers use (--uds, --nnodes," in ok.detail
    nightly = _version_checks(tmp_path / "dev", two_nodes, {"FAKE_VLLM_AS_VLLM": "0.11.1rc2.dev12+g1234"})
    assert nightly["vllm version"].status == "skipped"
    assert "pre-release of the version that brought --nnodes" in nightly["vllm version"].detail


def test_data_parallel_with_fewer_server_cpus_than_its_busy_processes_is_warned_at_the_field(tmp_path: Path) -> None:
    """Issue 41, point 6: vLLM runs one API-server process per data-parallel rank (``--api-server-count``'s default
    since 0.16.0) and an engine core per rank, all inside the server step's ``server.cpus``: a submit (and its dry
    run) warns at that field of the run file when they are more; ``--api-server-count 1`` counts."""
    from ddslurm.launcher.submission._prepare import data_parallel_warnings

    profile_path, run_path = _files(
        tmp_path,
        "",
        "deployments:\n  - model_alias: big\n    model: m\n    server:\n      cpus: 4\n",
    )
    profile = load_profile(profile_path)

    def warnings(*deployments: Deployment) -> tuple[str, ...]:
        run = RunFile(name="demo", recipe="recipe.yaml", num_records=10, deployments=deployments)
        inputs = PlanInputs(
            run=run, profile=profile, snapshot=ProviderSnapshot(),
            layout=RunLayout.in_workspace(Path("/ws"), "run-1"), recipe_sha256="1" * 64, snapshot_sha256="2" * 64,
        )  # fmt: skip
        return data_parallel_warnings(compile_plan(inputs), run, run_path, profile_path)

    small = Deployment(model_alias="big", model="m", data_parallel=2)
    dp4 = Deployment(model_alias="big", model="m", data_parallel=4)
    assert warnings(small) == ()  # 2 + 2 on 4 CPUs
    (said,) = warnings(dp4)
    assert said == (
        f"{run_path}:8:7: deployments[0].server.cpus: 4 CPUs for 'big', whose vLLM runs 8 busy processes on its "
        "first node with data_parallel 4 (an API server per data-parallel rank unless server.extra_args sets "
        "--api-server-count, and an engine core per rank there); raise server.cpus to 8, or pass --api-server-count 1"
    )
    one = Deployment(
        model_alias="big", model="m", data_parallel=4, server=ServerSpec(extra_args=("--api-server-count", "1"))
    )
    assert "runs 5 busy processes" in warnings(one)[0]
