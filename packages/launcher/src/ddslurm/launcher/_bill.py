"""The bill of a submission, before it is paid: how the shards are spread over jobs, what each job asks for, the
steps it starts, and the CPU- and GPU-hours the jobs hold at their time limit (``submit --dry-run``)."""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ddslurm.config import Plan, PlannedArray, ProviderSnapshot, Resources, parallel_requests
from ddslurm.planner import array_tasks
from ddslurm.providers import AliasRow
from ddslurm.runtime import StepSpec, server_command, srun_argv, unix_url

PORT = 0
"""Stands for a port the job chooses when it starts (shown as ``<port>``)."""
TCP = f"http://127.0.0.1:{PORT}"
SOCKETS = Path("/<sockets>")
"""Stands for the allocation's owner-only socket directory, made on the node (shown as ``<sockets>``)."""
_NOWHERE = Path("/dev/null")
"""The steps' log (the bill starts nothing)."""


class BillAlias(msgspec.Struct, kw_only=True):
    alias: str
    kind: str
    """``local`` (served inside the job), ``hosted`` or ``unresolved``."""
    model: str
    where: str
    """Local: replicas x tensor parallel and the endpoint (a proxy in front of several replicas); hosted: the
    provider and its endpoint."""
    max_parallel_requests: int | None = None
    """What each client worker sends to the alias at most at once: for a local alias sized from its replicas'
    capacity unless the recipe sets its own value (``ddslurm.runtime.parallel_requests``)."""


class BillJobs(msgspec.Struct, kw_only=True):
    """One kind of job of the submission (the generation jobs; the jobs of a stage)."""

    what: str
    arrays: int
    tasks: int
    """Array tasks (jobs) of the submission's first arrays, automatic retries not counted."""
    why: str
    """Why there are ``tasks`` of them (one per shard; the pulling allocations and where their number comes from;
    the arrays they are split into)."""
    retry_tasks: int
    """Tasks of the automatic retry arrays, which run only if a task before them failed."""
    resources: Resources
    gpus_per_task: int
    cpu_hours: float
    """tasks x CPUs x the time limit: what the jobs hold at most (retries not counted)."""
    gpu_hours: float
    """tasks x GPUs x the time limit."""


class Bill(msgspec.Struct, kw_only=True):
    shards: int
    records: int
    records_per_shard: str
    """``9`` or ``8-9``."""
    shard_sizes: str
    """Why the shards hold what they do: ``60 records over 7 shards: 4 shards of 9 and 3 of 8 (...)``."""
    layout: str
    """One line: how shards map to jobs (one task per shard, or pulling allocations with client workers)."""
    allocations: int | None
    client_workers: int
    stages: int
    stage_reason: str | None
    aliases: list[BillAlias]
    jobs: list[BillJobs]
    steps: list[str]
    """The command line of every step one generation job starts (ports and tokens are chosen by the job)."""
    cpu_hours: float
    gpu_hours: float


def _hours(tasks: int, per_task: int, minutes: int) -> float:
    return round(tasks * per_task * minutes / 60, 2)


def shard_sizes(plan: Plan) -> str:
    """How the run's records fall into its shards, and why: as evenly as they divide, or, with a seed dataset whose
    rows the records cycle through, along its passes (``ddslurm.planner``'s shard rule, docs/recipes.md)."""
    counts = Counter(s.num_records for s in plan.shards)
    sizes = sorted(counts, reverse=True)
    shards = f"{len(plan.shards)} shard{'s' if len(plan.shards) > 1 else ''}"
    if len(sizes) == 1:
        return f"{plan.num_records} records over {shards} of {sizes[0]} each"
    parts = [f"{counts[sizes[0]]} shard{'s' if counts[sizes[0]] > 1 else ''} of {sizes[0]}"]
    parts += [f"{counts[size]} of {size}" for size in sizes[1:]]
    text = f"{plan.num_records} records over {shards}: {', '.join(parts[:-1])} and {parts[-1]}"
    if plan.seed is not None and sizes[0] - sizes[-1] > 1:
        return (
            f"{text} (the records cycle through the seed dataset's {plan.seed.pool_size} rows: a shard keeps within "
            "one pass over them or starts where a pass starts, so that it reads the seed rows the unsharded run "
            "would)"
        )
    return f"{text} (as evenly as they divide)"


