"""The bill of a submission, before it is paid: how the shards are spread over jobs, what each job asks for, the
steps it starts, and the CPU- and GPU-hours the jobs hold at their time limit (``submit --dry-run``)."""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ddslurm.config import (
    DD_DEFAULT_MAX_PARALLEL_REQUESTS,
    DeploymentPlan,
    LayoutChoice,
    Plan,
    PlannedArray,
    Prediction,
    ProviderSnapshot,
    Resources,
    SpendForecast,
    parallel_requests,
)
from ddslurm.launcher.runs._money import money
from ddslurm.launcher.submission._bill_spend import limit_cost, spend_lines
from ddslurm.planner import Overrun, array_tasks, batch_text, overruns, wall_text
from ddslurm.providers import AliasRow
from ddslurm.runtime import RankPlace, StepSpec, server_command, server_step_name, srun_argv, unix_url

PORT = 0
"""Stands for a port the job chooses when it starts (shown as ``<port>``)."""
TCP = f"http://127.0.0.1:{PORT}"
SOCKETS = Path("/<sockets>")
"""Stands for the allocation's owner-only socket directory, made on the node (shown as ``<sockets>``)."""
_NOWHERE = Path("/dev/null")
"""The steps' log (the bill starts nothing)."""
ENGINE_CACHE = "/<engine_cache>"
"""Stands for the default engine cache, made on the node (``ddslurm.runtime._engine_cache``), in a container's
mounts."""
LEADER, RENDEZVOUS = "<leader>", "<port>"
"""Stand for the first node's address and the rendezvous port the job plans there, in a spanning replica's rank
arguments (:class:`ddslurm.runtime.RankPlace`)."""
_PLACEHOLDER = re.compile(r"'([^'\s]*<(?:leader|port)>[^'\s]*)'")


class BillAlias(msgspec.Struct, kw_only=True):
    alias: str
    kind: str
    """``local`` (served inside the job), ``hosted`` or ``unresolved``."""
    model: str
    where: str
    """Local: replicas x the shape of one (``1 replica x (TP 4 x PP 2 = 8 GPUs over 2 nodes, 4 a node)``), the
    engine and the endpoint (the proxy in front of the replicas); hosted: the provider and its endpoint."""
    max_parallel_requests: int | None = None
    """What each client worker sends to the alias at most at once: for a local alias sized from its replicas'
    capacity unless the recipe sets its own value (``ddslurm.runtime.parallel_requests``)."""


