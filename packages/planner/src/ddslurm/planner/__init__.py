"""ddslurm.planner: a pure compiler from run file, recipe, snapshot and profile to an immutable plan, and from a plan
and the scheduler's limits to the arrays that submit it."""

from ddslurm.planner._allocations import Allocations, Layout, plan_allocations, plan_layout
from ddslurm.planner._arrays import array_spec, array_tasks, failure_chain, plan_arrays, pulling_tasks
from ddslurm.planner._batches import (
    CHECKPOINT_S,
    CHECKPOINTS_PER_SHARD,
    batch_text,
    batch_warnings,
    plan_batches,
    wall_text,
)
from ddslurm.planner._compile import PlanInputs, calibration_levels_of, client_serving, compile_plan
from ddslurm.planner._cost import CostSources, model_uses
from ddslurm.planner._fit import Overrun, allocation_start_s, overruns, plan_warnings
from ddslurm.planner._limits import (
    HEADROOM,
    SubmissionPlan,
    describe_limit,
    limit_checks,
    plan_submission,
    plural,
    refuse_if_over,
)
from ddslurm.planner._serving_plan import VLLM_DEFAULT_MAX_NUM_SEQS, plan_serving, server_capacity
from ddslurm.planner._shards import plan_shards
from ddslurm.planner._slurm_units import parse_memory_mb, parse_time_limit
from ddslurm.planner._stages import Staging, plan_stages
from ddslurm.planner.errors import LimitError, PlanError

__all__ = [
    "CHECKPOINTS_PER_SHARD",
    "CHECKPOINT_S",
    "HEADROOM",
    "VLLM_DEFAULT_MAX_NUM_SEQS",
    "Allocations",
    "CostSources",
    "Layout",
    "Overrun",
    "LimitError",
    "PlanError",
    "PlanInputs",
    "Staging",
    "SubmissionPlan",
    "allocation_start_s",
    "array_spec",
    "array_tasks",
    "batch_text",
    "batch_warnings",
    "calibration_levels_of",
    "client_serving",
    "compile_plan",
    "describe_limit",
    "failure_chain",
    "limit_checks",
    "model_uses",
    "overruns",
    "parse_memory_mb",
    "parse_time_limit",
    "plan_allocations",
    "plan_layout",
    "plan_arrays",
    "plan_batches",
    "plan_serving",
    "plan_shards",
    "plan_stages",
    "plan_submission",
    "plan_warnings",
    "plural",
    "pulling_tasks",
    "refuse_if_over",
    "server_capacity",
    "wall_text",
]
