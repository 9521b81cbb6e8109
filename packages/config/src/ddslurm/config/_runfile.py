"""The run file: what a user writes to describe one run. It names no providers and no API keys."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._convert import refuse_all
from ddslurm.config._recipe_ref import parse_recipe_ref
from ddslurm.config._run_config import run_config_refusals
from ddslurm.config._sbatch_values import extra_sbatch_refusals, scheduler_refusals
from ddslurm.config._server_args import (
    RESERVED_SERVER_ENV,
    server_args_secret,
    server_env_secret,
    server_flag_set_by_ddslurm,
)

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
# msgspec matches patterns with re.search: anchored with \A and \Z, as ^ and $ would let "inj\n" through.
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")]
ResumeMode = Literal["never", "always", "if_possible"]
EnvName = Annotated[str, msgspec.Meta(pattern=r"\A[A-Za-z_][A-Za-z0-9_]*\Z")]


class ServerSpec(Frozen, frozen=True, kw_only=True):
    """How each vLLM server process of a deployment is started."""

    port: Annotated[int, msgspec.Meta(ge=1024, le=65535)] | None = None
    """First port; replica i listens on port + i. None: planned per job, so jobs sharing a node never collide."""
    startup_timeout: PositiveInt = 1800
    """Seconds a replica may take to answer /health with 200 before the attempt fails."""
    restarts: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    """Times a replica that dies (on one node) is started again inside its allocation, on the same GPUs and
    listener, before its allocation gives up; meanwhile its proxy holds or routes around the requests, and the
    shards' clients resume their batches. Each restart loads the model again (GPU time the report counts)."""
    cpus: PositiveInt = 4
    """CPUs of each replica's step (tokenisation, scheduling, the API server)."""
    extra_args: tuple[str, ...] = ()
    """Passed to the engine (``vllm serve``, ``sglang.launch_server``) verbatim, after the arguments ddslurm sets;
    the flags ddslurm sets itself (parallel sizes, multi-node rendezvous, where it listens, the model and its
    served name) are refused, naming the field to set instead. Stored in the run's inputs and plan and
    on command lines, so credentials are refused (:func:`server_args_secret`: ``--api-key``, which ddslurm sets,
    ``--hf-token VALUE`` and the like, and any value the secret policy, ``credential_shape``, takes for a key):
    name them in ``env_from`` instead."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra environment for the server steps. Stored in the run's inputs and plan, so secrets are refused
    (:func:`server_env_secret`: a name that says it holds one, or a value the secret policy, ``credential_shape``,
    takes for a key): name them in ``env_from`` instead."""
    env_from: tuple[EnvName, ...] = ()
    """Variables of the submitting shell given to the server steps only (a gated model's ``HF_TOKEN``), by name:
    checked set at submit, exported to the job by name like API keys, never written to any file, never given to
    the proxy or the Data Designer client."""

    def __post_init__(self) -> None:
        for name, value in self.env.items():
            if name in RESERVED_SERVER_ENV:
                raise ValueError(f"env.{name}: set by ddslurm itself (each attempt's own token); remove it")
            why = server_env_secret(name, value)
            if why is not None:
                raise ValueError(
                    f"env.{name}: looks like a secret ({why}); server.env is written to the run's inputs and plan. "
                    f"Export {name} in the shell you submit from and list it under server.env_from instead"
                )
        seen: set[str] = set()
        for name in self.env_from:
            if name in RESERVED_SERVER_ENV:
                raise ValueError(f"env_from: {name} is set by ddslurm itself (each attempt's own token)")
            if name in seen:
                raise ValueError(f"env_from: {name} is listed twice")
            if name in self.env:
                raise ValueError(f"env_from: {name} is also set in env; keep one")
            seen.add(name)


Engine = Literal["vllm", "sglang"]
"""The serving engines ddslurm starts: vLLM (``vllm serve``) and SGLang (``python -m sglang.launch_server``)."""


