"""What a run used: per model alias, the requests and tokens of Data Designer's usage summaries
(:func:`model_usage`); GPU time allocated (sacct) and generating (the proxies' busy logs) and its money
(:func:`gpu_usage`, :func:`priced`); the hosted keys' requests, limits and cost (:func:`hosted_report`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

import msgspec

from ddslurm.config import Plan, ServingPlan, attempt_job
from ddslurm.launcher.cluster._slurm import Accounting
from ddslurm.launcher.report._client_out import ClientOut
from ddslurm.launcher.report._model import (
    AllocationGpu,
    CpuUsage,
    GpuUsage,
    HostedKeyReport,
    HostedMinute,
    HostedModelReport,
    HostedReport,
    JobAccounting,
    ModelUsage,
    ReplicaGpu,
    iso,
)
from ddslurm.launcher.report._read import AttemptFacts, RunFacts
from ddslurm.launcher.report._timeline import Key, Span, attempt_key, length
from ddslurm.launcher.runs._hosted_spend import HostedSpend

# --- models ---


def usage_alias(parsed: ClientOut, model: str, served: dict[str, str]) -> tuple[str, str | None]:
    """The alias and provider a usage summary's model name stands for: as the model-config lines above it say,
    else the deployment that serves that name (``served``: served model name -> alias), else the name itself."""
    return parsed.aliases.get(model, (served.get(model, model), None))


def model_usage(facts: RunFacts, active: dict[Key, Span]) -> tuple[list[ModelUsage], list[str]]:
    """Usage per alias summed over every attempt's summaries; its tokens per second over the union of the
    generating spans of the attempts that used it."""
    plan = facts.plan
    staged = len(plan.stages) > 1
    used: dict[str, list[Span]] = {}
    local = {d.alias: d for d in plan.serving.deployments} if plan.serving is not None else {}
    served = {d.served_model_name: d.alias for d in local.values()}
    usage: dict[str, ModelUsage] = {}
    notes: list[str] = []
    without = 0
    for item in facts.attempts:
        parsed = item.client_out
        if parsed is None:
            continue
        if not parsed.usage and item.record.client_runs:
            without += 1

        def entry_of(model: str, parsed: ClientOut = parsed) -> ModelUsage:
            alias, provider = usage_alias(parsed, model, served)
            if alias not in usage:
                usage[alias] = ModelUsage(alias=alias, model=model, provider=provider, local=alias in local)
            return usage[alias]

        for model, checks in parsed.health_checks.items():
            entry_of(model).health_checks += checks
        span = active.get(attempt_key(item, staged))
        for u in parsed.usage:
            entry = entry_of(u.model)
            if span is not None:
                used.setdefault(entry.alias, []).append(span)
            entry.summaries += 1
            entry.requests += u.requests
            entry.successful += u.successful
            entry.failed += u.failed
            entry.input_tokens += u.input_tokens
            entry.output_tokens += u.output_tokens
            entry.total_tokens += u.total_tokens
    for entry in usage.values():
        entry.error_rate = round(entry.failed / entry.requests, 4) if entry.requests else 0.0
        if entry.alias in used:
            busy = length(used[entry.alias])
            entry.active_s = round(busy, 3)
            entry.tokens_per_second = round(entry.total_tokens / busy, 1) if busy > 0 else None
    if without:
        notes.append(
            f"{without} attempt(s) ran the generation step without a Data Designer usage summary in client.out "
            "(killed or failed before Data Designer returned): their requests are not counted"
        )
    if usage:
        notes.append(
            "requests are those of Data Designer's usage summaries; its health checks (one request per model each "
            "time the generation step starts) are counted apart; latency per request is not in its summary"
        )
    return sorted(usage.values(), key=lambda m: (not m.local, m.alias)), notes


# --- GPU time ---


def _allocation(item: AttemptFacts) -> str:
    """The allocation an attempt ran in, named as sacct names it (``<array>_<task>``), else its job id."""
    return attempt_job(item.record)


def _replicas(serving: ServingPlan, logged: dict[tuple[str, int], list[Span]]) -> list[ReplicaGpu]:
    """Every replica of the plan with the seconds its busy log covers, to the millisecond (0 without one: it never
    had work)."""
    return [
        ReplicaGpu(
            alias=d.alias,
            replica=r.index,
            gpus=d.replica_gpus,
            busy_s=round(length(logged.get((d.alias, r.index), [])), 3),
        )
        for d in serving.deployments
        for r in d.replicas
    ]


def gpu_usage(facts: RunFacts, active: dict[Key, Span]) -> tuple[GpuUsage, list[str]]:
    """GPU time allocated (sacct) and generating: per allocation that held GPUs, the sum over its replicas of the
    union of the spans in which the replica had work (its busy log) x the replica's GPUs; without any busy log,
    the union of its attempts' generating spans x its GPUs; at most what sacct allocated it."""
    plan, subs = facts.plan, facts.submissions
    staged = len(plan.stages) > 1
    plan_gpus = plan.serving.gpus if plan.serving is not None else 0
    cpu_arrays = {s.array_job_id for s in subs if s.stage == 1}  # a two-stage run's CPU stage: no GPU
    jobs: list[JobAccounting] = []
    accounted: dict[str, list[Accounting]] = {}
    for row in facts.accounting or []:
        # a cluster that does not account gres/gpu: the plan's request (none for the CPU stage's jobs)
        gpus = row.gpus or (0 if row.job_id in cpu_arrays else plan_gpus)
        name = f"{row.job_id}_{row.task}" if row.task is not None else row.job_id
        jobs.append(JobAccounting(job=name, state=row.state, elapsed_s=row.elapsed_s, gpus=gpus))
        accounted.setdefault(name, []).append(row)
    on_gpus = [d for d in facts.attempts if plan_gpus and (d.stage == 0 or not staged)]
    by_allocation: dict[str, list[AttemptFacts]] = {}
    for item in on_gpus:
        by_allocation.setdefault(_allocation(item), []).append(item)
    allocations: list[AllocationGpu] = []
    for name, items in by_allocation.items():
        logged: dict[tuple[str, int], list[Span]] = {}
        for folder in sorted({i.serving_dir for i in items if i.serving_dir}):
            for replica, spans in facts.busy.get(folder, {}).items():
                logged.setdefault(replica, []).extend(spans)
        rows = accounted.get(name, [])
        gpus = max((r.gpus for r in rows), default=0) or plan_gpus
        allocated = float(sum(r.elapsed_s * (r.gpus or plan_gpus) for r in rows)) if rows else None
        # Behind proxies (every plan since they were), the busy logs are the whole truth: an allocation with none
        # had no request in flight, so it generated nothing (a hosted judge that hung until the time limit), not
        # "its attempts' spans". Only plans from before the proxies fall back to the attempts.
        proxied = plan.serving is not None and all(d.proxy for d in plan.serving.deployments)
        replicas = _replicas(plan.serving, logged) if (logged or proxied) and plan.serving is not None else []
        source: Literal["proxy", "attempts"] = "proxy" if replicas else "attempts"
        if replicas:
            busy_s = length(span for spans in logged.values() for span in spans)
            generating = sum(r.busy_s * r.gpus for r in replicas)
        else:
            busy_s = length(active[k] for k in (attempt_key(i, staged) for i in items) if k in active)
            generating = busy_s * gpus
        clamped = allocated is not None and generating > allocated
        allocations.append(
            AllocationGpu(
                job=name,
                gpus=gpus,
                allocated_s=allocated,
                busy_s=round(busy_s, 3),
                busy_from=source,
                generating_gpu_s=round(min(generating, allocated) if allocated is not None else generating, 3),
                clamped=clamped,
                replicas=replicas,
            )
        )
    allocations.sort(key=lambda a: [int(p) if p.isdigit() else 0 for p in a.job.split("_")])
    generating_h = sum(a.generating_gpu_s for a in allocations) / 3600
    allocated_h = sum(j.elapsed_s * j.gpus for j in jobs) / 3600 if facts.accounting is not None else None
    notes: list[str] = []
    if facts.accounting is None and plan.serving is not None:
        notes.append(
            "Slurm's accounting (sacct) could not be read: GPU-hours allocated, and the share of them spent "
            "generating, are unknown (not estimated); GPU-hours generating are each replica's GPUs x its busy spans"
        )
    if cut := [a.job for a in allocations if a.clamped]:
        notes.append(
            f"GPU time generating of allocation(s) {', '.join(cut)} came out above what sacct allocated them "
            "(clocks of the node and of the accounting differ): cut to the allocated time"
        )
    if plan.serving is not None and (guessed := [a.job for a in allocations if a.busy_from == "attempts"]):
        notes.append(
            f"no proxy busy log for allocation(s) {', '.join(guessed)}: their GPU time generating is the union of "
            "their attempts' generating spans (serving ready to the last batch)"
        )
    usage = GpuUsage(
        allocated_gpu_hours=round(allocated_h, 6) if allocated_h is not None else None,
        generating_gpu_hours=round(generating_h, 6),
        utilisation=round(generating_h / allocated_h, 4) if allocated_h else None,
        source="sacct" if facts.accounting is not None else "none",
        jobs=jobs,
        allocations=allocations,
    )
    return usage, notes