def _tasks_why(plan: Plan, what: str, arrays: int, tasks: int) -> str:
    if what != "generation":
        why = "as many CPU-only tasks as the GPU stage's, each array after its GPU-stage array"
    elif plan.allocations is None:
        why = f"one per shard ({len(plan.shards)} shards)"
    else:
        count, workers, shards = plan.allocations, plan.client_workers, len(plan.shards)
        why = f"{count} pulling allocations"
        if count == math.ceil(shards / workers):
            why += f": {shards} shards / {workers} client worker(s) each, rounded up"
        elif count == plan.max_concurrent:
            why += f": at most max_concurrent ({count})"
        else:
            why += ": the run file's allocations"
        if tasks != count:
            why += f"; {tasks} over the arrays (a retry: as many as its shards need)"
    if arrays > 1:
        why += f"; split into {arrays} arrays to stay under the scheduler's MaxArraySize"
    return why


def _jobs(plan: Plan, what: str, arrays: Sequence[PlannedArray], resources: Resources, gpus: int) -> BillJobs:
    first = [a for a in arrays if a.kind != "auto-retry"]
    retry = [a for a in arrays if a.kind == "auto-retry"]
    n = sum(map(array_tasks, first))
    return BillJobs(
        what=what,
        arrays=len(first),
        tasks=n,
        why=_tasks_why(plan, what, len(first), n),
        retry_tasks=sum(map(array_tasks, retry)),
        resources=resources,
        gpus_per_task=gpus,
        cpu_hours=_hours(n, resources.cpus_per_task, resources.time_minutes),
        gpu_hours=_hours(n, gpus, resources.time_minutes),
    )


def _aliases(plan: Plan, rows: Sequence[AliasRow], snapshot: ProviderSnapshot) -> list[BillAlias]:
    deployments = {d.alias: d for d in plan.serving.deployments} if plan.serving else {}
    parallel = parallel_requests(snapshot, plan.serving)
    out: list[BillAlias] = []
    for row in rows:
        dep = deployments.get(row.alias)
        if dep is not None:
            front = "a proxy in front of them" if dep.proxy else "the replica itself"
            out.append(
                BillAlias(
                    alias=row.alias,
                    kind="local",
                    model=dep.model,
                    where=f"{len(dep.replicas)} replica(s) x tensor parallel {dep.tensor_parallel}; endpoint: {front}",
                    max_parallel_requests=parallel.get(row.alias),
                )
            )
        else:
            where, mpr = f"{row.provider} {row.endpoint}", parallel.get(row.alias)
            out.append(
                BillAlias(alias=row.alias, kind=row.kind, model=row.model, where=where, max_parallel_requests=mpr)
            )
    return out


def step_lines(plan: Plan) -> list[str]:
    """The srun command line of every step of one generation job, in the order the job starts them."""
    runtime = f"{plan.python_env}/bin/ddslurm-runtime"
    lines: list[str] = []
    serving = plan.serving
    if serving is not None:
        for dep in serving.deployments:
            for rep in dep.replicas:
                name = f"server-{dep.alias}-{rep.index}"
                listen = unix_url(SOCKETS / f"{dep.alias}-{rep.index}.sock") if dep.listen == "unix" else TCP
                cmd = server_command(serving, dep, listen)
                spec = StepSpec(
                    name=name,
                    argv=cmd.argv,
                    env={},
                    log=_NOWHERE,
                    cpus=rep.cpus,
                    gpus=rep.gpus,
                    gpu_request=serving.gpu_request,
                    srun_extra=cmd.srun_extra,
                )
                lines.append(_show(srun_argv(spec)))
            if dep.proxy:
                argv = (
                    runtime,
                    "proxy",
                    "--listen",
                    "127.0.0.1:<port>",
                    "--reuse-port",
                    *(["--upstream", "<replica>"] * len(dep.replicas)),
                )
                lines.append(
                    _show(
                        srun_argv(
                            StepSpec(
                                name=f"proxy-{dep.alias}", argv=argv, env={}, log=_NOWHERE, cpus=serving.proxy_cpus
                            )
                        )
                    )
                )
    workers = plan.client_workers if plan.allocations is not None else 1
    for worker in range(workers):
        name = "client" if plan.allocations is None else "client-<shard>"
        argv = (runtime, "client", "--run-dir", "<run dir>", "--shard", "<shard>", "--attempt", "<attempt>")
        spec = StepSpec(name=name, argv=argv, env={}, log=_NOWHERE, cpus=plan.client_cpus)
        lines.append(_show(srun_argv(spec)) + (f"   (worker {worker + 1} of {workers})" if workers > 1 else ""))
    return lines


