"""What a finished ``ddslurm tune`` run measured, as workspace facts: per deployment a :class:`ModelFact` (its
shape, load time, throughput at its capacity and the sweep), for the recipe a :class:`RecipeFact` (requests per
record per alias, the client's CPU-seconds per request)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddslurm.config import (
    AttemptRecord,
    Calibration,
    CalibrationEntry,
    ClientUsage,
    ConfigError,
    DeploymentPlan,
    ModelFact,
    ModelShape,
    Plan,
    RecipeFact,
    RunLayout,
    calibration_file,
    engine_flags,
    read_json,
)
from ddslurm.launcher.errors import LauncherError
from ddslurm.launcher.report import parse_client_out
from ddslurm.launcher.report._model import FactMeasured


class TuneFailedError(LauncherError):
    """The calibration run ended without a calibration: its attempt's reason, and where to look."""


@dataclass(frozen=True, slots=True)
class TuneResult:
    run_id: str
    run_dir: str
    models: tuple[tuple[str, ModelFact], ...]
    """Per alias, what its replica measured."""
    recipe: RecipeFact
    compared: tuple[FactMeasured, ...] = ()
    """Per alias, the model load and rate the planner would have used before this calibration (the workspace's
    facts at its capacity and engine flags, or the defaults) beside what it measured."""


def calibration_attempt(layout: RunLayout) -> tuple[AttemptRecord, Path]:
    """The calibration run's attempt (its one shard's latest) and its serving directory (the pulling allocation's,
    or the attempt's own). :class:`TuneFailedError` when it never began."""
    attempts = sorted(layout.shard(0).attempts.glob("attempt-*/attempt.json"), key=lambda p: p.stat().st_mtime)
    if not attempts:
        raise TuneFailedError(f"the calibration run began no attempt; see ddslurm status {layout.root}")
    record = read_json(attempts[-1], AttemptRecord)
    return record, Path(record.allocation) if record.allocation else attempts[-1].parent


def read_calibration(layout: RunLayout) -> tuple[AttemptRecord, Calibration]:
    """The calibration its allocation wrote; :class:`TuneFailedError` with the attempt's reason when none was."""
    record, serving_dir = calibration_attempt(layout)
    try:
        return record, read_json(calibration_file(serving_dir), Calibration)
    except (FileNotFoundError, ConfigError):
        why = f"{record.reason}: {record.message}" if record.reason else f"the attempt ended {record.state}"
        raise TuneFailedError(
            f"the calibration run measured nothing ({why}); run dir: {layout.root} (ddslurm logs {layout.root})"
        ) from None


def model_fact(dep: DeploymentPlan, entry: CalibrationEntry, plan: Plan, measured_at: str) -> ModelFact:
    """The fact of one deployment's shape: its throughput is the sweep's at the capacity, or its best if higher."""
    capacity = dep.capacity or max(p.in_flight for p in entry.sweep)
    at_capacity = next((p.requests_per_s for p in entry.sweep if p.in_flight == capacity), 0.0)
    best = max(p.requests_per_s for p in entry.sweep)
    shape = ModelShape.of(dep, plan.gpu_type)
    return ModelFact(
        shape=shape,
        load_s=entry.load_s,
        requests_per_s=max(at_capacity, best),
        capacity=capacity,
        flags=engine_flags(dep.extra_args),
        sweep=entry.sweep,
        measured_by="tune",
        run_id=plan.run_id,
        measured_at=measured_at,
    )


def alias_requests(client_out: str) -> dict[str, int]:
    """Per model alias, the requests that succeeded as Data Designer's usage summaries in ``client.out`` count
    them (health checks are not in them), summed over its summaries."""
    parsed = parse_client_out(client_out)
    out: dict[str, int] = {}
    for usage in parsed.usage:
        alias = parsed.aliases.get(usage.model, (usage.model, None))[0]
        out[alias] = out.get(alias, 0) + usage.successful
    return out


def recipe_fact(plan: Plan, record: AttemptRecord, attempt_dir: Path, measured_at: str) -> RecipeFact:
    """Requests per record per alias (the usage summaries over the attempt's rows) and the client's CPU-seconds
    per request to a deployed alias (its ``client-usage.json``; None when it wrote none)."""
    try:
        text = (attempt_dir / "client.out").read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    requests = alias_requests(text)
    rows = record.rows or sum(s.num_records for s in plan.shards)
    deployed = {d.alias for d in plan.serving.deployments} if plan.serving else set()
    to_deployed = sum(n for alias, n in requests.items() if alias in deployed)
    cpu: float | None = None
    try:
        usage = read_json(attempt_dir / "client-usage.json", ClientUsage)
        cpu = round(usage.cpu_s / to_deployed, 6) if to_deployed else None
    except (FileNotFoundError, ConfigError):
        pass
    return RecipeFact(
        recipe_sha256=plan.recipe_facts_key(),
        requests_per_record={alias: round(n / rows, 4) for alias, n in sorted(requests.items())},
        client_cpu_s_per_request=cpu,
        measured_by="tune",
        run_id=plan.run_id,
        measured_at=measured_at,
    )


def tune_result(layout: RunLayout, plan: Plan, measured_at: str) -> TuneResult:
    """The facts of a finished calibration run (:class:`TuneFailedError` when it measured nothing)."""
    record, calibration = read_calibration(layout)
    deployments = {d.alias: d for d in plan.serving.deployments} if plan.serving else {}
    models = tuple(
        (e.alias, model_fact(deployments[e.alias], e, plan, measured_at))
        for e in calibration.entries
        if e.alias in deployments and e.sweep
    )
    attempt_dir = layout.shard(0).attempt(record.attempt).dir
    return TuneResult(layout.run_id, str(layout.root), models, recipe_fact(plan, record, attempt_dir, measured_at))
