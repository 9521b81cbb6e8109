"""The resolved plan: everything a compute node needs, compiled on the submit host and hashed."""

from __future__ import annotations

from ddslurm.config._base import Frozen
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


class ShardSpec(Frozen, frozen=True, kw_only=True):
    index: int
    first_record: int
    num_records: int


class Plan(Frozen, frozen=True, kw_only=True):
    version: int = PLAN_VERSION
    run_id: str
    run_name: str
    num_records: int
    shards: tuple[ShardSpec, ...]
    resume: ResumeMode
    buffer_size: int
    recipe_file: str
    recipe_sha256: str
    snapshot_file: str
    snapshot_sha256: str
    secret_env: tuple[str, ...]
    python_env: str
    generation: Resources
    collection: Resources
    local_aliases: tuple[str, ...] = ()
