"""What ddslurm has measured on this cluster, kept in the workspace (``<workspace>/facts.json``): per model shape its
load time and throughput, per recipe its requests per record and the client's CPU per request. The planner's cost
model reads them (``ddslurm.planner``); every finished run and every ``ddslurm tune`` updates them."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal, Protocol

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._codec import encode_pretty, read_json
from ddslurm.config._files import LOCK_WAIT_S, atomic_write, exclusive_lock
from ddslurm.config._runfile import Engine
from ddslurm.config.errors import UnsafePathError

FACTS_VERSION = 1
FACTS_FILE = "facts.json"
WEEK_S = 7 * 24 * 3600.0
Rate = Annotated[float, msgspec.Meta(gt=0, le=1e6)]
"""A measured rate (requests or records per second): a division's divisor, so never 0, and never absurd."""
Seconds = Annotated[float, msgspec.Meta(ge=0, le=WEEK_S)]
"""A measured duration: never negative, never more than a week."""
MeasuredBy = Literal["run", "tune"]
"""``run``: an earlier run of this workspace measured it; ``tune``: a ``ddslurm tune`` calibration did."""


class Shaped(Protocol):
    """A deployment as the run file declares it or as the plan holds it: what its model shape is made of."""

    @property
    def engine(self) -> Engine: ...
    @property
    def model(self) -> str: ...
    @property
    def tensor_parallel(self) -> int: ...
    @property
    def pipeline_parallel(self) -> int: ...
    @property
    def data_parallel(self) -> int: ...


class ModelShape(Frozen, frozen=True, kw_only=True):
    """What a replica's speed depends on: the engine, the model and its parallel shape, the GPU type."""

    engine: Engine = "vllm"
    model: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    gpu_type: str = ""
    """The GPU type of the partition's nodes as ``sinfo`` prints their GRES (``a100``); empty: untyped GRES."""

    @classmethod
    def of(cls, deployment: Shaped, gpu_type: str) -> ModelShape:
        """The shape of a deployment (a run file's or a plan's) on GPUs of ``gpu_type``."""
        return cls(
            engine=deployment.engine,
            model=deployment.model,
            tensor_parallel=deployment.tensor_parallel,
            pipeline_parallel=deployment.pipeline_parallel,
            data_parallel=deployment.data_parallel,
            gpu_type=gpu_type,
        )

    def key(self) -> str:
        parallel = f"tp{self.tensor_parallel}-pp{self.pipeline_parallel}-dp{self.data_parallel}"
        return f"{self.engine}:{self.model}:{parallel}:{self.gpu_type or '-'}"


class ConcurrencyPoint(Frozen, frozen=True, kw_only=True):
    """One step of a calibration's sweep: requests per second of one replica at ``in_flight`` requests at once."""

    in_flight: Annotated[int, msgspec.Meta(ge=1)]
    requests_per_s: Annotated[float, msgspec.Meta(ge=0, le=1e6)]


HISTORY = 5
"""Clean runs a model fact keeps: its numbers are their medians, so one run cannot move them far."""


_CAPACITY_FLAGS = frozenset({"--max-num-seqs", "--max_num_seqs", "--max-running-requests", "--max_running_requests"})


def engine_flags(extra_args: Sequence[str]) -> tuple[str, ...]:
    """The engine flags a measured rate depends on: a deployment's ``server.extra_args`` without its capacity flag
    (``--max-num-seqs N``, SGLang's ``--max-running-requests N``: a fact's ``capacity`` says that)."""
    kept: list[str] = []
    skip = False
    for arg in extra_args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _CAPACITY_FLAGS:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return tuple(kept)


class ModelSample(Frozen, frozen=True, kw_only=True):
    """What one clean run measured of a model shape (a :class:`ModelFact` keeps the latest :data:`HISTORY`)."""

    load_s: Seconds
    requests_per_s: Rate
    run_id: str
    measured_at: str


