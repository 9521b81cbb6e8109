"""The resolved plan: everything a compute node needs, compiled on the submit host and hashed."""

from __future__ import annotations

from typing import Literal

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._layout import LAYOUT_VERSION
from ddslurm.config._runfile import ResumeMode

PLAN_VERSION = 1


class Resources(Frozen, frozen=True, kw_only=True):
    """One Slurm job's request. ``gres == "none"`` asks for a CPU-only allocation."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_minutes: int
    nodes: int = 1
    cpus_per_task: int = 1
    memory: str | None = None
    gres: str = "none"
    gpus: int | None = None
    constraint: str | None = None
    reservation: str | None = None
    extra_sbatch: tuple[str, ...] = ()


class ReplicaPlan(Frozen, frozen=True, kw_only=True):
    """One vLLM server process: ``gpus`` GPUs (its tensor-parallel size) in its own srun step."""

    index: int
    gpus: int
    cpus: int
    port: int | None = None


class DeploymentPlan(Frozen, frozen=True, kw_only=True):
    alias: str
    model: str
    served_model_name: str
    tensor_parallel: int
    replicas: tuple[ReplicaPlan, ...]
    startup_timeout: int
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    proxy: bool = False
    """Whether the alias's endpoint is a balancing proxy (more than one replica) or the replica itself."""


class ServingPlan(Frozen, frozen=True, kw_only=True):
    """Everything needed to start the run's model servers inside the allocation."""

    deployments: tuple[DeploymentPlan, ...]
    gpus: int
    gpu_request: Literal["gres", "gpus"] = "gres"
    container_runtime: Literal["none", "pyxis", "apptainer"] = "none"
    vllm_executable: str = "vllm"
    vllm_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    proxy_cpus: int = 1


class ShardSpec(Frozen, frozen=True, kw_only=True):
    index: int
    first_record: int
    num_records: int


class Plan(Frozen, frozen=True, kw_only=True):
    version: int = PLAN_VERSION
    layout_version: int = LAYOUT_VERSION
    """The run-directory layout the run was created with (``ddslurm.config._layout``)."""
    run_id: str
    run_name: str
    num_records: int
    shards: tuple[ShardSpec, ...]
    resume: ResumeMode
    buffer_size: int
    max_concurrent: int | None = None
    retries: int = 0
    client_retries: int = 1
    recipe_file: str
    recipe_sha256: str
    snapshot_file: str
    snapshot_sha256: str
    seed_file: str | None = None
    """The recipe's local seed dataset, copied into the run's inputs (the recipe points at the copy)."""
    seed_sha256: str | None = None
    secret_env: tuple[str, ...]
    python_env: str
    generation: Resources
    collection: Resources
    client_cpus: int = 1
    serving: ServingPlan | None = None
    """None for hosted-only runs: no GPU discovery, servers, containers or proxies at all."""
    max_empty_outputs: int | None = 0
    """Empty or null values each LLM column of a shard may hold (the run file's ``max_empty_outputs``)."""
