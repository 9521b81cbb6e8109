"""The run file: what a user writes to describe one run. It names no providers and no API keys."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from ddslurm.config._base import Frozen

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ResumeMode = Literal["never", "always", "if_possible"]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

RESERVED_SERVER_ENV = frozenset({"VLLM_API_KEY", "APPTAINERENV_VLLM_API_KEY"})
"""Set by ddslurm on every server step (the attempt's own token); never taken from the run file."""

# server.env values are stored in the run's inputs and its plan, so a credential there would be written to disk.
_CREDENTIAL_WORDS = frozenset(
    {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY", "KEY",
     "AUTH", "AUTHORIZATION", "BEARER", "JWT", "COOKIE", "PAT"}
)  # fmt: skip
_NOT_A_CREDENTIAL_SUFFIXES = frozenset({"PATH", "FILE", "DIR"})
_KEY_PREFIXES = (
    "sk-", "hf_", "nvapi-", "ghp_", "gho_", "ghu_", "ghs_", "github_pat_", "glpat-", "xoxb-", "xoxp-", "AKIA",
    "eyJ", "Bearer ", "Basic ",
)  # fmt: skip
_URL_CREDENTIALS = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]+:[^/@\s]+@")
_RANDOM_TOKEN = re.compile(r"^[A-Za-z0-9_-]{24,}$")
_MIN_NAMED_SECRET = 8


def server_env_secret(name: str, value: str) -> str | None:
    """Why ``name: value`` in ``server.env`` looks like a credential, or None.

    A name whose words say it holds one (``HF_TOKEN``, ``OPENAI_API_KEY``, ``DB_PASSWORD``; not
    ``TOKENIZERS_PARALLELISM`` or ``HF_TOKEN_PATH``) with a value of 8 characters or more, or a value that looks
    like a key whatever the name: a known key prefix (``hf_``, ``sk-``, ``nvapi-``, a JWT, ...), credentials in a
    URL, or a long random-looking string. The reason never repeats the value.
    """
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.upper()) if w]
    if (
        len(value) >= _MIN_NAMED_SECRET
        and _CREDENTIAL_WORDS.intersection(words)
        and words[-1] not in _NOT_A_CREDENTIAL_SUFFIXES
    ):
        return "the variable's name says it holds a credential"
    stripped = value.strip()
    if stripped.startswith(_KEY_PREFIXES):
        return "the value starts like an API key or token"
    if _URL_CREDENTIALS.match(stripped):
        return "the value is a URL with credentials in it"
    if _RANDOM_TOKEN.match(stripped) and _looks_random(stripped):
        return "the value looks like a generated key"
    return None


def _looks_random(value: str) -> bool:
    """Mixed case and digits with few separators: a generated key rather than a name (``Llama-3-70B-Instruct``)."""
    separators = sum(ch in "-_" for ch in value)
    return (
        any(ch.isdigit() for ch in value)
        and any(ch.islower() for ch in value)
        and any(ch.isupper() for ch in value)
        and separators * 8 <= len(value)
    )


DD_BUILDER_FUNCTION = "load_config_builder"
"""The function Data Designer's own CLI calls in a Python config module (``data-designer create build.py``;
``USER_MODULE_FUNC_NAME`` in ``data_designer/cli/utils/config_loader.py``): a run file's ``recipe: build.py`` means
this function of ``build.py``, as it does for Data Designer."""

RecipeKind = Literal["config", "script", "module"]
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class RecipeRef:
    """What a run file's ``recipe`` names: a Data Designer config file (``recipe.yaml``, YAML or JSON), a builder
    script and its function (``build.py``, ``build.py:make``), or an importable module's function
    (``package.module:make``). Paths are relative to the run file."""

    kind: RecipeKind
    target: str
    """The file (config, script) or the dotted module name."""
    function: str | None = None
    """The function that returns the config (scripts and modules); None for config files."""

    def __str__(self) -> str:
        return self.target if self.function is None else f"{self.target}:{self.function}"


def parse_recipe_ref(text: str) -> RecipeRef:
    """The reference a run file's ``recipe`` holds; ValueError says why a reference cannot be one.

    ``*.py`` is a builder script whose :data:`DD_BUILDER_FUNCTION` is called (Data Designer's convention);
    ``FILE.py:NAME`` calls ``NAME`` instead; ``a.b.c:NAME`` imports module ``a.b.c`` and calls ``NAME``;
    anything else is a config file."""
    value = text.strip()
    if not value:
        raise ValueError("names no recipe (a Data Designer config file, a builder script build.py, or module:function)")
    head, sep, function = value.rpartition(":")
    if sep and head and function.isidentifier():
        if head.lower().endswith(".py"):
            return RecipeRef("script", head, function)
        if head.lower().endswith(_CONFIG_SUFFIXES):
            raise ValueError(
                f"{value!r}: a ':{function}' suffix names the function of a Python builder script "
                f"(build.py:{function}) or module (package.module:{function}); a config file ({head}) has none"
            )
        if all(part.isidentifier() for part in head.split(".")):
            return RecipeRef("module", head, function)
    if value.lower().endswith(".py"):
        return RecipeRef("script", value, DD_BUILDER_FUNCTION)
    return RecipeRef("config", value)