class Deployment(Frozen, frozen=True, kw_only=True):
    """A model deployment started inside the job (vLLM or SGLang), serving one model alias of the recipe.

    One replica holds ``tensor_parallel x pipeline_parallel x data_parallel`` GPUs. A replica that needs more GPUs
    than a node has spans ``GPUs / gpus_per_node`` whole nodes (one server step per node: the leader, which serves
    the API, and headless followers); tensor parallel never crosses a node."""

    model_alias: str
    """An alias the recipe's columns use; each alias is deployed at most once."""
    model: str
    """What the engine loads: a Hugging Face hub id or a path on the nodes."""
    served_model_name: str | None = None
    """The model name requests use. None: ``model``."""
    engine: Engine = "vllm"
    """``vllm`` or ``sglang`` (the profile's ``vllm_executable``/``vllm_image`` or ``sglang_executable``/
    ``sglang_image``)."""
    replicas: PositiveInt | Literal["auto"] = "auto"
    """Server processes (each a whole engine: its ranks, its API) behind the alias's one endpoint, the balancing
    proxy, in each allocation. ``auto``: 1, or with the run file's ``gpus`` as many as the planner's cost model
    chooses."""
    tensor_parallel: PositiveInt = 1
    """GPUs of one tensor-parallel group (vLLM ``--tensor-parallel-size``, SGLang ``--tp-size``); at most a node's
    GPUs."""
    pipeline_parallel: PositiveInt = 1
    """Pipeline stages of one replica (vLLM ``--pipeline-parallel-size``, SGLang ``--pp-size``), each a
    tensor-parallel group; the stages of a replica bigger than a node run on several nodes."""
    data_parallel: PositiveInt = 1
    """The engine's own data-parallel ranks inside one replica (vLLM ``--data-parallel-size``, SGLang
    ``--dp-size``): one API, requests spread over the ranks by the engine; ``--max-num-seqs`` applies per rank."""
    expert_parallel: bool = False
    """Shard a mixture-of-experts model's experts over the replica's ranks instead of its tensor-parallel groups
    (vLLM ``--enable-expert-parallel``, SGLang ``--ep-size`` = ``tensor_parallel``)."""
    server: ServerSpec = msgspec.field(default_factory=ServerSpec)
    """How each replica is started (below)."""

    @property
    def served_name(self) -> str:
        """The model name the servers answer to and the alias's requests name: ``served_model_name``, else
        ``model`` (the plan's ``served_model_name``, the snapshot's model of the alias)."""
        return self.served_model_name or self.model


