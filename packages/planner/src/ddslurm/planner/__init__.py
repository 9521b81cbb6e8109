"""ddslurm.planner: a pure compiler from run file, recipe, snapshot and profile to an immutable plan."""

from ddslurm.planner._compile import (
    VLLM_DEFAULT_MAX_NUM_SEQS,
    Allocations,
    PlanInputs,
    compile_plan,
    parse_memory_mb,
    parse_time_limit,
    plan_allocations,
    plan_serving,
    server_capacity,
)
from ddslurm.planner._shards import SeedPool, plan_shards
from ddslurm.planner.errors import PlanError

__all__ = [
    "VLLM_DEFAULT_MAX_NUM_SEQS",
    "Allocations",
    "PlanError",
    "PlanInputs",
    "SeedPool",
    "compile_plan",
    "parse_memory_mb",
    "parse_time_limit",
    "plan_allocations",
    "plan_serving",
    "plan_shards",
    "server_capacity",
]
