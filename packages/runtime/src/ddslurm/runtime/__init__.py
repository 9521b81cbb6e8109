"""ddslurm.runtime: runs on compute nodes; reads only the plan and the snapshot, never the submitter's home.

The names below are imported when first used (as Data Designer's own packages do): a step that proxies requests or
answers ``inspect`` does not pay for the engine, pyarrow and the serving code it never runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddslurm.config import lazy_exports

if TYPE_CHECKING:
    from ddslurm.runtime._attempt import AttemptRunner
    from ddslurm.runtime._attempt_record import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL
    from ddslurm.runtime._columns import recipe_columns
    from ddslurm.runtime._dd_version import installed_versions
    from ddslurm.runtime._engine import (
        EngineRequest,
        EngineResult,
        engine_environment,
        mcp_providers,
        run_engine,
        seed_reader,
    )
    from ddslurm.runtime._engine_flags import FLAG_VERSIONS, check_serving, data_parallel_cpus, refusal_text
    from ddslurm.runtime._inputs import Inputs, load_inputs
    from ddslurm.runtime._inspect import NODE_DISTRIBUTIONS, answer_inspect, read_request
    from ddslurm.runtime._listeners import unix_url
    from ddslurm.runtime._plugins import PLUGIN_GROUP
    from ddslurm.runtime._ports import draw_port, listening_ports
    from ddslurm.runtime._resume import ResumeSource, next_resume
    from ddslurm.runtime._scratch import pid_alive
    from ddslurm.runtime._server_command import (
        RankPlace,
        ServerCommand,
        engine_version,
        server_command,
        server_step_name,
    )
    from ddslurm.runtime._serving import PortUnavailableError
    from ddslurm.runtime._steps import StepSpec, srun_argv
    from ddslurm.runtime._verify import make_private, scan_for_secrets, verify_dataset
    from ddslurm.runtime.errors import EngineError, InputsError, RuntimeFailure, SecretMissingError, VerificationError

_LAZY_IMPORTS: dict[str, str] = {
    "AttemptRunner": "ddslurm.runtime._attempt",
    "EXIT_FAILED": "ddslurm.runtime._attempt_record",
    "EXIT_OK": "ddslurm.runtime._attempt_record",
    "EXIT_PARTIAL": "ddslurm.runtime._attempt_record",
    "EngineError": "ddslurm.runtime.errors",
    "FLAG_VERSIONS": "ddslurm.runtime._engine_flags",
    "EngineRequest": "ddslurm.runtime._engine",
    "EngineResult": "ddslurm.runtime._engine",
    "Inputs": "ddslurm.runtime._inputs",
    "InputsError": "ddslurm.runtime.errors",
    "NODE_DISTRIBUTIONS": "ddslurm.runtime._inspect",
    "PLUGIN_GROUP": "ddslurm.runtime._plugins",
    "PortUnavailableError": "ddslurm.runtime._serving",
    "RankPlace": "ddslurm.runtime._server_command",
    "ResumeSource": "ddslurm.runtime._resume",
    "RuntimeFailure": "ddslurm.runtime.errors",
    "SecretMissingError": "ddslurm.runtime.errors",
    "ServerCommand": "ddslurm.runtime._server_command",
    "StepSpec": "ddslurm.runtime._steps",
    "VerificationError": "ddslurm.runtime.errors",
    "answer_inspect": "ddslurm.runtime._inspect",
    "check_serving": "ddslurm.runtime._engine_flags",
    "data_parallel_cpus": "ddslurm.runtime._engine_flags",
    "draw_port": "ddslurm.runtime._ports",
    "engine_environment": "ddslurm.runtime._engine",
    "engine_version": "ddslurm.runtime._server_command",
    "installed_versions": "ddslurm.runtime._dd_version",
    "listening_ports": "ddslurm.runtime._ports",
    "load_inputs": "ddslurm.runtime._inputs",
    "make_private": "ddslurm.runtime._verify",
    "mcp_providers": "ddslurm.runtime._engine",
    "next_resume": "ddslurm.runtime._resume",
    "pid_alive": "ddslurm.runtime._scratch",
    "read_request": "ddslurm.runtime._inspect",
    "recipe_columns": "ddslurm.runtime._columns",
    "refusal_text": "ddslurm.runtime._engine_flags",
    "run_engine": "ddslurm.runtime._engine",
    "scan_for_secrets": "ddslurm.runtime._verify",
    "seed_reader": "ddslurm.runtime._engine",
    "server_command": "ddslurm.runtime._server_command",
    "server_step_name": "ddslurm.runtime._server_command",
    "srun_argv": "ddslurm.runtime._steps",
    "unix_url": "ddslurm.runtime._listeners",
    "verify_dataset": "ddslurm.runtime._verify",
}
"""Each exported name and the module that defines it."""

__all__ = [
    "AttemptRunner",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EngineError",
    "EngineRequest",
    "EngineResult",
    "FLAG_VERSIONS",
    "Inputs",
    "InputsError",
    "NODE_DISTRIBUTIONS",
    "PLUGIN_GROUP",
    "PortUnavailableError",
    "RankPlace",
    "ResumeSource",
    "RuntimeFailure",
    "SecretMissingError",
    "ServerCommand",
    "StepSpec",
    "VerificationError",
    "answer_inspect",
    "check_serving",
    "data_parallel_cpus",
    "draw_port",
    "engine_environment",
    "engine_version",
    "installed_versions",
    "listening_ports",
    "load_inputs",
    "make_private",
    "mcp_providers",
    "next_resume",
    "pid_alive",
    "read_request",
    "recipe_columns",
    "refusal_text",
    "run_engine",
    "scan_for_secrets",
    "seed_reader",
    "server_command",
    "server_step_name",
    "srun_argv",
    "unix_url",
    "verify_dataset",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY_IMPORTS, __all__)
