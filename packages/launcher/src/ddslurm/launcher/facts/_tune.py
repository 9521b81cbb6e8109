"""``ddslurm tune RUN.yaml``: a short calibration run of the run file's recipe and deployments that measures each
model shape (its load time, its throughput at 1, 2, 4 ... its capacity in flight) and the recipe (requests per
record, the client's CPU per request), and records them in the workspace's facts.

    the run file ─► the calibration run file (name <name>-tune, N records, one shard, one allocation, one client
    worker, one stage, no retries) ─► submit (the same checks, secrets and profile as a submit) with
    Plan.calibrate ─► wait ─► calibration.json + client.out + client-usage.json ─► facts.json
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from ddslurm.config import (
    Facts,
    ModelFact,
    RunFile,
    RunLayout,
    calibration_file,
    facts_path,
    load_run_file,
    update_facts,
)
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import UsageError
from ddslurm.launcher.facts._fact_check import beside
from ddslurm.launcher.facts._tune_facts import TuneFailedError, TuneResult, calibration_attempt, tune_result
from ddslurm.launcher.report._model import FactMeasured
from ddslurm.launcher.runs._follow import SchedulerBusy, wait_for_run
from ddslurm.launcher.runs._status_model import RunStatus
from ddslurm.launcher.submission._submit import submit
from ddslurm.planner import model_uses

DEFAULT_RECORDS = 64
"""Records of a calibration run unless ``--records`` says otherwise (at most the run file's): enough for the
proxies to record the recipe's requests (at most 256 per alias) and for requests per record to settle; the
sweep itself replays the recorded requests, as many as each level needs."""
TUNE_SUFFIX = "-tune"


def _absolute_recipe(recipe: str, base: Path) -> str:
    """The run file's ``recipe`` made absolute against ``base`` (the run file's directory): a file, or a script's
    ``file:function``; a ``module:function`` stays as it is."""
    if (base / recipe).exists():
        return str((base / recipe).resolve())
    head, sep, tail = recipe.rpartition(":")
    if sep and (base / head).is_file():
        return f"{(base / head).resolve()}:{tail}"
    return recipe


def tune_run_file(run: RunFile, run_path: Path, records: int | None) -> RunFile:
    """The calibration run of ``run``: the same recipe, deployments and submission, ``records`` records (default
    :data:`DEFAULT_RECORDS`, never more than the run's), one shard in one allocation with one client worker, one
    stage, no retries, no GPU budget or deadline to plan for."""
    if records is not None and records < 1:
        raise UsageError(f"--records must be at least 1, got {records}")
    if not run.deployments:
        raise UsageError(
            f"{run_path}: the run has no deployments: tune measures model servers, a hosted-only run has none"
        )
    return msgspec.structs.replace(
        run,
        name=f"{run.name}{TUNE_SUFFIX}"[:64],
        recipe=_absolute_recipe(run.recipe, run_path.parent),
        num_records=min(records or DEFAULT_RECORDS, run.num_records),
        shards=1,
        allocations=1,
        client_workers=1,
        stages="single",
        retries=0,
        gpus=None,
        deadline=None,
    )


def await_calibration(
    layout: RunLayout,
    slurm: Slurm,
    job_ids: Sequence[str],
    *,
    sleep: Callable[[float], None],
    limit_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """After the run's attempt ended (what ``wait`` follows), until its allocation has written the calibration,
    failed the attempt, or ended (no longer in the queue), at most ``limit_s``: the sweep runs after the attempt
    has recorded its result, before the teardown."""
    deadline = clock() + limit_s
    while clock() < deadline:
        record, serving_dir = calibration_attempt(layout)
        if calibration_file(serving_dir).exists() or record.state == "failed":
            return
        if not slurm.squeue(job_ids):
            return
        sleep(1.0)


def tune(
    run_path: Path,
    profile_path: Path,
    *,
    slurm: Slurm,
    env: Mapping[str, str],
    records: int | None = None,
    on_update: Callable[[RunStatus | SchedulerBusy], None] | None = None,
    on_submitted: Callable[[Path], None] | None = None,
    sleep: Callable[[float], None] | None = None,
    timeout: float | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> tuple[TuneResult, Facts]:
    """Submit the calibration run, wait for it, and record what it measured in the workspace's facts; returns
    what it measured and the facts written. :class:`TuneFailedError` (facts unchanged) when it measured nothing."""
    derived = tune_run_file(load_run_file(run_path), run_path, records)
    scratch = Path(tempfile.mkdtemp(prefix="ddslurm-tune-"))
    try:
        tune_path = scratch / run_path.name
        tune_path.write_bytes(msgspec.json.encode(derived))  # JSON is YAML: the run file loader reads it
        done = submit(tune_path, profile_path, slurm=slurm, env=env, clock=clock, calibration=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if on_submitted is not None:
        on_submitted(done.layout.root)
    waiting = {} if sleep is None else {"sleep": sleep}
    wait_for_run(done.layout, slurm, timeout=timeout, on_update=on_update, **waiting)
    limit_s = done.plan.generation.time_minutes * 60.0
    await_calibration(done.layout, slurm, done.job_ids or (done.job_id,), sleep=sleep or time.sleep, limit_s=limit_s)
    result = tune_result(done.layout, done.plan, clock().isoformat())
    workspace = done.layout.root.parent.parent

    compared: list[FactMeasured] = []

    def change(facts: Facts) -> Facts:
        compared.clear()
        for alias, fact in result.models:
            compared.extend(planned_beside(facts.model(fact.shape), alias, fact))
            facts = facts.with_model(fact)
        return facts.with_recipe(result.recipe)

    if not result.models:
        raise TuneFailedError(f"the calibration run measured no deployment; run dir: {done.layout.root}")
    written = update_facts(facts_path(workspace), change)
    return dataclasses.replace(result, compared=tuple(compared)), written


def planned_beside(earlier: ModelFact | None, alias: str, measured: ModelFact) -> list[FactMeasured]:
    """What the planner would have used for ``measured``'s shape before it (``earlier``: the workspace's fact, or
    None) at the capacity and engine flags it was measured with, beside it: model load and replica rate."""
    subject = f"{alias}:{measured.shape.key()}"
    load, rate = model_uses(earlier, subject, measured.capacity, measured.flags)
    return [beside(load, measured.load_s), beside(rate, measured.requests_per_s)]
