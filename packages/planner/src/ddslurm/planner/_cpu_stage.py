"""A two-stage run's CPU stage: how many shards one CPU-stage allocation runs at once, and how many allocations a
CPU-stage array over some shards needs."""

from __future__ import annotations

from collections.abc import Sequence

from ddslurm.config import Plan, RunFile, StagePlan

HOSTED_CLIENT_CPUS = 1
"""CPUs one CPU-stage client step needs: it runs no model, only waits on hosted ones (docs/performance.md: about
11 ms of CPU per request) and computes expressions."""


def cpu_stage_workers(run: RunFile, stages: Sequence[StagePlan]) -> int:
    """Client steps a CPU-stage allocation runs at once (``Plan.cpu_stage_workers``): as many as its CPUs
    (``submission.cpus``) allow at ``HOSTED_CLIENT_CPUS`` each, at most the shards; 1 for a run of one stage."""
    if len(stages) < 2:
        return 1
    return max(1, min(run.submission.cpus // HOSTED_CLIENT_CPUS, run.shards))


def cpu_stage_tasks(plan: Plan, shards: int, most: int) -> int:
    """Allocations of a CPU-stage array over ``shards`` shards: enough that every shard can run at once at
    ``cpu_stage_workers`` per allocation, at most ``most`` (the GPU-stage array's tasks it follows), at least one."""
    return max(1, min(most, -(-shards // max(1, plan.cpu_stage_workers))))
