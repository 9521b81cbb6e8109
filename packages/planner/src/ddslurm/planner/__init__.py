"""ddslurm.planner: a pure compiler from run file, recipe, snapshot and profile to an immutable plan."""

from ddslurm.planner._compile import (
    Allocations,
    PlanInputs,
    compile_plan,
    parse_memory_mb,
    parse_time_limit,
    plan_allocations,
    plan_serving,
)
from ddslurm.planner._shards import SeedPool, plan_shards
from ddslurm.planner.errors import PlanError

__all__ = [
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
]