class ServerSpec(Frozen, frozen=True, kw_only=True):
    """How each vLLM server process of a deployment is started."""

    port: Annotated[int, msgspec.Meta(ge=1024, le=65535)] | None = None
    """First port; replica i listens on port + i. None: planned per job, so jobs sharing a node never collide."""
    startup_timeout: PositiveInt = 1800
    """Seconds a replica may take to answer /health with 200 before the attempt fails."""
    cpus: PositiveInt = 4
    """CPUs of each replica's step (tokenisation, scheduling, the API server)."""
    extra_args: tuple[str, ...] = ()
    """Passed to ``vllm serve`` verbatim, after the arguments ddslurm sets."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra environment for the server steps. Stored in the run's inputs and plan, so secrets are refused
    (:func:`server_env_secret`): name them in ``env_from`` instead."""
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


class Deployment(Frozen, frozen=True, kw_only=True):
    """A vLLM deployment started inside the job, serving one model alias of the recipe."""

    model_alias: str
    """An alias the recipe's columns use; each alias is deployed at most once."""
    model: str
    """What vLLM loads: a Hugging Face hub id or a path on the nodes."""
    served_model_name: str | None = None
    """The model name requests use. None: ``model``."""
    replicas: PositiveInt = 1
    """Server processes behind the alias's one endpoint (a balancing proxy when more than one)."""
    tensor_parallel: PositiveInt = 1
    """GPUs per replica (``--tensor-parallel-size``)."""
    server: ServerSpec = msgspec.field(default_factory=ServerSpec)
    """How each replica is started (below)."""


class Submission(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the generation jobs. ``None`` means "take the profile's default"."""

    account: str | None = None
    """``--account``. None: the profile's."""
    partition: str | None = None
    """``--partition``. None: the profile's ``partition`` (its ``cpu_partition`` for hosted-only runs)."""
    qos: str | None = None
    """``--qos``."""
    time_limit: str | int = "01:00:00"
    """``--time`` of each generation job: ``MM``, ``HH:MM:SS`` or ``D-HH:MM:SS`` (a bare number is minutes;
    rounded up to whole minutes); at least 2 minutes."""
    memory: str | None = None
    """``--mem`` per node (``16G``). None: the profile's ``memory_per_gpu`` x GPUs, else the site default."""
    cpus: PositiveInt = 2
    """CPUs of the Data Designer client step; server and proxy CPUs are added to the job's request."""
    constraint: str | None = None
    """``--constraint``."""
    reservation: str | None = None
    """``--reservation``."""
    extra_sbatch: tuple[str, ...] = ()
    """Added to the batch script as ``#SBATCH`` lines, verbatim."""


class Collection(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the collection job."""

    partition: str | None = None
    """``--partition`` of the collection job. None: the profile's ``cpu_partition``."""
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
    buffer_size: PositiveInt = 1000
    """Records per Data Designer batch (one Parquet file each, and the unit of resuming)."""
    max_concurrent: PositiveInt | None = None
    """At most this many array tasks run at once (the array's ``%N`` throttle)."""
    allocations: PositiveInt | Literal["auto"] = "auto"
    """Jobs that generate the shards. Fewer allocations than shards makes each one pull shards from the run until
    none is left, its model servers started once and kept warm across them. ``auto``: one task per shard for
    hosted-only runs; with deployments, one allocation per ``client_workers`` shards, at most ``max_concurrent``."""
    client_workers: PositiveInt | Literal["auto"] = "auto"
    """Data Designer client processes per allocation, each on its own shard (runs with deployments). ``auto``: one
    per model-server replica, at most ``submission.cpus`` (the client CPUs are shared among them)."""
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 0
    """Retry arrays submitted with the run, each after the previous one if any of its shards failed."""
    client_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 1
    """Inside an allocation: rerun a failed generation step this often, servers kept, resuming its batches."""
    max_empty_outputs: Annotated[int, msgspec.Meta(ge=0)] | None = 0
    """Empty or null values each LLM column of a shard may hold before the shard's attempt fails with
    ``empty_outputs`` (an endpoint that answered HTTP 200 without content). None: not checked."""
    stages: Literal["auto", "single"] = "auto"
    """``auto``: a run with deployments whose recipe splits into a GPU stage (the local models' columns and what
    they read) and a CPU stage (the hosted-only columns) runs the CPU stage in CPU-only allocations after the GPU
    stage, so the GPUs are released when their columns are done. ``single``: one stage in the GPU allocations."""
    deployments: tuple[Deployment, ...] = ()
    """vLLM servers started inside each job, one entry per model alias. Empty: a hosted-only run (CPU jobs)."""
    submission: Submission = msgspec.field(default_factory=Submission)
    """Scheduler settings of the generation jobs."""
    collection: Collection = msgspec.field(default_factory=Collection)
    """Scheduler settings of the collection job."""
