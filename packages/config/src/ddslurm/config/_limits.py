"""The scheduler limits a submission must fit in: what the launcher reads from Slurm and the planner plans
arrays within (the planner never asks Slurm itself)."""

from __future__ import annotations

import math

import msgspec

_FINISHED = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
     "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"}
)  # fmt: skip


class QueuedJob(msgspec.Struct, frozen=True):
    """One line of ``squeue -r -t all``: a job or one array task, in any state slurmctld still holds."""

    array_job_id: str
    user: str
    account: str
    qos: str
    state: str
    command: str

    @property
    def active(self) -> bool:
        """Pending, running or suspended: counts against submit limits (finished ones only against MaxJobCount)."""
        return self.state.split()[0] not in _FINISHED if self.state else True


class Limit(msgspec.Struct, frozen=True):
    """A limit on how many jobs (array tasks each count) may exist, and how many count against it now."""

    name: str
    scope: str
    limit: int
    used: int

    def usable(self, headroom: float) -> int:
        """What a submission may use: ``headroom`` of what is left (rounded down), never below 0."""
        return max(0, math.floor(headroom * max(0, self.limit - self.used) + 1e-9))


class SchedulerLimits(msgspec.Struct, frozen=True):
    """Every limit a submission must fit in, read before anything is submitted."""

    max_array_size: int
    limits: tuple[Limit, ...] = ()
    notes: tuple[str, ...] = ()
    """Limits that were not read or do not apply, and why; and limits that only throttle (``MaxJobs``)."""
    queue: tuple[QueuedJob, ...] = ()
    """Every job slurmctld held when the limits were read (``ddslurm submit --continue`` adopts its own)."""


class PartitionNodes(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU nodes of the generation partition as ``sinfo`` lists them: what the planner fits a layout's
    allocations in (a node must hold one allocation's CPUs; the partition's nodes bound how many run at once)."""

    partition: str
    nodes: int
    """Nodes of the partition with at least one GPU."""
    cpus: int
    """CPUs of the smallest of them (what any allocation may count on)."""
    gpus: int
    """GPUs of the one with the fewest."""
    memory_mb: int = 0
    """Memory (MB) of the one with the least; 0: not known (sinfo listed none)."""
