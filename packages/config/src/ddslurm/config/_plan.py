"""The resolved plan: everything a compute node needs, compiled on the submit host and hashed."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._layout import LAYOUT_VERSION
from ddslurm.config._prediction import Prediction
from ddslurm.config._prices import Prices
from ddslurm.config._records import FileEntry
from ddslurm.config._runfile import Engine, HostedLimit, ResumeMode
from ddslurm.config._seed_rows import SeedRows
from ddslurm.config._spend import SpendForecast
from ddslurm.config._workflow import WorkflowPlace

PLAN_VERSION = 2


class Resources(Frozen, frozen=True, kw_only=True):
    """One Slurm job's request. ``gres == "none"`` asks for a CPU-only allocation."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_minutes: int
    nodes: int = 1
    """``--nodes``; ``cpus_per_task``, ``memory`` and ``gres``/``gpus`` are each per node."""
    cpus_per_task: int = 1
    memory: str | None = None
    gres: str = "none"
    gpus: int | None = None
    constraint: str | None = None
    reservation: str | None = None
    extra_sbatch: tuple[str, ...] = ()


class ReplicaPlan(Frozen, frozen=True, kw_only=True):
    """One engine (vLLM or SGLang) with its own API: ``nodes`` srun steps of ``gpus`` GPUs each, one on each of
    the allocation's first ``nodes`` nodes (node rank k on the k-th; rank 0, the leader, serves the API, the
    others run headless and join it). One node: one step of ``tensor_parallel x pipeline_parallel x
    data_parallel`` GPUs."""

    index: int
    gpus: int
    """GPUs of each of its steps (a node's share of its ranks)."""
    cpus: int
    """CPUs of each of its steps."""
    port: int | None = None
    nodes: int = 1
    """The nodes its ranks span (one step each). Plans compiled before multi-node replicas: 1."""


class DeploymentPlan(Frozen, frozen=True, kw_only=True):
    alias: str
    model: str
    served_model_name: str
    tensor_parallel: int
    replicas: tuple[ReplicaPlan, ...]
    startup_timeout: int
    restarts: int = 0
    """Times a replica on one node that dies is started again inside its allocation (``server.restarts``); 0 in
    plans compiled before replicas were restarted."""
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    proxy: bool = False
    """Whether the alias's endpoint is the proxy (``ddslurm-runtime proxy``, which requires the token on every
    route) or the replica itself. The planner puts every deployment behind one; plans compiled before it did:
    only those with more than one replica."""
    listen: Literal["tcp", "unix"] = "tcp"
    """Where the replicas listen. ``unix``: a Unix-domain socket (vLLM's ``--uds``) in a directory of the
    allocation that only its user can enter, which no other user can reach, squat or replace (needs ``proxy``);
    ``tcp``: loopback ports (``server.port`` pins them), whose listener is proved to be this user's before any
    request carries the token. Plans compiled before sockets: ``tcp``."""
    env_from: tuple[str, ...] = ()
    """Names of job environment variables given to this deployment's server steps only (``server.env_from``);
    their values are never in the plan."""
    capacity: int | None = None
    """Sequences one replica runs at once: its data-parallel ranks x what one rank runs (``--max-num-seqs`` in
    ``extra_args``, SGLang's ``--max-running-requests``, else the engine's default: the planner's
    ``VLLM_DEFAULT_MAX_NUM_SEQS``). None in plans compiled before ddslurm sized the client."""
    max_parallel_requests: int | None = None
    """Requests each Data Designer client keeps in flight to this alias: replicas x ``capacity``, divided among the
    allocation's ``client_workers`` (rounded up), so that the clients together never send more than the replicas
    run at once. The node puts it in the alias's model config unless that sets its own
    ``max_parallel_requests`` (any value, Data Designer's default of 4 included); None (older plans): the recipe's
    value stands."""

    engine: Engine = "vllm"
    pipeline_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False

    @property
    def replica_gpus(self) -> int:
        """The GPUs one replica of this deployment holds (and keeps busy while it has work), on all its nodes:
        ``tensor_parallel x pipeline_parallel x data_parallel``. The one place that says so; the report's GPU time
        generating counts each replica's busy time x this."""
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel


