"""ddslurm.runtime: runs on compute nodes; reads only the plan and the snapshot, never the submitter's home."""

from ddslurm.runtime._attempt import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, AttemptRunner
from ddslurm.runtime._columns import recipe_columns
from ddslurm.runtime._engine import (
    EngineRequest,
    EngineResult,
    engine_environment,
    mcp_providers,
    run_engine,
    seed_reader,
)
from ddslurm.runtime._inputs import Inputs, load_inputs
from ddslurm.runtime._inspect import NODE_DISTRIBUTIONS, answer_inspect, installed_versions
from ddslurm.runtime._listeners import unix_url
from ddslurm.runtime._plugins import PLUGIN_GROUP
from ddslurm.runtime._scratch import pid_alive
from ddslurm.runtime._serving import RankPlace, ServerCommand, server_command, server_step_name
from ddslurm.runtime._steps import StepSpec, srun_argv
from ddslurm.runtime._verify import make_private, scan_for_secrets, verify_dataset
from ddslurm.runtime.errors import (
    EngineError,
    InputsError,
    RuntimeFailure,
    SecretMissingError,
    VerificationError,
)

__all__ = [
    "NODE_DISTRIBUTIONS",
    "PLUGIN_GROUP",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "AttemptRunner",
    "answer_inspect",
    "EngineError",
    "EngineRequest",
    "EngineResult",
    "Inputs",
    "InputsError",
    "RankPlace",
    "RuntimeFailure",
    "SecretMissingError",
    "ServerCommand",
    "StepSpec",
    "VerificationError",
    "engine_environment",
    "installed_versions",
    "mcp_providers",
    "pid_alive",
    "load_inputs",
    "make_private",
    "recipe_columns",
    "seed_reader",
    "run_engine",
    "server_command",
    "server_step_name",
    "srun_argv",
    "unix_url",
    "scan_for_secrets",
    "verify_dataset",
]