class ModelFact(Frozen, frozen=True, kw_only=True):
    shape: ModelShape
    load_s: Seconds
    """Seconds from a server step's start to its replica answering (the slowest replica of the allocation)."""
    requests_per_s: Rate
    """Requests one replica completes per second with ``capacity`` requests in flight."""
    capacity: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
    """The requests one replica runs at once (its ``--max-num-seqs`` x data-parallel ranks) when measured."""
    sweep: tuple[ConcurrencyPoint, ...] = ()
    """``ddslurm tune``'s throughput at increasing concurrency (empty when measured by a run)."""
    measured_by: MeasuredBy
    run_id: str
    """The run (or calibration run) that measured it."""
    measured_at: str
    """ISO 8601 UTC."""
    flags: tuple[str, ...] = ()
    """The engine flags it was measured with (:func:`engine_flags` of the deployment's ``server.extra_args``): a
    rate is used only for a run with the same ones."""
    samples: tuple[ModelSample, ...] = ()
    """The clean runs it rests on, oldest first, at most :data:`HISTORY`, all at ``capacity``: ``load_s`` and
    ``requests_per_s`` are their medians (empty: a calibration's, or a fact from before samples were kept)."""

    def runs(self) -> int:
        """How many measurements it rests on."""
        return max(1, len(self.samples))


PerRecord = dict[str, Annotated[float, msgspec.Meta(ge=0, le=10_000)]]
TokensPerRecord = dict[str, Annotated[float, msgspec.Meta(ge=0, le=100_000_000)]]
"""Per model alias, the input (or output) tokens its answers counted per record generated."""
CpuPerRequest = Annotated[float, msgspec.Meta(ge=0, le=3600)]


class RecipeSample(Frozen, frozen=True, kw_only=True):
    """What one run (or calibration) measured of a recipe (a :class:`RecipeFact` keeps the latest
    :data:`HISTORY`); a number it did not measure cleanly is None."""

    requests_per_record: PerRecord
    input_tokens_per_record: TokensPerRecord = msgspec.field(default_factory=dict)
    output_tokens_per_record: TokensPerRecord = msgspec.field(default_factory=dict)
    client_cpu_s_per_request: CpuPerRequest | None = None
    allocation_overhead_s: Seconds | None = None
    cpu_stage_records_per_s: Rate | None = None
    run_id: str
    measured_at: str


RECIPE_NUMBERS = ("client_cpu_s_per_request", "allocation_overhead_s", "cpu_stage_records_per_s")
"""A recipe fact's numbers besides its per-alias ones: each the median of the samples that measured it."""
PER_ALIAS = ("requests_per_record", "input_tokens_per_record", "output_tokens_per_record")
"""A recipe fact's numbers kept per model alias: each alias's the median of the samples that measured it."""


class RecipeFact(Frozen, frozen=True, kw_only=True):
    recipe_sha256: str
    """The recipe's digest as the run file names it (``Plan.recipe_facts_key()``: the same in every run of it)."""
    requests_per_record: PerRecord
    """Per model alias, the requests Data Designer sent per record generated (retries and health checks excluded)."""
    input_tokens_per_record: TokensPerRecord = msgspec.field(default_factory=dict)
    """Per model alias, the input tokens of those requests' answers per record (the bill's hosted spend; empty:
    not measured, or a fact from before tokens were kept)."""
    output_tokens_per_record: TokensPerRecord = msgspec.field(default_factory=dict)
    """Per model alias, the output tokens of those requests' answers per record."""
    client_cpu_s_per_request: CpuPerRequest | None = None
    """CPU-seconds of the Data Designer client per request to a deployed alias; None: not measured."""
    allocation_overhead_s: Seconds | None = None
    """Seconds a GPU allocation holds its GPUs beyond its model load and its generating: the job's start to the
    servers' start, the first request after ready, the end of its last shard to the job's end."""
    cpu_stage_records_per_s: Rate | None = None
    """Records one CPU-stage client worker generates per second (two-stage runs); None: not measured."""
    measured_by: MeasuredBy
    run_id: str
    measured_at: str
    samples: tuple[RecipeSample, ...] = ()
    """The runs it rests on, oldest first, at most :data:`HISTORY`: each number is the median of those that
    measured it (empty: a fact from before samples were kept, resting on its own numbers)."""

    def runs(self, number: str, alias: str | None = None) -> int:
        """How many runs its ``number`` (one of :data:`PER_ALIAS` of ``alias``, or of :data:`RECIPE_NUMBERS`)
        rests on."""
        return sum(1 for s in _recipe_samples(self) if _recipe_number(s, number, alias) is not None)


class ClientUsage(Frozen, frozen=True, kw_only=True):
    """What one client step (one attempt's Data Designer process) used, written by it when it ends."""

    cpu_s: Annotated[float, msgspec.Meta(ge=0)]
    """User + system CPU-seconds of the process (``resource.getrusage(RUSAGE_SELF)``)."""
    setup_cpu_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """Of ``cpu_s``, what the process had spent when its generation began (its imports, Data Designer's among
    them): no request's cost, so the facts' CPU per request leaves it out (0 in files from before it was kept)."""
    wall_s: Annotated[float, msgspec.Meta(ge=0)]
    """Seconds from its start to its end."""


