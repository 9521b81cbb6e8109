"""Where the servers download models and keep their caches (``ddslurm.runtime._engine_cache``): the profile's
``engine_cache`` or node-local scratch, every cache variable an engine reads pointing into it unless the job sets
it, the same path mounted into Pyxis and Apptainer containers, and only ever a directory of the user's own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ddslurm.config import ClusterProfile, DeploymentPlan, ReplicaPlan, ServingPlan
from ddslurm.config._convert import Refusals
from ddslurm.runtime import server_command
from ddslurm.runtime._engine_cache import cache_environment, engine_cache_dir, ensure_engine_cache
from ddslurm.runtime.errors import EngineCacheError

CACHE = Path("/scratch/me/engine-cache")


def _serving(engine: str, runtime: str, **kw: object) -> tuple[ServingPlan, DeploymentPlan]:
    dep = DeploymentPlan(
        alias="gen", model="org/model", served_model_name="s", engine=engine, tensor_parallel=1,
        replicas=(ReplicaPlan(index=0, gpus=1, cpus=1),), startup_timeout=60,
    )  # fmt: skip
    serving = ServingPlan(
        deployments=(dep,), gpus=1, container_runtime=runtime, vllm_image="vimg", sglang_image="simg",
        container_mounts=("/models:/models",), **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return serving, dep


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_pyxis_container_mounts_the_cache_at_the_same_path(engine: str) -> None:
    serving, dep = _serving(engine, "pyxis")
    cmd = server_command(serving, dep, "http://127.0.0.1:8100", None, CACHE)
    assert f"--container-mounts=/models:/models,{CACHE}:{CACHE}" in cmd.srun_extra
    assert "--no-container-mount-home" in cmd.srun_extra


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_apptainer_binds_the_cache_and_a_bare_server_needs_no_mount(engine: str) -> None:
    serving, dep = _serving(engine, "apptainer")
    boxed = server_command(serving, dep, "http://127.0.0.1:8100", None, CACHE)
    assert boxed.argv[:5] == ("apptainer", "exec", "--nv", "--bind=/models:/models", f"--bind={CACHE}:{CACHE}")
    serving, dep = _serving(engine, "none")
    bare = server_command(serving, dep, "http://127.0.0.1:8100", None, CACHE)
    assert str(CACHE) not in " ".join(bare.argv) and bare.srun_extra == ()


def test_every_cache_variable_points_into_the_cache_unless_the_job_sets_it() -> None:
    env = cache_environment(CACHE, {"HF_HOME": "/models/hf", "TRITON_CACHE_DIR": ""})
    assert env == {
        "XDG_CACHE_HOME": str(CACHE),
        "VLLM_CACHE_ROOT": f"{CACHE}/vllm",
        "TRITON_CACHE_DIR": f"{CACHE}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/torchinductor",
        "FLASHINFER_WORKSPACE_BASE": f"{CACHE}/flashinfer",
        "CUDA_CACHE_PATH": f"{CACHE}/nv-compute-cache",
    }  # HF_HOME is the user's


def test_the_default_is_node_local_scratch_and_the_profile_wins(tmp_path: Path) -> None:
    serving, _ = _serving("vllm", "pyxis")
    assert engine_cache_dir(serving, {"TMPDIR": str(tmp_path)}, uid=1234) == tmp_path / "ddslurm-engine-cache-1234"
    assert engine_cache_dir(serving, {}, uid=1234) == Path("/tmp/ddslurm-engine-cache-1234")
    assert engine_cache_dir(serving, {"TMPDIR": "relative"}, uid=7) == Path("/tmp/ddslurm-engine-cache-7")
    chosen, _ = _serving("vllm", "pyxis", engine_cache=str(CACHE))
    assert engine_cache_dir(chosen, {"TMPDIR": str(tmp_path)}) == CACHE


def test_a_bare_engine_keeps_its_home_caches_unless_the_profile_names_one(tmp_path: Path) -> None:
    """Bare executables see the user's home (models downloaded to a shared home, a saved hub token): no default
    engine cache for them; the profile's ``engine_cache`` still applies."""
    bare, _ = _serving("vllm", "none")
    assert engine_cache_dir(bare, {"TMPDIR": str(tmp_path)}, uid=1234) is None
    chosen, _ = _serving("vllm", "none", engine_cache=str(CACHE))
    assert engine_cache_dir(chosen, {"TMPDIR": str(tmp_path)}) == CACHE


@pytest.mark.parametrize("value", ["relative/cache", "/a:b", "/a,b", "/a b"])
def test_the_profile_refuses_a_path_a_mount_list_cannot_carry(value: str) -> None:
    with pytest.raises(Refusals, match="engine_cache"):
        ClusterProfile(workspace="/w", python_env="/p", engine_cache=value)
    assert ClusterProfile(workspace="/w", python_env="/p", engine_cache="/scratch/me/c").engine_cache == "/scratch/me/c"


def test_the_cache_is_made_owner_only_and_only_the_users_own_is_taken(tmp_path: Path) -> None:
    made = tmp_path / "base" / "cache"
    ensure_engine_cache(made)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    ensure_engine_cache(made)  # there already, and the user's own
    made.chmod(0o777)
    with pytest.raises(EngineCacheError, match="writable by others"):
        ensure_engine_cache(made)
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(EngineCacheError, match="symbolic link"):
        ensure_engine_cache(link)
    (tmp_path / "file").write_text("")
    with pytest.raises(EngineCacheError):
        ensure_engine_cache(tmp_path / "file")
    if os.getuid() == 0:  # another user's directory (only root can make one here)
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(EngineCacheError, match="belongs to uid 65534"):
            ensure_engine_cache(theirs)