def _show(argv: Sequence[str]) -> str:
    return shlex.join(argv).replace(f"--port {PORT}", "--port <port>").replace(str(SOCKETS), "<sockets>")


def make_bill(
    plan: Plan, arrays: Sequence[PlannedArray], aliases: Sequence[AliasRow], snapshot: ProviderSnapshot
) -> Bill:
    """The bill of submitting ``arrays`` (as ``plan_submission`` planned them) for ``plan``."""
    sizes = sorted({s.num_records for s in plan.shards})
    gpus = plan.serving.gpus if plan.serving else 0
    jobs = [_jobs(plan, "generation", [a for a in arrays if a.stage != 1], plan.generation, gpus)]
    cpu_stage = [a for a in arrays if a.stage == 1]
    if cpu_stage and plan.cpu_stage is not None:  # a two-stage run's CPU-only allocations
        jobs.append(_jobs(plan, "CPU stage", cpu_stage, plan.cpu_stage, 0))
    if plan.allocations is None:
        layout = (
            f"one array task per shard ({len(plan.shards)} tasks), each starting its own model servers"
            if gpus
            else (f"one array task per shard ({len(plan.shards)} tasks)")
        )
    else:
        layout = (
            f"{plan.allocations} pulling allocation(s) for {len(plan.shards)} shards: each starts its model servers "
            f"once and claims shards until none is left, {plan.client_workers} client worker(s) at a time"
        )
    return Bill(
        shards=len(plan.shards),
        records=plan.num_records,
        records_per_shard=str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}",
        shard_sizes=shard_sizes(plan),
        layout=layout,
        allocations=plan.allocations,
        client_workers=plan.client_workers,
        stages=max(1, len(plan.stages)),
        stage_reason=plan.stage_reason,
        aliases=_aliases(plan, aliases, snapshot),
        jobs=jobs,
        steps=step_lines(plan),
        cpu_hours=round(sum(j.cpu_hours for j in jobs), 2),
        gpu_hours=round(sum(j.gpu_hours for j in jobs), 2),
    )


def bill_lines(bill: Bill) -> list[str]:
    """The bill as the dry run prints it."""
    lines = [
        f"shards: {bill.shard_sizes}",
        f"layout: {bill.layout}",
        f"stages: {bill.stages}" + (f" ({bill.stage_reason})" if bill.stage_reason else ""),
        "model aliases:",
    ]
    width = max((len(a.alias) for a in bill.aliases), default=5)
    for a in bill.aliases:
        mpr = f"; max_parallel_requests {a.max_parallel_requests} per client" if a.max_parallel_requests else ""
        lines.append(f"  {a.alias:<{width}}  {a.kind:<7} {a.model}  ({a.where}{mpr})")
    for job in bill.jobs:
        res = job.resources
        gres = f"{job.gpus_per_task} GPU(s)" if job.gpus_per_task else "no GPU (--gres=none)"
        lines.append(
            f"{job.what} jobs: {job.tasks} task(s) in {job.arrays} array(s) ({job.why}), each {res.cpus_per_task} "
            f"CPUs, {gres}, "
            f"memory {res.memory or 'the partition default'}, partition {res.partition or 'the default'}, "
            f"time limit {res.time_minutes} min"
            + (f"; automatic retries: up to {job.retry_tasks} more task(s)" if job.retry_tasks else "")
        )
    lines.append("steps of one generation job (srun inside the allocation):")
    lines += [f"  {step}" for step in bill.steps]
    lines.append(
        f"at the time limit: {bill.cpu_hours:g} CPU-hours, {bill.gpu_hours:g} GPU-hours"
        + "".join(
            f" ({job.tasks} task(s) x {job.gpus_per_task} GPU(s) x {job.resources.time_minutes} min)"
            for job in bill.jobs
            if job.gpus_per_task
        )
        + "; automatic retries not counted"
    )
    return lines
