"""The run file: what a user writes to describe one run. It names no providers and no API keys."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ddslurm.config._base import Frozen

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ResumeMode = Literal["never", "always", "if_possible"]


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
    """Extra environment for the server steps (never secrets: they are refused)."""


class Deployment(Frozen, frozen=True, kw_only=True):
    """A vLLM deployment started inside the job, serving one model alias of the recipe."""

    model_alias: str
    model: str
    served_model_name: str | None = None
    replicas: PositiveInt = 1
    tensor_parallel: PositiveInt = 1
    server: ServerSpec = msgspec.field(default_factory=ServerSpec)


class Submission(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the generation jobs. ``None`` means "take the profile's default"."""

    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    time_limit: str | int = "01:00:00"
    memory: str | None = None
    cpus: PositiveInt = 2
    """CPUs of the Data Designer client step; server and proxy CPUs are added to the job's request."""
    constraint: str | None = None
    reservation: str | None = None
    extra_sbatch: tuple[str, ...] = ()


class Collection(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the collection job."""

    partition: str | None = None
    memory: str | None = None
    time_limit: str | int = "00:30:00"
    cpus: PositiveInt = 1


class RunFile(Frozen, frozen=True, kw_only=True):
    """Top level of ``run.yaml``."""

    name: Name
    recipe: str
    num_records: PositiveInt
    shards: PositiveInt = 1
    resume: ResumeMode = "if_possible"
    buffer_size: PositiveInt = 1000
    max_concurrent: PositiveInt | None = None
    """At most this many shards run at once (the array's ``%N`` throttle)."""
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 0
    """Retry arrays submitted with the run, each after the previous one if any of its shards failed."""
    client_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 1
    """Inside an allocation: rerun a failed generation step this often, servers kept, resuming its batches."""
    max_empty_outputs: Annotated[int, msgspec.Meta(ge=0)] | None = 0
    """Empty or null values each LLM column of a shard may hold before the shard's attempt fails with
    ``empty_outputs`` (an endpoint that answered HTTP 200 without content). None: not checked."""
    deployments: tuple[Deployment, ...] = ()
    submission: Submission = msgspec.field(default_factory=Submission)
    collection: Collection = msgspec.field(default_factory=Collection)