class Facts(Frozen, frozen=True, kw_only=True):
    """Every fact of a workspace: at most one per model shape (its key) and one per recipe digest, the latest."""

    version: int = FACTS_VERSION
    models: tuple[ModelFact, ...] = ()
    recipes: tuple[RecipeFact, ...] = ()

    def __post_init__(self) -> None:
        if self.version != FACTS_VERSION:
            newer = "a newer" if self.version > FACTS_VERSION else "an unknown"
            raise ValueError(
                f"version {self.version}: written by {newer} ddslurm (this one reads version {FACTS_VERSION})"
            )

    def model(self, shape: ModelShape) -> ModelFact | None:
        return next((f for f in self.models if f.shape.key() == shape.key()), None)

    def recipe(self, recipe_sha256: str) -> RecipeFact | None:
        return next((f for f in self.recipes if f.recipe_sha256 == recipe_sha256), None)

    def with_model(self, fact: ModelFact) -> Facts:
        """These facts with ``fact`` in place of any earlier one of its shape."""
        kept = tuple(f for f in self.models if f.shape.key() != fact.shape.key())
        return msgspec.structs.replace(self, models=(*kept, fact))

    def with_model_run(self, fact: ModelFact) -> Facts:
        """These facts with one more clean run's measure of ``fact``'s shape: added to the earlier runs' of the same
        shape, capacity and engine flags (the latest :data:`HISTORY`), the fact's numbers their medians; a
        calibration's fact, or an earlier one at another capacity or with other flags, is replaced (rates measured
        under two conditions are not one measure)."""
        earlier = self.model(fact.shape)
        same = (
            earlier is not None
            and earlier.measured_by == "run"
            and (earlier.capacity, earlier.flags) == (fact.capacity, fact.flags)
        )
        history = (*(_samples(earlier) if same and earlier is not None else ()), _sample(fact))[-HISTORY:]
        merged = msgspec.structs.replace(
            fact,
            load_s=statistics.median(s.load_s for s in history),
            requests_per_s=statistics.median(s.requests_per_s for s in history),
            samples=history,
        )
        return self.with_model(merged)

    def with_recipe(self, fact: RecipeFact) -> Facts:
        """These facts with ``fact`` in place of any earlier one of its recipe."""
        kept = tuple(f for f in self.recipes if f.recipe_sha256 != fact.recipe_sha256)
        return msgspec.structs.replace(self, recipes=(*kept, fact))

    def with_recipe_run(self, fact: RecipeFact) -> Facts:
        """These facts with one more run's measure of ``fact``'s recipe: added to the earlier runs' (the latest
        :data:`HISTORY`), each number the median of the runs that measured it (a number this run did not measure
        cleanly, None, leaves the earlier runs' standing)."""
        earlier = self.recipe(fact.recipe_sha256)
        history = (*(_recipe_samples(earlier) if earlier is not None else ()), _recipe_sample(fact))[-HISTORY:]
        per_alias = {name: _medians_by_alias(history, name) for name in PER_ALIAS}
        merged = msgspec.structs.replace(
            fact,
            **per_alias,
            samples=history,
            **{name: _median_of(history, name) for name in RECIPE_NUMBERS},
        )
        return self.with_recipe(merged)


def _sample(fact: ModelFact) -> ModelSample:
    """What ``fact`` itself says one run measured."""
    return ModelSample(
        load_s=fact.load_s, requests_per_s=fact.requests_per_s, run_id=fact.run_id, measured_at=fact.measured_at
    )


def _samples(fact: ModelFact) -> tuple[ModelSample, ...]:
    """The runs a fact rests on; a fact from before samples were kept rests on its own numbers."""
    return fact.samples or (_sample(fact),)


def _recipe_sample(fact: RecipeFact) -> RecipeSample:
    """What ``fact`` itself says one run measured."""
    return RecipeSample(
        requests_per_record=fact.requests_per_record,
        input_tokens_per_record=fact.input_tokens_per_record,
        output_tokens_per_record=fact.output_tokens_per_record,
        client_cpu_s_per_request=fact.client_cpu_s_per_request,
        allocation_overhead_s=fact.allocation_overhead_s,
        cpu_stage_records_per_s=fact.cpu_stage_records_per_s,
        run_id=fact.run_id,
        measured_at=fact.measured_at,
    )


def _recipe_samples(fact: RecipeFact) -> tuple[RecipeSample, ...]:
    return fact.samples or (_recipe_sample(fact),)


