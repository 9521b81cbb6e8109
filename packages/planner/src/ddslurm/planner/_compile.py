"""Pure compilation of run file + recipe + snapshot + profile into an immutable, hashed plan."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ddslurm.config import ClusterProfile, Plan, ProviderSnapshot, Resources, RunFile, RunLayout, ShardSpec
from ddslurm.planner.errors import PlanError

_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


def parse_time_limit(value: str | int) -> int:
    """Slurm time formats to whole minutes (rounded up, as Slurm does): ``90``, ``1:30:00``, ``2-00:00:00``."""
    if isinstance(value, int):
        if value < 1:
            raise PlanError(f"time limit must be at least 1 minute, got {value}")
        return value
    match = _TIME.match(value.strip())
    if not match:
        raise PlanError(f"time limit {value!r} is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)")
    days = int(match.group("days") or 0)
    parts = [int(p) for p in (match.group("a"), match.group("b"), match.group("c")) if p is not None]
    if match.group("days") is not None:
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = 0, parts[0], 0
    total = days * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)
    if total < 1:
        raise PlanError(f"time limit {value!r} is shorter than one minute")
    return total


def split_records(num_records: int, shards: int) -> tuple[ShardSpec, ...]:
    """Contiguous record ranges whose sizes differ by at most one."""
    if shards < 1:
        raise PlanError(f"shards must be at least 1, got {shards}")
    if shards > num_records:
        raise PlanError(f"shards ({shards}) exceeds num_records ({num_records}); every shard needs a record")
    base, extra = divmod(num_records, shards)
    specs: list[ShardSpec] = []
    first = 0
    for index in range(shards):
        size = base + (1 if index < extra else 0)
        specs.append(ShardSpec(index=index, first_record=first, num_records=size))
        first += size
    return tuple(specs)


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything the compiler reads; digests are of the copies stored in the run's inputs."""

    run: RunFile
    profile: ClusterProfile
    snapshot: ProviderSnapshot
    layout: RunLayout
    recipe_sha256: str
    snapshot_sha256: str


def compile_plan(inputs: PlanInputs) -> Plan:
    run, profile = inputs.run, inputs.profile
    if run.deployments:
        raise PlanError(
            f"run {run.name!r} declares {len(run.deployments)} local deployment(s); serving local models inside "
            "the job is not available in this version yet. Use hosted providers (model_providers.yaml) for now."
        )
    sub = run.submission
    generation = Resources(
        partition=sub.partition or profile.cpu_partition or profile.partition,
        account=sub.account or profile.account,
        qos=sub.qos,
        time_minutes=parse_time_limit(sub.time_limit),
        cpus_per_task=sub.cpus,
        memory=sub.memory,
        gres="none",
        constraint=sub.constraint,
        reservation=sub.reservation,
        extra_sbatch=(*profile.extra_sbatch, *sub.extra_sbatch),
    )
    col = run.collection
    collection = Resources(
        partition=col.partition or profile.cpu_partition or profile.partition,
        account=sub.account or profile.account,
        time_minutes=parse_time_limit(col.time_limit),
        cpus_per_task=col.cpus,
        memory=col.memory,
        gres="none",
        extra_sbatch=profile.extra_sbatch,
    )
    layout = inputs.layout
    return Plan(
        run_id=layout.run_id,
        run_name=run.name,
        num_records=run.num_records,
        shards=split_records(run.num_records, run.shards),
        resume=run.resume,
        buffer_size=min(run.buffer_size, run.num_records),
        recipe_file=str(layout.recipe),
        recipe_sha256=inputs.recipe_sha256,
        snapshot_file=str(layout.snapshot),
        snapshot_sha256=inputs.snapshot_sha256,
        secret_env=inputs.snapshot.secret_env_names(),
        python_env=profile.python_env,
        generation=generation,
        collection=collection,
    )