class Submission(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the generation jobs. ``None`` means "take the profile's default"."""

    account: str | None = None
    """``--account``: a Slurm name (letters, digits, ``.``, ``_``, ``+``, ``-``). None: the profile's."""
    partition: str | None = None
    """``--partition``: a Slurm name, or several separated by commas. None: the profile's ``partition`` (its
    ``cpu_partition`` for hosted-only runs)."""
    qos: str | None = None
    """``--qos``: a Slurm name."""
    time_limit: str | int = "01:00:00"
    """``--time`` of each generation job: ``MM``, ``HH:MM:SS`` or ``D-HH:MM:SS`` (a bare number is minutes;
    rounded up to whole minutes); at least 2 minutes."""
    memory: str | None = None
    """``--mem`` per node (``16G``). None: the profile's ``memory_per_gpu`` x GPUs, else the site default."""
    cpus: PositiveInt = 2
    """CPUs of the Data Designer client step; server and proxy CPUs are added to the job's request."""
    constraint: str | None = None
    """``--constraint``: node features joined by Slurm's operators (``intel&gpu``, ``[rack1|rack2]``,
    ``[a*2&b*4]``); no whitespace."""
    reservation: str | None = None
    """``--reservation``: a Slurm name, or several separated by commas."""
    extra_sbatch: tuple[str, ...] = ()
    """Added to the batch script as ``#SBATCH`` lines, one long option each: ``--name`` or ``--name=value``, without
    whitespace, quotes, backslashes or ``#``. Options ddslurm sets itself or that would break the run (``--output``,
    ``--chdir``, ``--export``, ``--array``, ``--hold``, ...: the list is in the run-file guide) are refused, abbreviated
    too."""


class HostedLimit(Frozen, frozen=True, kw_only=True):
    """What the run may use of one hosted provider's key (``hosted_limits.<provider>``): a cap for a key shared with
    other work, below what the provider admits. The run's clients share one budget of each key and learn its
    limits from the provider's answers (docs/providers.md#one-rate-budget-per-key); a stated cap bounds what they
    learn. Unset fields: learned only."""

    in_flight: PositiveInt | None = None
    """Requests at once, all the run's clients together."""
    requests_per_minute: PositiveInt | None = None
    """Requests a minute, all the run's clients together."""
    tokens_per_minute: PositiveInt | None = None
    """Input and output tokens a minute, all the run's clients together (turned into requests a minute by what an
    answer has cost so far)."""


class Collection(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the collection job."""

    partition: str | None = None
    """``--partition`` of the collection job (as ``submission.partition``). None: the profile's ``cpu_partition``."""
    memory: str | None = None
    """``--mem`` of the collection job. None: the site default."""
    time_limit: str | int = "00:30:00"
    """``--time`` of the collection job (as ``submission.time_limit``)."""
    cpus: PositiveInt = 1
    """``--cpus-per-task`` of the collection job."""


class RunFile(Frozen, frozen=True, kw_only=True):
    """Top level of ``run.yaml``."""

    name: Name
    """Letters, digits, ``.``, ``_`` and ``-``; prefixes the run id."""
    recipe: str
    """A Data Designer config file (YAML or JSON, as ``DataDesignerConfigBuilder.write_config`` writes it), a
    builder script (``build.py``, ``build.py:make``) or a module's function (``package.module:make``) that returns
    one. Paths are relative to the run file."""
    num_records: PositiveInt
    """Records in the final dataset."""
    shards: PositiveInt = 1
    """Contiguous record ranges, each generated and published on its own (one array task each by default)."""
    resume: ResumeMode = "if_possible"
    """How a new attempt reuses an earlier attempt's completed batches: ``if_possible`` (when there are any),
    ``always`` or ``never``."""
    buffer_size: PositiveInt | None = None
    """Records per Data Designer batch: one Parquet file each, and the unit a shard saves its work in (a cancel, a
    time limit or a crash loses at most the batch in progress). Unset: the planner chooses it, so that each shard
    saves its work at least 5 times and at least every 5 minutes of its predicted generation, at most Data
    Designer's default 1000 (docs/run-files.md#checkpoints)."""
    max_concurrent: PositiveInt | None = None
    """At most this many array tasks run at once (the array's ``%N`` throttle)."""
    allocations: PositiveInt | Literal["auto"] = "auto"
    """Jobs that generate the shards. Fewer allocations than shards makes each one pull shards from the run until
    none is left, its model servers started once and kept warm across them. ``auto``: one task per shard for
    hosted-only runs; with deployments, the planner's cost model chooses (the fewest GPU-hours within ``gpus`` and
    ``deadline``; docs/run-files.md)."""
    client_workers: PositiveInt | Literal["auto"] = "auto"
    """Data Designer client processes per allocation, each on its own shard (runs with deployments). ``auto``: the
    planner's cost model chooses, at most the allocation's replicas and ``submission.cpus`` (the client CPUs are
    shared among them)."""
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 0
    """Retry arrays submitted with the run, each after the previous one if any of its shards failed."""
    client_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 1
    """Inside an allocation: rerun a failed generation step this often, servers kept, resuming its batches."""
    provider_wait: Annotated[int, msgspec.Meta(ge=0, le=3600)] = 300
    """Seconds a provider that answers 429 or 5xx, refuses connections or times out (an outage, a rate limit) is
    waited out inside an attempt, with backoff and jitter, before the attempt fails ``provider_unavailable``."""
    max_empty_outputs: Annotated[int, msgspec.Meta(ge=0)] | None = 0
    """Empty or null values each LLM column of a shard may hold before the shard's attempt fails with
    ``empty_outputs`` (an endpoint that answered HTTP 200 without content). None: not checked."""
    gpus: PositiveInt | None = None
    """The most GPUs the run may hold at once. With it, the planner's cost model picks the allocations, the
    replicas of each ``replicas: auto`` deployment, the client workers and the stages that cost the fewest
    GPU-hours within it (and within ``deadline``); fields set to numbers stay as set. None: the run's own fields
    (``allocations: auto`` chooses by the same cost model, within the GPUs the old rule of one allocation per
    ``client_workers`` shards would hold)."""
    deadline: str | int | None = None
    """The latest the run's generation should end after its first allocation starts, as ``submission.time_limit``
    (``HH:MM:SS``, minutes, ``D-HH``...): the cost model keeps layouts predicted to end by then. None: none."""
    stages: Literal["auto", "single"] = "auto"
    """``auto``: a run with deployments whose recipe splits into a GPU stage (the local models' columns and what
    they read) and a CPU stage (the hosted-only columns) runs the CPU stage in CPU-only allocations after the GPU
    stage, so the GPUs are released when their columns are done. ``single``: one stage in the GPU allocations."""
    deployments: tuple[Deployment, ...] = ()
    """vLLM servers started inside each job, one entry per model alias. Empty: a hosted-only run (CPU jobs)."""
    hosted_limits: dict[Name, HostedLimit] = msgspec.field(default_factory=dict)
    """Per hosted provider (its name in Data Designer's ``model_providers.yaml`` or the recipe), a cap on what the
    run uses of its key (:class:`HostedLimit`); the provider must be one the run's hosted aliases use."""
    prices: str | None = None
    """A price file (docs/providers.md#prices), relative to the run file: dollars per million input and output
    tokens of hosted models and per GPU-hour of partitions, for the bill, status and report. None: no dollars."""
    submission: Submission = msgspec.field(default_factory=Submission)
    """Scheduler settings of the generation jobs."""
    collection: Collection = msgspec.field(default_factory=Collection)
    """Scheduler settings of the collection job."""
    run_config: dict[str, Any] = msgspec.field(default_factory=dict)
    """Data Designer's own ``RunConfig`` fields (``shutdown_error_rate``, ``max_in_flight_tasks``,
    ``jinja_rendering_engine``, ``request_admission``, ...), set on every client step of the run; checked at submit by
    the Data Designer of ``python_env``, which the nodes run. The fields ddslurm sets itself (``buffer_size``: the run
    file's own; ``display_tui``, ``otel_metrics_port``, ``preserve_dropped_columns``, ``async_trace``) are refused,
    saying why (docs/run-files.md#data-designers-runconfig-run_config)."""

    def __post_init__(self) -> None:
        # Here rather than in Submission or ServerSpec: only the top level knows each field's path in the file.
        sub, col = self.submission, self.collection
        refusals: list[tuple[str, str]] = []
        try:
            parse_recipe_ref(self.recipe)
        except ValueError as exc:
            refusals.append(("recipe", str(exc)))
        refusals += scheduler_refusals(
            (
                ("submission.account", sub.account, "name"),
                ("submission.partition", sub.partition, "names"),
                ("submission.qos", sub.qos, "name"),
                ("submission.memory", sub.memory, "memory"),
                ("submission.constraint", sub.constraint, "constraint"),
                ("submission.reservation", sub.reservation, "names"),
                ("collection.partition", col.partition, "names"),
                ("collection.memory", col.memory, "memory"),
            )
        )
        refusals += extra_sbatch_refusals("submission.extra_sbatch", sub.extra_sbatch)
        for index, deployment in enumerate(self.deployments):
            found = server_args_secret(deployment.server.extra_args)
            if found is not None:
                refusals.append((f"deployments[{index}].server.extra_args[{found[0]}]", found[1]))
            set_here = server_flag_set_by_ddslurm(deployment.engine, deployment.server.extra_args)
            if set_here is not None and (found is None or found[0] != set_here[0]):
                refusals.append((f"deployments[{index}].server.extra_args[{set_here[0]}]", set_here[1]))
        refusals += run_config_refusals(self.run_config)
        refuse_all(refusals)
