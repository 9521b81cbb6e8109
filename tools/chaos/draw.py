"""What one scenario of the fault campaign is, drawn from one integer seed (``random.Random(seed)``).

Everything here is pure: the same seed gives the same scenario on every machine, so a failing scenario is
rerun alone with ``--only SEED``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Placement = Literal["hosted", "local", "mixed"]
Seeding = Literal["ordered", "shuffle", "seedless"]

PLACEMENTS: tuple[Placement, ...] = ("hosted", "local", "mixed")
SEEDINGS: tuple[Seeding, ...] = ("ordered", "shuffle", "seedless")
LAYOUTS = ("per_shard", "pulling")
STAGES = ("auto", "single")

# Every fault kind, and which recipes it applies to (a server, proxy or slow load needs a deployment; a hosted
# fault or a time limit, a hosted alias the harness controls).
FAULT_KINDS: tuple[str, ...] = (
    "kill_client",
    "kill_server",
    "kill_proxy",
    "kill_batch",
    "scancel_task",
    "cancel_run",
    "requeue",
    "node_down",
    "time_limit",
    "hosted_500",
    "hosted_timeout",
    "hosted_malformed",
    "slow_load",
    "crashing_replica",
    "hosted_429",
)
RECOVERY_KINDS: tuple[str, ...] = ("kill_client", "kill_server", "kill_batch", "scancel_task", "requeue")
NEEDS_DEPLOYMENT = frozenset({"kill_server", "kill_proxy", "slow_load", "crashing_replica"})
NEEDS_HOSTED = frozenset({"time_limit", "hosted_500", "hosted_timeout", "hosted_malformed", "hosted_429"})
# Relative weights of the kinds (a time limit costs two minutes and more: rarer).
WEIGHTS: dict[str, int] = {
    "kill_client": 4,
    "kill_server": 3,
    "kill_proxy": 2,
    "kill_batch": 4,
    "scancel_task": 3,
    "cancel_run": 3,
    "requeue": 3,
    "node_down": 2,
    "time_limit": 1,
    "hosted_500": 3,
    "hosted_timeout": 2,
    "hosted_malformed": 2,
    "slow_load": 2,
    "crashing_replica": 2,
    "hosted_429": 2,
}


@dataclass(frozen=True)
class Sizes:
    """The ranges a profile draws its numbers from (the same draws in the same order in every profile: a seed's
    recipe is the same in each, what is drawn after the numbers may differ)."""

    records: tuple[int, int]
    seed_rows: tuple[int, int]
    max_shards: int
    fault_duration: tuple[float, float]


PROFILES: dict[str, Sizes] = {
    "full": Sizes(records=(5, 40), seed_rows=(3, 30), max_shards=7, fault_duration=(5.0, 25.0)),
    # What CI runs: a third of the CPU of a full scenario (each allocation costs a batch step, a controller, a
    # Data Designer import per client and its servers), so that 30 scenarios fit in 12 minutes on 2 cores.
    "compact": Sizes(records=(5, 24), seed_rows=(3, 16), max_shards=3, fault_duration=(5.0, 12.0)),
}


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    """Seconds after the run's first attempt is running (hosted faults and slow loads: see ``duration``)."""
    duration: float = 0.0
    """Hosted faults: how long the provider misbehaves before it heals; node_down: how long the node is down."""
    rate: float = 0.0
    """hosted_500 / hosted_malformed: the fraction of requests answered badly."""
    after_rows: float = 0.0
    """When > 0: inject once the run's attempts have generated this fraction of its records (their
    ``progress.json``; a two-stage run counts both stages), instead of ``at`` seconds after the first attempt
    runs; ``at`` is then the fallback should the rows never get there."""

    def describe(self) -> str:
        when = f"@{self.after_rows:.0%}rows" if self.after_rows else f"@{self.at:.0f}s"
        extra = f" for {self.duration:.0f}s" if self.duration else ""
        extra += f" rate {self.rate:.2f}" if self.rate else ""
        return f"{self.kind}{when}{extra}"


