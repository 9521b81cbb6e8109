"""The layout search: every candidate of allocations, replicas and client workers within the GPU budget, predicted
by the cost model, and the one the rule picks (the fewest GPU-hours that meet the deadline, or a faster one
within 2 % of them)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ddslurm.config import LayoutChoice, Prediction, RunFile
from ddslurm.planner._cost import Candidate, CostInputs, allocation_gpus, node_misfit, predict
from ddslurm.planner.errors import PlanError

NEAR_SHARE = 0.02
"""A layout within this share of the fewest GPU-hours that ends sooner is chosen instead: speed bought unasked only
where it is about free (fewest GPU-hours is the promise; ``deadline`` is how a run asks for speed). At 5 % a budget
of 2 GPUs for a 5 s load and two minutes of work got two replicas, predicted 3.9 % and measured 8 % dearer."""
TIME_LIMIT_SHARE = 0.8
"""A layout is considered only if its longest allocation is predicted to end within this share of
``submission.time_limit`` (the prediction's error, and the time limit is Slurm's to enforce); when none is,
every layout is (an allocation the limit ends is retried automatically, its shards' batches resumed)."""


@dataclass(frozen=True, slots=True)
class Choice:
    prediction: Prediction
    candidate: Candidate


def _replica_options(run: RunFile, per_node: int, spans: Sequence[int], inputs: CostInputs) -> list[tuple[int, ...]]:
    """Replicas per allocation of each deployment: a number the run file sets; for ``replicas: auto`` with ``gpus``
    every count whose replicas fit the node (a replica spanning nodes: 1), without ``gpus`` 1. Combinations whose
    replicas do not fit one node together are left out."""
    options: list[Sequence[int]] = []
    for dep, span, cost in zip(run.deployments, spans, inputs.deployments, strict=True):
        if isinstance(dep.replicas, int):
            options.append((dep.replicas,))
        elif run.gpus is None or span > 1:
            options.append((1,))
        else:
            options.append(range(1, max(1, per_node // cost.gpus) + 1))
    combos = [tuple(c) for c in itertools.product(*options)]
    if all(span == 1 for span in spans):
        fitting = [c for c in combos if allocation_gpus(c, inputs) <= per_node]
        return fitting or combos[:1]
    return combos


def _allocation_options(shards: int, workers: int, cap: int) -> set[int]:
    """Pulling allocation counts worth predicting for ``workers`` workers each: for every number of rounds k (shards
    a worker runs), the fewest allocations that need no more (more of them load more servers for the same rounds),
    and the most the budget runs at once; plus one task per shard."""
    counts = {math.ceil(shards / (workers * k)) for k in range(1, math.ceil(shards / workers) + 1)}
    counts.add(min(cap, shards))
    return {a for a in counts if a <= cap} | {shards}


def _node_gpus(replicas: Sequence[int], per_node: int, spans: Sequence[int], inputs: CostInputs) -> int:
    """GPUs an allocation of ``replicas`` holds on one node: all of them, or a node's when a replica spans nodes."""
    return per_node if any(span > 1 for span in spans) else allocation_gpus(replicas, inputs)


def candidates(
    run: RunFile, per_node: int, spans: Sequence[int], inputs: CostInputs, budget: int
) -> Iterator[Candidate]:
    """Every layout within ``budget`` GPUs at once; the numbers the run file sets stay as set."""
    shards = len(inputs.shard_records)
    throttle = run.max_concurrent or shards
    nodes = inputs.nodes
    for replicas in _replica_options(run, per_node, spans, inputs):
        cap = min(budget // allocation_gpus(replicas, inputs), throttle)
        if nodes is not None:  # only what the partition's nodes hold: a node's CPUs, GPUs and memory, its nodes at once
            if node_misfit(replicas, _node_gpus(replicas, per_node, spans, inputs), inputs) is not None:
                continue
            # (one allocation at least: one that needs more nodes than the partition has is refused by the job
            # check, which names the replica's shape)
            cap = min(cap, max(1, nodes.nodes // max(1, *spans)))
        if cap < 1:
            continue
        if isinstance(run.client_workers, int):
            worker_options: Sequence[int] = (min(run.client_workers, shards),)
        else:
            worker_options = range(1, max(1, min(inputs.cpus, sum(replicas), shards)) + 1)
        for workers in worker_options:
            if isinstance(run.allocations, int):
                counts: set[int] = {run.allocations}
            else:
                counts = _allocation_options(shards, workers, cap)
            for count in sorted(counts):
                if count == shards:  # one task per shard: one worker, the throttle makes waves
                    if workers == worker_options[0]:
                        yield Candidate(count, replicas, 1, min(cap, shards))
                    continue
                if not isinstance(run.client_workers, int) and workers > math.ceil(shards / count):
                    continue
                yield Candidate(count, replicas, workers, min(cap, count))


def _layout(choice: LayoutChoice) -> tuple[int, tuple[int, ...], int]:
    return choice.allocations, choice.replicas, choice.client_workers


def choose(
    run: RunFile,
    per_node: int,
    spans: Sequence[int],
    inputs: CostInputs,
    budget: int,
    deadline_s: int | None,
    time_limit_s: int,
) -> Choice:
    """The layout the rule picks among :func:`candidates` whose allocations end within ``time_limit_s``
    (:data:`TIME_LIMIT_SHARE`; all of them when none does), with the next two as runners-up."""
    predicted: dict[tuple[int, tuple[int, ...], int], tuple[LayoutChoice, Candidate]] = {}
    for candidate in candidates(run, per_node, spans, inputs, budget):
        choice = predict(candidate, inputs)
        predicted.setdefault(_layout(choice), (choice, candidate))
    if not predicted:
        nodes = inputs.nodes
        options = sorted(_replica_options(run, per_node, spans, inputs), key=sum)
        misfits = [node_misfit(r, _node_gpus(r, per_node, spans, inputs), inputs) for r in options]
        if nodes is not None and options and all(misfits):
            raise PlanError(
                f"no layout fits a node of partition {nodes.partition}: the smallest allocation asks for "
                f"{misfits[0]}; lower them, or use fewer replicas"
            )
        raise PlanError(
            f"gpus: {budget} GPUs at once, but no layout of the run's fixed numbers fits in them (allocations, "
            "client_workers, replicas as set)"
        )
    layouts = [c for c, _ in predicted.values()]
    in_time = [c for c in layouts if c.allocation_s <= time_limit_s * TIME_LIMIT_SHARE]
    outlast = len(in_time) < len(layouts)
    layouts = in_time or layouts

    def fastest(c: LayoutChoice) -> tuple[float, float, tuple[int, tuple[int, ...], int]]:
        return c.wall_s, c.gpu_hours, _layout(c)

    def cheapest(c: LayoutChoice) -> tuple[float, float, tuple[int, tuple[int, ...], int]]:
        return c.gpu_hours, c.wall_s, _layout(c)

    meeting = [c for c in layouts if deadline_s is None or c.wall_s <= deadline_s]
    within = f"within gpus: {budget} at once" if run.gpus is not None else f"within the {budget} GPUs at once"
    by = f" predicted to end by the deadline ({deadline_s} s)" if deadline_s is not None else ""
    if meeting:
        least = min(c.gpu_hours for c in meeting)
        near = sorted((c for c in meeting if c.gpu_hours <= least * (1 + NEAR_SHARE)), key=fastest)
        rest = sorted((c for c in meeting if c.gpu_hours > least * (1 + NEAR_SHARE)), key=cheapest)
        late = sorted((c for c in layouts if deadline_s is not None and c.wall_s > deadline_s), key=fastest)
        ordered = [*near, *rest, *late]
        rule = (
            f"the fewest GPU-hours among the layouts {within}{by}; a layout within "
            f"{NEAR_SHARE:.0%} of them that ends sooner wins (the fastest of those)"
        )
    else:
        ordered = sorted(layouts, key=fastest)
        rule = f"no layout {within} is{by}: the fastest"
    if outlast:
        rule += (
            f"; among the layouts whose longest allocation is predicted to end within {TIME_LIMIT_SHARE:.0%} of "
            f"submission.time_limit ({time_limit_s} s)"
            if in_time
            else f"; no layout's allocations are predicted to end within {TIME_LIMIT_SHARE:.0%} of "
            f"submission.time_limit ({time_limit_s} s): among them all (the limit's retries resume the shards)"
        )
    chosen = ordered[0]
    return Choice(
        prediction=Prediction(
            chosen=chosen,
            runners_up=tuple(ordered[1:3]),
            facts=inputs.facts,
            budget_gpus=run.gpus,
            deadline_s=deadline_s,
            meets_deadline=bool(meeting),
            rule=rule,
        ),
        candidate=predicted[_layout(chosen)][1],
    )