# --- CPU time ---


def cpu_usage(facts: RunFacts) -> tuple[CpuUsage, list[str]]:
    """CPU-hours allocated (sacct: elapsed x CPUs of every run of every allocation of the run) and used by the
    client steps (their ``client-usage.json``), priced at the run's partition's ``cpu_hour`` in a run without
    GPUs (a GPU run's allocations are priced by the GPU-hour)."""
    plan = facts.plan
    rows = facts.accounting
    allocated = sum(r.elapsed_s * r.cpus for r in rows) / 3600 if rows is not None else None
    used = [d.client_usage for d in facts.attempts if d.client_usage is not None]
    ran = sum(1 for d in facts.attempts if d.record.client_runs)
    cpu = CpuUsage(
        allocated_cpu_hours=round(allocated, 6) if allocated is not None else None,
        client_cpu_hours=round(sum(u.cpu_s for u in used) / 3600, 6),
        client_steps=len(used),
        attempts=ran,
    )
    notes: list[str] = []
    if len(used) < ran:
        notes.append(
            f"{ran - len(used)} of {ran} attempt(s) that ran a client step wrote no client-usage.json (killed before "
            "it ended): their CPU time is not in the client steps' CPU-hours"
        )
    prices, partition = plan.prices, plan.generation.partition
    price = prices.partitions.get(partition) if prices is not None and partition is not None else None
    held = cpu.allocated_cpu_hours
    if plan.serving is None and prices is not None and price is not None and price.cpu_hour is not None and held:
        cpu.allocated_cost, cpu.currency = held * price.cpu_hour, prices.currency
    return cpu, notes