class BillKey(msgspec.Struct, kw_only=True):
    """One hosted provider's key: what the run's clients may ask of it at once, against what the run file states."""

    provider: str
    key_env: str | None
    aliases: list[str]
    clients: int
    """Client steps that may run at once (array tasks at once, or allocations x client workers)."""
    per_client: int
    """Requests one client sends the key's aliases at most at once (their ``max_parallel_requests``)."""
    stated_in_flight: int | None = None
    stated_requests_per_minute: int | None = None
    unpriced: list[str] = msgspec.field(default_factory=list)
    """Its models without a price in the run's price file (empty without one)."""

    @property
    def at_once(self) -> int:
        return self.clients * self.per_client


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
    """GPUs of one job on all its nodes (nodes x ``gpus_per_node``)."""
    nodes: int = 1
    """Nodes of each job (``--nodes``)."""
    gpus_per_node: int = 0
    """GPUs each node of a job holds (``--gres=gpu:N`` / ``--gpus-per-node``)."""
    cpu_hours: float
    """tasks x nodes x CPUs a node x the time limit: what the jobs hold at most (retries not counted)."""
    gpu_hours: float
    """tasks x nodes x GPUs a node x the time limit."""


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
    """The command line of every step one generation job starts (ports and tokens are chosen by the job); a
    replica that spans nodes has one step on each (``srun --relative=k``)."""
    nodes: int = 1
    """Nodes of each generation job."""
    steps_per_node: list[int] = msgspec.field(default_factory=list)
    """The srun steps of one generation job on each of its nodes, the first node's first: every endpoint, leader
    and client there, one rank of the spanning replica on each of the others."""
    cpu_hours: float
    gpu_hours: float
    prediction: Prediction | None = None
    """The layout the planner's cost model chose, its prediction, the runners-up and the facts it used (the plan's
    ``prediction``; None for hosted-only runs): the ``Layout`` section."""
    batches: str = ""
    """The batch size, how it was chosen and how much work a cancel or a time limit can lose (:func:`batch_text`)."""
    keys: list[BillKey] = msgspec.field(default_factory=list)
    """The run's hosted keys (:func:`bill_keys`)."""
    currency: str | None = None
    """The run's price file's currency; None: no price file."""
    limit_cost: float | None = None
    """What the jobs cost held to their time limits at their partitions' prices (automatic retries not counted);
    None: no price file, or a partition it does not price."""
    spend: SpendForecast | None = None
    """What the run is predicted to spend (the plan's ``spend``): the ``predicted spend`` section."""
    overruns: list[Overrun] = msgspec.field(default_factory=list)
    """How the prediction says the run will not fit its time limit, each with the run file's field and what fits
    (:func:`ddslurm.planner.overruns`): the dry run's ``warning:`` lines, and what ``submit`` refuses without
    ``--accept-overrun``."""


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
        why = (
            f"CPU-only tasks of {plan.cpu_stage_workers} worker(s) each, as many as the shards need, at most the GPU "
            "stage's; each array after its GPU-stage array"
        )
    elif plan.allocations is None:
        why = f"one per shard ({len(plan.shards)} shards)"
    else:
        count, workers, shards = plan.allocations, plan.client_workers, len(plan.shards)
        why = f"{count} pulling allocations"
        if plan.prediction is not None:
            why += ": the cost model's choice (Layout, below)"
        elif count == math.ceil(shards / workers):
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
    """``gpus``: GPUs of each node of a job; ``resources.nodes`` nodes each."""
    first = [a for a in arrays if a.kind != "auto-retry"]
    retry = [a for a in arrays if a.kind == "auto-retry"]
    n = sum(map(array_tasks, first))
    nodes = resources.nodes
    return BillJobs(
        what=what,
        arrays=len(first),
        tasks=n,
        why=_tasks_why(plan, what, len(first), n),
        retry_tasks=sum(map(array_tasks, retry)),
        resources=resources,
        gpus_per_task=nodes * gpus,
        nodes=nodes,
        gpus_per_node=gpus,
        cpu_hours=_hours(n * nodes, resources.cpus_per_task, resources.time_minutes),
        gpu_hours=_hours(n * nodes, gpus, resources.time_minutes),
    )


def replica_shape(dep: DeploymentPlan) -> str:
    """One replica of ``dep``: ``TP 4 x PP 2 = 8 GPUs over 2 nodes, 4 a node`` (the factors that are not 1, tensor
    parallel always; expert parallel named)."""
    factors = [f"TP {dep.tensor_parallel}"]
    factors += [f"PP {dep.pipeline_parallel}"] * (dep.pipeline_parallel > 1)
    factors += [f"DP {dep.data_parallel}"] * (dep.data_parallel > 1)
    gpus = dep.replica_gpus
    shape = f"{' x '.join(factors)} = {gpus} GPU{'s' if gpus > 1 else ''}"
    nodes = dep.replicas[0].nodes if dep.replicas else 1
    if nodes > 1:
        shape += f" over {nodes} nodes, {dep.replicas[0].gpus} a node"
    return shape + (", expert parallel" if dep.expert_parallel else "")