def _recipe_number(sample: RecipeSample, number: str, alias: str | None = None) -> float | None:
    if number in PER_ALIAS:
        per_alias: dict[str, float] = getattr(sample, number)
        return per_alias.get(alias or "")
    value: float | None = getattr(sample, number)
    return value


def _medians_by_alias(samples: Sequence[RecipeSample], number: str) -> dict[str, float]:
    """Per alias any sample measured ``number`` (one of :data:`PER_ALIAS`) of, the median of those samples'."""
    aliases = sorted({a for s in samples for a in getattr(s, number)})
    medians = {a: _median_of(samples, number, a) for a in aliases}
    return {a: v for a, v in medians.items() if v is not None}


def _median_of(samples: Sequence[RecipeSample], number: str, alias: str | None = None) -> float | None:
    values = [v for s in samples if (v := _recipe_number(s, number, alias)) is not None]
    return round(statistics.median(values), 6) if values else None


def facts_path(workspace: Path) -> Path:
    return workspace / FACTS_FILE


def read_facts(path: Path) -> Facts:
    """The facts at ``path``; none (empty) when the file does not exist. Only the user's own file is read: one that
    is not (a symbolic link, a FIFO or anything but a regular file, another user's, one others can write) is an
    :class:`~ddslurm.config.UnsafePathError` saying why, never opened in a way that blocks (:func:`own_facts`
    ignores it). A file that cannot be read as facts (not JSON, another version, a value out of its range: a rate
    of 0 or less, a negative or week-long duration) is a :class:`~ddslurm.config.ConfigError` naming it and the
    field."""
    try:
        return read_json(path, Facts, own=True)
    except FileNotFoundError:
        return Facts()


def own_facts(path: Path) -> tuple[Facts, str | None]:
    """The facts at ``path`` a plan may rest on, and, when the file is not the user's own (:func:`read_facts`),
    none and the warning that says so: another user could have planted it to steer the planner."""
    try:
        return read_facts(path), None
    except UnsafePathError as exc:
        return Facts(), (
            f"{exc}: its measured facts are ignored (only your own facts file is trusted; another user could have "
            f"planted this one); remove it (rm {path}) and your next run records facts of its own"
        )


def write_facts(path: Path, facts: Facts) -> None:
    """Replace the facts at ``path`` atomically: a new file of this user's (0600) renamed into place, never a write
    into whatever is there."""
    atomic_write(path, encode_pretty(facts))


def facts_lock(path: Path) -> Path:
    """The lock file of the facts at ``path`` (``facts.json.lock``)."""
    return path.with_name(path.name + ".lock")


def update_facts(path: Path, change: Callable[[Facts], Facts], *, wait_s: float = LOCK_WAIT_S) -> Facts:
    """Read, change and write the facts at ``path`` under a lock (``facts.json.lock``, waited for at most
    ``wait_s`` seconds: then a :class:`~ddslurm.config.ConfigError` naming it and its holder), so that two runs
    ending at once both land; returns what was written (nothing is written when ``change`` returns the facts
    unchanged). A facts file that is not the user's own is ignored (:func:`own_facts`): the change starts from no
    facts, and what it adds is written as a new file of the user's own in its place."""
    with exclusive_lock(facts_lock(path), wait_s=wait_s):
        before, _ = own_facts(path)
        after = change(before)
        if after != before:
            write_facts(path, after)
        return after


def calibration_levels(capacity: int) -> tuple[int, ...]:
    """The concurrency levels a ``ddslurm tune`` sweep measures a replica of ``capacity`` at: the powers of two
    below it, then the capacity itself (``6`` -> ``(1, 2, 4, 6)``)."""
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, got {capacity}")
    powers = tuple(1 << k for k in range(capacity.bit_length()) if 1 << k < capacity)
    return (*powers, capacity)


class CalibrationEntry(Frozen, frozen=True, kw_only=True):
    """What a calibration allocation measured of one deployed alias."""

    alias: str
    load_s: float
    """Seconds from the first server step's start to every replica of the alias answering."""
    sweep: tuple[ConcurrencyPoint, ...]
    """Requests per second of one replica at each concurrency level, replaying the recipe's own requests."""
    prompts: int
    """How many distinct recorded requests the sweep replayed."""


class Calibration(Frozen, frozen=True, kw_only=True):
    """``calibration.json`` of a ``ddslurm tune`` allocation (its serving directory)."""

    entries: tuple[CalibrationEntry, ...]