@dataclass(frozen=True)
class Scenario:
    seed: int
    placement: Placement
    seeding: Seeding
    drop: bool
    records: int
    seed_rows: int
    """Rows of the seed dataset (0 for seedless recipes)."""
    shards: int
    buffer_size: int | None
    """None: the run file leaves it out and the planner chooses the batches (checkpoints by default)."""
    layout: str
    allocations: int
    client_workers: int
    cpus: int
    stages: str
    retries: int
    client_retries: int
    replicas: int
    """Replicas of the local deployment (1 for hosted-only recipes, which have none)."""
    latency: float
    """Seconds per request of every stand-in (local servers and the hosted provider)."""
    startup_delay: float
    """FAKE_VLLM_STARTUP_DELAY of the local servers (a slow model load)."""
    time_limit_minutes: int
    accept_partial: bool
    """Whether the recovery may give up on missing rows with ``ddslurm accept-partial``."""
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    recovery_fault: Fault | None = None
    """A fault injected ``at`` seconds after the recovery's first ``retry`` (if it needs one): a second blow."""
    profile: str = "full"
    """The :data:`PROFILES` entry the numbers were drawn from (``--only SEED --profile P`` reruns it)."""

    @property
    def has_deployment(self) -> bool:
        return self.placement in ("local", "mixed")

    @property
    def has_hosted(self) -> bool:
        return self.placement in ("hosted", "mixed")

    @property
    def recipe_key(self) -> str:
        return f"{self.placement}-{self.seeding}{'-drop' if self.drop else ''}"

    def describe(self) -> str:
        layout = (
            f"pull a={self.allocations} w={self.client_workers}"
            if self.layout == "pulling"
            else f"per-shard w={self.client_workers}"
        )
        seeds = f" seed_rows={self.seed_rows}" if self.seed_rows else ""
        profile = "" if self.profile == "full" else f"{self.profile} "
        return (
            f"{profile}{self.recipe_key} rec={self.records}{seeds} shards={self.shards} buf={self.buffer_size} "
            f"{layout} "
            f"stages={self.stages} retries={self.retries} cr={self.client_retries} rep={self.replicas} "
            f"lat={self.latency:.2f} load={self.startup_delay:.0f}s tl={self.time_limit_minutes}m"
            f"{' accept-partial' if self.accept_partial else ''}"
        )

    def describe_faults(self) -> str:
        text = ", ".join(f.describe() for f in self.faults)
        if self.recovery_fault is not None:
            text += f", then {self.recovery_fault.kind}@{self.recovery_fault.at:.0f}s after the first retry"
        return text

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def applicable(kind: str, placement: Placement, replicas: int) -> bool:
    if kind in NEEDS_DEPLOYMENT and placement == "hosted":
        return False
    if kind in NEEDS_HOSTED and placement == "local":
        return False
    return not (kind == "kill_proxy" and replicas < 2)


def draw(seed: int, profile: str = "full") -> Scenario:
    """The scenario of ``seed`` in ``profile``: one ``random.Random(seed)``, drawn in a fixed order."""
    sizes = PROFILES[profile]
    rng = random.Random(seed)
    placement: Placement = rng.choice(PLACEMENTS)
    seeding: Seeding = rng.choice(SEEDINGS)
    drop = rng.random() < 0.3
    records = rng.randint(*sizes.records)
    seed_rows = rng.randint(*sizes.seed_rows) if seeding != "seedless" else 0
    shards = rng.randint(1, min(sizes.max_shards, records))
    buffer_size = rng.randint(2, 7)
    layout = rng.choice(LAYOUTS) if shards >= 2 else "per_shard"
    client_workers = rng.randint(1, 3) if layout == "pulling" else 1
    allocations = rng.randint(1, shards - 1) if layout == "pulling" else shards
    cpus = client_workers + rng.randint(0, 1)
    stages = rng.choice(STAGES)
    retries = rng.randint(0, 3)
    client_retries = rng.randint(0, 1)
    replicas = rng.randint(1, 2) if placement != "hosted" else 1
    # mostly quick stand-ins; one scenario in five slow enough that faults land inside long batches
    latency = round(rng.uniform(0.1, 0.8), 2) if rng.random() < 0.8 else round(rng.uniform(1.5, 3.0), 2)
    accept_partial = rng.random() < 0.25
    kinds = [k for k in FAULT_KINDS if applicable(k, placement, replicas)]
    count = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
    faults: list[Fault] = []
    for _ in range(count):
        kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        if kind == "time_limit" and any(f.kind == "time_limit" for f in faults):
            continue
        at = round(rng.uniform(0.0, 15.0), 1)
        timed = kind.startswith("hosted_") or kind == "node_down"
        duration = round(rng.uniform(*sizes.fault_duration), 1) if timed else 0.0
        rate = round(rng.uniform(0.3, 1.0), 2) if kind in ("hosted_500", "hosted_malformed") else 0.0
        after_rows = round(rng.uniform(0.1, 0.8), 2) if rng.random() < 0.6 else 0.0
        if kind == "slow_load":
            at, duration, after_rows = 0.0, float(rng.randint(5, 20)), 0.0
        elif kind == "crashing_replica":  # every life of each replica ends after `duration` chat requests
            at, duration, after_rows = 0.0, float(rng.randint(4, 10)), 0.0
        elif kind == "time_limit":
            after_rows = 0.0
        elif after_rows:
            at = 90.0
        faults.append(Fault(kind, at, duration, rate, after_rows))
    faults.sort(key=lambda f: f.at)
    slow = next((f for f in faults if f.kind == "slow_load"), None)
    startup_delay = slow.duration if slow else float(rng.choice((0, 1, 2)))
    time_limit_minutes = 2 if any(f.kind == "time_limit" for f in faults) else 10
    recovery_fault = None
    if rng.random() < 0.3:
        second = [k for k in RECOVERY_KINDS if applicable(k, placement, replicas)]
        recovery_fault = Fault(rng.choice(second), round(rng.uniform(0.0, 20.0), 1))
    if rng.random() < 0.3:  # drawn last, so the draws above are the same as before it was added
        buffer_size = None
    return Scenario(
        seed=seed,
        placement=placement,
        seeding=seeding,
        drop=drop,
        records=records,
        seed_rows=seed_rows,
        shards=shards,
        buffer_size=buffer_size,
        layout=layout,
        allocations=allocations,
        client_workers=client_workers,
        cpus=cpus,
        stages=stages,
        retries=retries,
        client_retries=client_retries,
        replicas=replicas,
        latency=latency,
        startup_delay=startup_delay,
        time_limit_minutes=time_limit_minutes,
        accept_partial=accept_partial,
        faults=tuple(faults),
        recovery_fault=recovery_fault,
        profile=profile,
    )