class ServingPlan(Frozen, frozen=True, kw_only=True):
    """Everything needed to start the run's model servers inside the allocation: ``nodes`` nodes of ``gpus``
    GPUs each. Every endpoint (proxy) and every replica's leader is on the first node, the batch step's, where the
    clients run; only the followers of the one replica that spans nodes run on the others."""

    deployments: tuple[DeploymentPlan, ...]
    gpus: int
    """GPUs on each node of the allocation (``--gres=gpu:N`` is per node)."""
    gpu_request: Literal["gres", "gpus"] = "gres"
    container_runtime: Literal["none", "pyxis", "apptainer"] = "none"
    vllm_executable: str = "vllm"
    vllm_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    proxy_cpus: int = 1
    nodes: int = 1
    """Nodes of each allocation (``--nodes``). Plans compiled before multi-node replicas: 1."""
    sglang_executable: str = "python3"
    sglang_image: str | None = None
    engine_cache: str | None = None
    """The profile's ``engine_cache``: where the servers download models and keep their caches on each node
    (None: ``ddslurm-engine-cache-<uid>`` in the node's temporary directory)."""

    @property
    def home_node(self) -> int | None:
        """The node of every step but a spanning replica's followers (leaders, proxies, clients): the first
        (``srun --relative=0``) in an allocation of several nodes; None (where srun places it) in one of one."""
        return 0 if self.nodes > 1 else None


class ShardSpec(Frozen, frozen=True, kw_only=True):
    index: int
    first_record: int
    num_records: int
    seed_start: int | None = None
    """First seed row (inclusive) of the shard's block when the recipe has a seed dataset: the node gives Data
    Designer ``IndexRange(seed_start, seed_end)``, so the shard reads exactly the seed rows an unsharded run would
    use for records ``first_record .. first_record + num_records - 1``."""
    seed_end: int | None = None
    """Last seed row (inclusive) of the shard's block."""

    @property
    def seed_rows(self) -> SeedRows | None:
        """The shard's block of seed rows (:func:`~ddslurm.config.shard_seed_rows` chose it); None without a seed."""
        return None if self.seed_start is None or self.seed_end is None else SeedRows(self.seed_start, self.seed_end)


SeedKind = Literal["file", "files", "directory"]


class SeedPlan(Frozen, frozen=True, kw_only=True):
    """The recipe's seed dataset, captured into the run's inputs (never read from the submitter's tree)."""

    seed_type: str
    """Data Designer's ``seed_config.source.seed_type`` (local, directory, file_contents, agent_rollout)."""
    kind: SeedKind
    """One file, the files of a wildcard pattern, or a directory tree."""
    root: str
    """The directory in the run's inputs that holds the captured files."""
    path: str
    """What the stored recipe's ``seed_config.source.path`` says (a file, a pattern or a directory under root)."""
    files: tuple[FileEntry, ...]
    """Every captured file, relative to ``root``, with its size and sha256 (checked on the node)."""
    rows: int
    """Seed rows as Data Designer counts them (for directory sources: the files it matches)."""
    pool_start: int = 0
    """First row of the recipe's own selection (``selection_strategy``), 0 without one."""
    pool_size: int
    """Rows of the recipe's own selection, ``rows`` without one."""
    sampling: Literal["ordered", "shuffle"] = "ordered"
    shuffle_seed: int | None = None
    """With ``sampling: shuffle``: the seed of every shard's fixed permutation of its seed block (chosen once at
    submit), so that each attempt, resume, rerun and fill of a shard reads its rows in the same random order."""

    @property
    def pool(self) -> SeedRows:
        """The recipe's own selection of seed rows, which the shards' blocks divide."""
        return SeedRows.of(self.pool_start, self.pool_size)


class RecipeSource(Frozen, frozen=True, kw_only=True):
    """The builder script a recipe was made from (``recipe: build.py`` or ``module:function`` in the run file). The
    node runs the stored config (``recipe_file``); only the columns named in ``rebuild`` it takes from the script."""

    file: str
    """Its copy in the run's inputs (``inputs/recipe-source.py``)."""
    sha256: str
    builder: str
    """What was called: ``/abs/build.py:load_config_builder`` or ``package.module:function``."""
    origin: str
    """The script's path on the submit host when the run was submitted."""
    module: str | None = None
    """For ``module:function``: the module the node imports (from ``python_env``); None: the script, run from its
    copy (``file``)."""
    rebuild: tuple[str, ...] = ()
    """Columns whose config does not survive Data Designer's YAML round trip (a custom column's function, a
    plugin's field left out of the YAML, a judge's integer option keys; any field, compared as the requests the
    column sends: a mapping's key order too): the node runs the script (its copy) or imports the module and takes
    these columns from the config it returns."""
    reasons: tuple[str, ...] = ()
    """Why, one line a column of ``rebuild`` and in its order (``'grade': scores[0].options: keys 1, 2 read back
    as '1', '2'``): what submit and its dry run say."""
    stage: int | None = None
    """For a builder that returns a Data Designer workflow: the index of the workflow's stage this run is, whose
    config the node takes the ``rebuild`` columns from; None: the builder returns a config."""