def _aliases(plan: Plan, rows: Sequence[AliasRow], snapshot: ProviderSnapshot) -> list[BillAlias]:
    deployments = {d.alias: d for d in plan.serving.deployments} if plan.serving else {}
    parallel = parallel_requests(snapshot, plan.serving)
    out: list[BillAlias] = []
    for row in rows:
        dep = deployments.get(row.alias)
        if dep is not None:
            front = "a proxy in front of them" if dep.proxy else "the replica itself"
            count = len(dep.replicas)
            where = (
                f"{count} replica{'s' if count > 1 else ''} x ({replica_shape(dep)}), {dep.engine}; endpoint: {front}"
            )
            out.append(
                BillAlias(
                    alias=row.alias,
                    kind="local",
                    model=dep.model,
                    where=where,
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
    """The srun command line of every step of one generation job, in the order the job starts them. A replica
    that spans nodes has one step on each of its nodes (``--relative=k``: the leader on the first, headless
    followers on the others); with several nodes the proxies and clients run on the first (``--relative=0``)."""
    return [line for _, line in _steps(plan)]


def _steps(plan: Plan) -> list[tuple[int, str]]:
    """Each step of one generation job with the index of the node it runs on."""
    runtime = f"{plan.python_env}/bin/ddslurm-runtime"
    lines: list[tuple[int, str]] = []
    serving = plan.serving
    first = serving.home_node if serving is not None else None
    if serving is not None:
        for dep in serving.deployments:
            for rep in dep.replicas:
                listen = unix_url(SOCKETS / f"{dep.alias}-{rep.index}.sock") if dep.listen == "unix" else TCP
                for node in range(rep.nodes):
                    place = RankPlace(node, rep.nodes, LEADER, RENDEZVOUS) if rep.nodes > 1 else None
                    cmd = server_command(serving, dep, listen, place, Path(serving.engine_cache or ENGINE_CACHE))
                    spec = StepSpec(
                        name=server_step_name(dep.alias, rep.index, node),
                        argv=cmd.argv,
                        env={},
                        log=_NOWHERE,
                        cpus=rep.cpus,
                        gpus=rep.gpus,
                        gpu_request=serving.gpu_request,
                        srun_extra=cmd.srun_extra,
                        node=node if rep.nodes > 1 else first,
                    )
                    lines.append((node, _show(srun_argv(spec))))
            if dep.proxy:
                argv = (
                    runtime,
                    "proxy",
                    "--listen",
                    "127.0.0.1:<port>",
                    "--reuse-port",
                    *(["--upstream", "<replica>"] * len(dep.replicas)),
                )
                proxy = StepSpec(
                    name=f"proxy-{dep.alias}", argv=argv, env={}, log=_NOWHERE, cpus=serving.proxy_cpus, node=first
                )
                lines.append((0, _show(srun_argv(proxy))))
    workers = plan.client_workers if plan.allocations is not None else 1
    for worker in range(workers):
        name = "client" if plan.allocations is None else "client-<shard>"
        argv = (runtime, "client", "--run-dir", "<run dir>", "--shard", "<shard>", "--attempt", "<attempt>")
        spec = StepSpec(name=name, argv=argv, env={}, log=_NOWHERE, cpus=plan.client_cpus, node=first)
        shown = _show(srun_argv(spec)) + (f"   (worker {worker + 1} of {workers})" if workers > 1 else "")
        lines.append((0, shown))
    return lines


def _show(argv: Sequence[str]) -> str:
    """``argv`` as a shell line with the job's choices readable: ``<port>``, ``<sockets>``, and ``<leader>``/
    ``<port>`` unquoted where a spanning replica's ranks meet (``--master-addr <leader>``)."""
    text = shlex.join(argv).replace(f"--port {PORT}", "--port <port>").replace(str(SOCKETS), "<sockets>")
    return _PLACEHOLDER.sub(r"\1", text)


def make_bill(
    plan: Plan, arrays: Sequence[PlannedArray], aliases: Sequence[AliasRow], snapshot: ProviderSnapshot
) -> Bill:
    """The bill of submitting ``arrays`` (as ``plan_submission`` planned them) for ``plan``."""
    sizes = sorted({s.num_records for s in plan.shards})
    gpus = plan.serving.gpus if plan.serving else 0
    steps = _steps(plan)
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
        steps=[line for _, line in steps],
        nodes=plan.generation.nodes,
        steps_per_node=[sum(1 for node, _ in steps if node == k) for k in range(plan.generation.nodes)],
        cpu_hours=round(sum(j.cpu_hours for j in jobs), 2),
        gpu_hours=round(sum(j.gpu_hours for j in jobs), 2),
        prediction=plan.prediction,
        batches=batch_text(plan),
        keys=bill_keys(plan, jobs, snapshot),
        currency=None if plan.prices is None else plan.prices.currency,
        limit_cost=limit_cost(jobs, plan.prices),
        spend=plan.spend,
        overruns=list(overruns(plan)),
    )


def bill_keys(plan: Plan, jobs: Sequence[BillJobs], snapshot: ProviderSnapshot) -> list[BillKey]:
    """Per hosted provider of the run: how many clients may run at once (the most tasks of one kind of job at
    once, times its client workers, within ``max_concurrent``), what each sends its aliases at most at once, what
    the run file states of the key, and which of its models the price file does not price."""
    parallel = parallel_requests(snapshot, plan.serving)
    clients = 0
    for job in jobs:
        workers = plan.cpu_stage_workers if job.what == "CPU stage" else (plan.client_workers if plan.allocations
                                                                          else 1)  # fmt: skip
        clients = max(clients, job.tasks * max(1, workers))
    if plan.max_concurrent is not None:
        clients = min(clients, plan.max_concurrent)
    out = []
    for provider in snapshot.providers:
        if provider.local:
            continue
        models = [m for m in snapshot.models if m.provider == provider.name]
        stated = plan.hosted_limits.get(provider.name)
        per = [parallel.get(m.alias) for m in models]
        priced = plan.prices.models if plan.prices is not None else None
        out.append(
            BillKey(
                provider=provider.name,
                key_env=provider.api_key_env,
                aliases=[m.alias for m in models],
                clients=clients,
                per_client=sum(int(p or DD_DEFAULT_MAX_PARALLEL_REQUESTS) for p in per),
                stated_in_flight=None if stated is None else stated.in_flight,
                stated_requests_per_minute=None if stated is None else stated.requests_per_minute,
                unpriced=[] if priced is None else sorted({m.model for m in models if m.model not in priced}),
            )
        )
    return out


def key_lines(bill: Bill) -> list[str]:
    """The bill's hosted keys: what the clients may ask at once, and a warning where that is more than the key is
    stated to admit (the clients then share what it admits: more of them only wait)."""
    lines: list[str] = []
    for key in bill.keys:
        name = key.key_env or "no key"
        stated = [f"{key.stated_in_flight} at once" if key.stated_in_flight else "",
                  f"{key.stated_requests_per_minute} a minute" if key.stated_requests_per_minute else ""]  # fmt: skip
        caps = ", ".join(x for x in stated if x)
        limits = f"the run file caps it at {caps}" if caps else "its limits are learned from the provider's answers"
        lines.append(
            f"  {key.provider} ({name}): up to {key.clients} client(s) x {key.per_client} request(s) at once = "
            f"{key.at_once}; {limits}"
        )
        if key.stated_in_flight and key.at_once > key.stated_in_flight:
            lines.append(
                f"    warning: {key.at_once} requests at once against a key stated to admit {key.stated_in_flight}: "
                f"the clients share {key.stated_in_flight} and the rest wait; about "
                f"{max(1, -(-key.stated_in_flight // max(1, key.per_client)))} client(s) at once keep it busy "
                "(max_concurrent, or fewer allocations, cost fewer CPU-hours at the same speed)"
            )
        if key.unpriced:
            lines.append(f"    no price in the price file for: {', '.join(key.unpriced)}")
    return (["hosted keys (one rate budget each, shared by every client; docs/providers.md):", *lines]
            if lines else [])  # fmt: skip


LAYOUT_COLUMNS = ("layout", "allocations", "replicas", "client workers", "stages", "GPUs at once", "wall time",
                  "GPU-hours", "GPU-busy")  # fmt: skip


def layout_row(name: str, choice: LayoutChoice) -> tuple[str, ...]:
    """One row of the bill's layout table: replicas per allocation of each deployment in run-file order (``2/1``)."""
    return (
        name,
        str(choice.allocations),
        "/".join(str(r) for r in choice.replicas),
        str(choice.client_workers),
        "2" if choice.two_stage else "1",
        str(choice.gpus_at_once),
        wall_text(choice.wall_s),
        f"{choice.gpu_hours:.2f}",
        f"{choice.gpu_busy:.2f}",
    )


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Columns left-aligned to their widest cell, two spaces apart."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (header, *rows)]


def layout_lines(prediction: Prediction) -> list[str]:
    """The bill's ``Layout`` section: the chosen layout and its prediction, the two runners-up, how the layout was
    picked, and every fact the cost model used with where it came from (``default``: nothing measured yet)."""
    bound = [f"at most {prediction.budget_gpus} GPUs at once"] if prediction.budget_gpus is not None else []
    if prediction.deadline_s is not None:
        met = "" if prediction.meets_deadline else ": no layout meets it, the fastest is chosen"
        bound.append(f"deadline {wall_text(prediction.deadline_s)}{met}")
    lines = ["Layout" + (f" ({'; '.join(bound)})" if bound else "") + ":"]
    rows = [layout_row("chosen", prediction.chosen)]
    rows += [layout_row(f"runner-up {n}", c) for n, c in enumerate(prediction.runners_up[:2], start=1)]
    lines += table_lines(LAYOUT_COLUMNS, rows)
    if prediction.rule:
        lines.append(f"  how: {prediction.rule}")
    if prediction.facts:
        lines.append("  facts used:")
        facts = [
            (f.name, f.subject, f"{f.value:g}", f.origin + (f" {f.run_id}" if f.run_id else "") + _note(f.note))
            for f in prediction.facts
        ]
        lines += table_lines(("fact", "of", "value", "from"), facts, indent="    ")
    return lines


def bill_lines(bill: Bill) -> list[str]:
    """The bill as the dry run prints it."""
    lines = [
        f"shards: {bill.shard_sizes}",
        f"layout: {bill.layout}",
        f"stages: {bill.stages}" + (f" ({bill.stage_reason})" if bill.stage_reason else ""),
        *([f"batches: {bill.batches}"] if bill.batches else []),
        "model aliases:",
    ]
    width = max((len(a.alias) for a in bill.aliases), default=5)
    for a in bill.aliases:
        mpr = f"; max_parallel_requests {a.max_parallel_requests} per client" if a.max_parallel_requests else ""
        lines.append(f"  {a.alias:<{width}}  {a.kind:<7} {a.model}  ({a.where}{mpr})")
    for job in bill.jobs:
        res = job.resources
        gres = f"{job.gpus_per_task} GPU(s)" if job.gpus_per_task else "no GPU (--gres=none)"
        each = f"{res.cpus_per_task} CPUs, {gres}"
        if job.nodes > 1:
            each = f"{job.nodes} nodes of {res.cpus_per_task} CPUs and {job.gpus_per_node} GPU(s) each"
            each += f" ({job.gpus_per_task} GPUs)"
        lines.append(
            f"{job.what} jobs: {job.tasks} task(s) in {job.arrays} array(s) ({job.why}), each {each}, "
            f"memory {res.memory or 'the partition default'}, partition {res.partition or 'the default'}, "
            f"time limit {res.time_minutes} min"
            + (f"; automatic retries: up to {job.retry_tasks} more task(s)" if job.retry_tasks else "")
        )
    where = ""
    if bill.nodes > 1:
        per_node = ", ".join(f"node {k}: {n}" for k, n in enumerate(bill.steps_per_node))
        where = f" on {bill.nodes} nodes (steps a node: {per_node})"
    lines.append(f"steps of one generation job (srun inside the allocation){where}:")
    lines += [f"  {step}" for step in bill.steps]
    lines.append(
        f"at the time limit: {bill.cpu_hours:g} CPU-hours, {bill.gpu_hours:g} GPU-hours"
        + "".join(
            f" ({job.tasks} task(s) x "
            + (
                f"{job.nodes} nodes x {job.gpus_per_node} GPU(s) a node"
                if job.nodes > 1
                else f"{job.gpus_per_task} GPU(s)"
            )
            + f" x {job.resources.time_minutes} min)"
            for job in bill.jobs
            if job.gpus_per_task
        )
        + _at_most(bill)
        + "; automatic retries not counted"
    )
    lines += key_lines(bill)
    lines += spend_lines(bill.spend)
    if bill.prediction is not None:
        lines += layout_lines(bill.prediction)
    return lines


def _at_most(bill: Bill) -> str:
    if bill.limit_cost is None or bill.currency is None:
        return ""
    return f", at most {money(bill.limit_cost, bill.currency)} at the price file's partition prices"


def _note(note: str) -> str:
    return f" ({note})" if note else ""
