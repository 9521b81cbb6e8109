"""``ddslurm doctor --profile P [RUN_FILE]`` without the terminal: the profile's checks against this cluster
(:mod:`ddslurm.launcher.cluster._doctor_checks`), every one reported, and with a run file the run compiled as ``submit
--dry-run`` would compile it and its jobs checked too. ``submit`` and its dry run refuse what this finds
(``_doctor_checks.check_profile_first`` before the inputs are prepared, then ``check_jobs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddslurm.launcher.cluster._doctor_checks import Check, ClusterFacts, job_checks, profile_checks
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import LauncherError
from ddslurm.launcher.submission._dry_run import compile_dry_run
from ddslurm.launcher.submission._inputs import read_inputs, read_profile


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """Every check of the profile (and of the run's jobs, with a run file), in the order they ran."""

    profile: Path
    run_file: Path | None
    checks: tuple[Check, ...]

    @property
    def problems(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "problem")

    def as_dict(self) -> dict[str, Any]:
        """What ``doctor --json`` prints."""
        return {
            "profile": str(self.profile),
            "run_file": None if self.run_file is None else str(self.run_file),
            "ok": not self.problems,
            "problems": len(self.problems),
            "checks": [
                {"name": c.name, "status": c.status, "field": c.field, "where": c.where, "detail": c.detail}
                for c in self.checks
            ],
        }


def doctor(
    profile_path: Path,
    run_path: Path | None = None,
    *,
    slurm: Slurm,
    env: Mapping[str, str],
    host: EngineHost = RUNTIME_PROCESS,
) -> DoctorReport:
    """Check ``profile_path`` against this cluster and, with ``run_path``, the run's jobs; every check is in the
    report (nothing is refused: the caller says what to do with the problems). The run is compiled as ``submit
    --dry-run`` compiles it (a builder script runs in ``python_env``); what refuses it is one problem of the
    report."""
    if run_path is None:
        text, profile = read_profile(profile_path)
        facts = ClusterFacts(slurm, env, None, profile_path, host, text)
        return DoctorReport(profile_path, None, tuple(profile_checks(facts, profile, None)))
    inputs = read_inputs(run_path, profile_path)  # read once: the checks and the compilation see the same files
    run, profile = inputs.run, inputs.profile
    facts = ClusterFacts(slurm, env, run_path, profile_path, host, inputs.profile_text)
    checks = profile_checks(facts, profile, run)
    if any(c.status == "problem" for c in checks):
        checks.append(Check("run file", "skipped", "the profile's problems come first (above)"))
        return DoctorReport(profile_path, run_path, tuple(checks))
    try:
        prepared, _, script = compile_dry_run(inputs, slurm=slurm, env=env, host=host)
    except LauncherError as exc:
        checks.append(Check("run file", "problem", str(exc)))
        return DoctorReport(profile_path, run_path, tuple(checks))
    checks.append(Check("run file", "ok", f"compiles: {len(prepared.plan.shards)} shard(s)"))
    checks += job_checks(facts, run, profile, prepared.plan, script)
    return DoctorReport(profile_path, run_path, tuple(checks))