class PluginRecord(Frozen, frozen=True, kw_only=True):
    """A Data Designer plugin the recipe uses, as the profile's ``python_env`` provided it at submit; each node
    checks it has the same distribution at the same version before it runs the recipe."""

    name: str
    """The type the recipe names (``column_type``, ``processor_type`` or ``seed_type``)."""
    plugin_type: str
    """Data Designer's ``PluginType``: ``column-generator``, ``processor`` or ``seed-reader``."""
    distribution: str
    version: str


class StagePlan(Frozen, frozen=True, kw_only=True):
    """One stage of a two-stage run (``stages: auto``): the recipe columns it generates; the node rebuilds the
    runtime's ``StageSplit`` from these (it never splits the recipe again)."""

    kind: Literal["gpu", "cpu"]
    columns: tuple[str, ...]
    keep: tuple[str, ...] = ()
    """Columns this stage outputs for the next one although the recipe drops them."""


class Batching(Frozen, frozen=True, kw_only=True):
    """How the plan's ``buffer_size`` was chosen (``Plan.batching``; docs/run-files.md#checkpoints). A batch is the
    unit a shard saves its work in: a cancel, a time limit or a crash loses at most the batch in progress."""

    by: Literal["run file", "planner"]
    """``run file``: its ``buffer_size`` (at most ``num_records``); ``planner``: chosen because the run file sets
    none."""
    rule: str
    """The choice in words (the dry run's bill prints it)."""
    shard_records: int
    """Records of the run's largest shard."""
    batches: int
    """Batches of the largest shard: the times it saves its work (the last when it ends)."""
    batch_s: float | None = None
    """Predicted seconds one batch of a shard takes (the cost model's rate for the chosen layout); None: nothing
    predicts it (hosted-only runs, layouts the run file fixes)."""