def priced(gpu: GpuUsage, plan: Plan) -> GpuUsage:
    """``gpu`` with its allocated GPU-hours' money, when the run's price file prices the generation partition."""
    prices, partition = plan.prices, plan.generation.partition
    price = prices.partitions.get(partition) if prices is not None and partition is not None else None
    if prices is None or price is None or price.gpu_hour is None or gpu.allocated_gpu_hours is None:
        return gpu
    return msgspec.structs.replace(
        gpu, allocated_cost=gpu.allocated_gpu_hours * price.gpu_hour, currency=prices.currency
    )


# --- hosted keys ---


def hosted_report(spend: HostedSpend) -> HostedReport:
    """The report's hosted-key section of what the run's gates recorded."""
    names = {k.key: k.provider for k in spend.keys}
    models = [
        HostedModelReport(
            provider=m.provider,
            key_env=m.key_env,
            model=m.model,
            aliases=list(m.aliases),
            requests=m.spent.requests,
            succeeded=m.spent.succeeded,
            limited=m.spent.limited,
            failed=m.spent.failed,
            unanswered=m.spent.unanswered,
            unreached=m.spent.unreached,
            input_tokens=m.spent.input_tokens,
            output_tokens=m.spent.output_tokens,
            cost=m.spent_cost,
            kept_requests=m.kept.requests,
            kept_input_tokens=m.kept.input_tokens,
            kept_output_tokens=m.kept.output_tokens,
            kept_cost=m.kept_cost,
        )
        for m in spend.models
    ]
    keys = [
        HostedKeyReport(
            provider=k.provider,
            key_env=k.key_env,
            requests_per_minute=k.requests_per_minute,
            tokens_per_minute=k.tokens_per_minute,
            in_flight=k.in_flight,
            stated_in_flight=k.stated_in_flight,
            stated_requests_per_minute=k.stated_requests_per_minute,
            stated_tokens_per_minute=k.stated_tokens_per_minute,
        )
        for k in spend.keys
    ]
    minutes = [
        HostedMinute(provider=names.get(m.key, m.key), start=iso(datetime.fromtimestamp(m.start, UTC)),
                     requests=m.requests, limited=m.limited)
        for m in spend.minutes
    ]  # fmt: skip
    kept = [m.kept_cost for m in spend.models if m.kept_cost is not None]
    return HostedReport(
        currency=spend.currency,
        models=models,
        keys=keys,
        minutes=minutes,
        cost=spend.spent_cost,
        kept_cost=sum(kept) if kept else None,
        kept_rows=spend.kept_rows,
        cost_per_1000_kept_rows=spend.cost_per_1000_kept_rows,
        unpriced=list(spend.unpriced),
    )
