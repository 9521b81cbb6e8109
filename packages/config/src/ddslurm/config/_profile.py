"""The cluster profile: what belongs to the cluster rather than to one run."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ddslurm.config._base import Frozen

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class ClusterProfile(Frozen, frozen=True, kw_only=True):
    """Top level of a profile file. Relative paths are relative to the profile file's directory."""

    name: str = "default"
    workspace: str
    python_env: str
    account: str | None = None
    partition: str | None = None
    cpu_partition: str | None = None
    gpus_per_node: NonNegativeInt = 0
    gpu_request: Literal["gres", "gpus"] = "gres"
    memory_per_gpu: str | None = None
    """Host memory asked per GPU (``--mem`` = GPUs x this) when the run file sets no ``submission.memory``."""
    container_runtime: Literal["none", "pyxis", "apptainer"] = "none"
    container_mounts: tuple[str, ...] = ()
    vllm_executable: str = "vllm"
    vllm_image: str | None = None
    extra_sbatch: tuple[str, ...] = ()