class Plan(Frozen, frozen=True, kw_only=True):
    version: int = PLAN_VERSION
    layout_version: int = LAYOUT_VERSION
    """The run-directory layout the run was created with (``ddslurm.config._layout``)."""
    run_id: str
    run_name: str
    num_records: int
    shards: tuple[ShardSpec, ...]
    resume: ResumeMode
    buffer_size: int
    max_concurrent: int | None = None
    allocations: int | None = None
    """Allocations of the initial submission that pull shards (model servers started once per allocation); None:
    one array task per shard (task i runs shard i)."""
    client_workers: int = 1
    """Data Designer client steps an allocation runs at once, each on its own shard (pulling allocations)."""
    retries: int = 0
    client_retries: int = 1
    provider_wait_s: int = 300
    """How long an attempt waits out a provider that is unavailable (429, 5xx, refused, timed out) before failing
    ``provider_unavailable`` (the run file's ``provider_wait``)."""
    hosted_limits: dict[str, HostedLimit] = msgspec.field(default_factory=dict)
    """Per hosted provider, the run file's cap on what the run uses of its key (its clients' gates bound their
    shared budget by it)."""
    run_config: dict[str, Any] = msgspec.field(default_factory=dict)
    """The run file's ``run_config``: Data Designer ``RunConfig`` fields every client step sets (checked at submit by
    the Data Designer of ``python_env``); empty in plans made before it (Data Designer's defaults)."""
    prices: Prices | None = None
    """The run file's price file as read at submit (``prices``); None: no dollars are shown."""
    recipe_file: str
    recipe_sha256: str
    recipe_key: str = ""
    """The digest of the recipe as the run file names it (a builder's output included), before its seed is pointed
    at the run's copy: the same in every run of the same recipe, so the workspace's recipe facts are keyed by it
    (:meth:`recipe_facts_key`). Empty in plans made before it."""
    recipe_source: RecipeSource | None = None
    """For a recipe built by a Python script or function: that script, copied into the run's inputs."""
    plugins: tuple[PluginRecord, ...] = ()
    """The Data Designer plugins the recipe uses (sorted by name)."""
    workflow: WorkflowPlace | None = None
    """For a stage of a Data Designer workflow (a builder that returns ``compose_workflow(...)``): which stage, of
    which workflow, seeded by which run (docs/recipes.md#workflows); None: a run of its own."""
    data_designer_version: str = ""
    """The Data Designer version of the profile's ``python_env`` at submit (its ``ddslurm-runtime inspect`` said
    so): each node refuses to run the run under another (``recipe_invalid``). Empty in plans made before it (not
    checked)."""
    ddslurm_version: str = ""
    """The version of ddslurm that planned the run (its ``ddslurm-planner`` distribution; recorded, never gated).
    Empty in plans made before it."""
    snapshot_file: str
    snapshot_sha256: str
    seed: SeedPlan | None = None
    """The recipe's seed dataset, copied into the run's inputs (the stored recipe points at the copy)."""
    secret_env: tuple[str, ...]
    python_env: str
    generation: Resources
    collection: Resources
    client_cpus: int = 1
    """CPUs of each client step (the run file's ``submission.cpus`` shared among ``client_workers``)."""
    serving: ServingPlan | None = None
    """None for hosted-only runs: no GPU discovery, servers, containers or proxies at all."""
    max_empty_outputs: int | None = 0
    """Empty or null values each LLM column of a shard may hold (the run file's ``max_empty_outputs``)."""
    server_secret_env: tuple[str, ...] = ()
    """Variables the server steps need (every deployment's ``server.env_from``, sorted): checked set at submit and
    exported to the job by name like ``secret_env``, but given only to the server steps that name them, never to
    the proxy or the client."""
    secret_env_unscanned: tuple[str, ...] = ()
    """Names in ``secret_env`` whose value, when the run was submitted, was a placeholder rather than a secret
    (``EMPTY``, ``none``, ``dummy``, anything shorter than 8 characters; ``providers.is_placeholder_secret``). Such
    values occur in ordinary output (Data Designer writes ``"with_trace": "none"``), so the node does not scan
    the attempt's files for them; every other name in ``secret_env`` is scanned for."""
    stages: tuple[StagePlan, ...] = ()
    """The GPU stage then the CPU stage of a two-stage run; empty: one stage (the recipe as it is)."""
    stage_reason: str | None = None
    """Why the run has one stage or two (the dry run shows it); None for runs without deployments."""
    cpu_stage: Resources | None = None
    """The CPU stage's allocations (two-stage runs): the hosted-only shape, ``submission.cpus`` CPUs on the
    profile's CPU partition, no GPU, the same time limit."""
    cpu_stage_workers: int = 1
    """Client steps a CPU-stage allocation runs at once, each on its own shard (two-stage runs): as many as its CPUs
    (``submission.cpus``) allow at one CPU per hosted-only client, at most the shards; each gets
    ``submission.cpus // cpu_stage_workers`` CPUs."""
    column_order: tuple[str, ...] | None = None
    """The dataset's columns in the order Data Designer writes them (``final_columns``), for every run and stage
    split: collection writes them in this order. None: not known at submit (columns Data Designer did not read, a
    plugin's processor): collection keeps the order of the batch files, first seen first."""
    gpu_type: str = ""
    """The GPU type of the generation partition's nodes when the run was planned (``sinfo``'s GRES; empty:
    untyped or unknown): the model shapes of the run's facts are keyed by it."""
    prediction: Prediction | None = None
    """The layout the planner's cost model chose, its predicted wall time and GPU-hours, the runners-up and the
    facts it used; None for hosted-only runs."""
    batching: Batching | None = None
    """How ``buffer_size`` was chosen; None: plans made before the planner chose it."""
    spend: SpendForecast | None = None
    """What the run is predicted to spend: hosted requests, tokens and money from the facts of earlier runs of the
    recipe, the predicted GPU-hours' money (the bill's ``Spend`` section); None: plans made before it was kept."""

    def recipe_facts_key(self) -> str:
        """What the workspace's recipe facts of this run are keyed by: :attr:`recipe_key`, else (older plans) the
        stored recipe's digest."""
        return self.recipe_key or self.recipe_sha256

    calibrate: tuple[int, ...] = ()
    """A ``ddslurm tune`` calibration run: the concurrency levels (requests in flight at once, ascending) at which
    the allocation measures one replica of each deployment after its generation; its proxies record the requests
    they forward (:func:`~ddslurm.config.prompts_file`). Empty: an ordinary run."""
