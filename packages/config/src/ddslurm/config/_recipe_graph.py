"""A recipe's column graph: the facts Data Designer's column configs give about each column
(:class:`RecipeColumn`), the edges Data Designer's execution graph has between them (:class:`ColumnGraph`), and the
one column order a dataset of the recipe is put in (:func:`final_columns`).

The facts are read with Data Designer's own config types where Data Designer is installed (the runtime's
``recipe_columns``); everything here works on them without Data Designer. Data Designer facts this relies on
(data-designer 0.9.7, ``data_designer.config`` and ``engine``; the order of output columns alike in 0.8.0 and
1.0.0rc1):

- Dependencies are the column configs' own ``required_columns`` plus ``skip.when`` columns, resolved through
  ``side_effect_columns`` to the producing column: exactly the edges ``ExecutionGraph.create`` builds. Model
  use is ``get_model_aliases()`` (what DD's start-up health check pings: only aliases that columns use).
- Seed columns are not in the recipe: DD appends one ``seed-dataset`` column per seed column at compile time.
  A reference that names no recipe column (nor a side effect of one) is a seed column.
- The output column order is the order in which the cells of a batch's first row were written (its rows are dicts
  filled cell by cell; ``pd.DataFrame(rows)`` keeps that order, and ``load_dataset`` keeps the first file's). Every
  task writes when it finishes: a row's cell after its inputs', a column's side-effect columns right after it, the
  seed reader's columns together in the seed's order, the samplers' together in recipe order; tasks that do not
  depend on each other land in the order they finish, which timing decides (seed columns and samplers swap places
  between runs of one process; two model columns over the same input come in the order their replies arrive; an
  expression waits for every row of its row group, so with row groups larger than the models'
  ``max_parallel_requests`` the first row's later model columns overtake it). So no rule gives every run's order;
  :func:`final_columns` gives the order Data Designer writes when a row group's model calls run at once and each
  takes the same time, and nothing else takes any (:func:`write_order`): the order of every run that leaves no
  such race. The planner records it for every run, and collection puts hosted-only, single- and two-stage
  datasets alike in it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgspec

from ddslurm.config._recipe import is_drop_processor, recipe_processors


class RecipeColumn(msgspec.Struct, frozen=True, kw_only=True):
    """What Data Designer's config of one recipe column says about it."""

    name: str
    column_type: str
    aliases: tuple[str, ...]
    """The model aliases the column uses (``get_model_aliases()``)."""
    refs: tuple[str, ...]
    """Names the column reads: ``required_columns`` and ``skip.when`` columns, as written."""
    required: tuple[str, ...]
    """``required_columns`` only (what skips propagate along)."""
    side_effects: tuple[str, ...]
    drop: bool
    skips: bool
    propagate_skip: bool
    sampler_type: str | None


class ColumnGraph:
    """The recipe's columns in recipe order and the edges Data Designer's execution graph has between them."""

    def __init__(self, columns: Sequence[RecipeColumn]) -> None:
        self.columns = {c.name: c for c in columns}
        self.order = {c.name: i for i, c in enumerate(columns)}
        self.side_effect_of = {se: c.name for c in columns for se in c.side_effects}

    def producer(self, ref: str) -> str | None:
        """The recipe column that makes ``ref`` (itself, or the column it is a side effect of); None: a seed
        column."""
        if ref in self.columns:
            return ref
        return self.side_effect_of.get(ref)

    def upstream(self, name: str, refs: Sequence[str] | None = None) -> list[str]:
        out: list[str] = []
        for ref in self.columns[name].refs if refs is None else refs:
            p = self.producer(ref)
            if p is not None and p != name and p not in out:
                out.append(p)
        return out

    def closure(self, names: Collection[str]) -> set[str]:
        """``names`` and every recipe column they depend on, directly or transitively."""
        seen: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.upstream(name))
        return seen

    def path(self, start: str, goal: Collection[str]) -> list[str]:
        """A dependency path from ``start`` to the first column of ``goal`` it reaches (breadth first)."""
        parent: dict[str, str | None] = {start: None}
        queue = [start]
        for name in queue:
            if name in goal and name != start:
                chain = [name]
                while (prev := parent[chain[-1]]) is not None:
                    chain.append(prev)
                return chain[::-1]
            for up in sorted(self.upstream(name), key=self.order.__getitem__):
                if up not in parent:
                    parent[up] = name
                    queue.append(up)
        return [start]

    def skippable(self) -> set[str]:
        """Columns whose cells Data Designer may skip: a ``skip`` of their own, or a skip propagated from a
        required column (``propagate_skip``)."""
        out: set[str] = set()
        changed = True
        while changed:
            changed = False
            for c in self.columns.values():
                if c.name in out:
                    continue
                if c.skips or (c.propagate_skip and any(p in out for p in self.upstream(c.name, c.required))):
                    out.add(c.name)
                    changed = True
        return out

    def in_order(self, names: Collection[str]) -> tuple[str, ...]:
        return tuple(sorted(names, key=self.order.__getitem__))


KNOWN_PROCESSORS = frozenset({"drop_columns", "schema_transform"})
"""Processor types whose effect on the dataset's columns is known: ``drop_columns`` removes the columns it names,
``schema_transform`` writes its own output beside the dataset and leaves the dataset as it was."""


def dd_compile_order(columns: Sequence[RecipeColumn]) -> tuple[str, ...]:
    """The recipe's columns in Data Designer's compile order (``compile_dataset_builder_column_configs``): the
    samplers (recipe order), then the other columns in the order of its topological sort (Kahn's algorithm over
    ``required_columns`` and ``skip.when`` edges between non-sampler columns, side effects resolved to their
    producer). Data Designer takes a column's dependents from a set; here they come in recipe order."""
    graph = ColumnGraph(columns)
    samplers = [c.name for c in graph.columns.values() if c.column_type == "sampler"]
    dag = [n for n in graph.columns if graph.columns[n].column_type != "sampler"]
    inside = set(dag)
    upstream = {n: [p for p in graph.upstream(n) if p in inside] for n in dag}
    downstream: dict[str, list[str]] = {n: [] for n in dag}
    for name in dag:
        for producer in upstream[name]:
            downstream[producer].append(name)
    waiting = {n: len(upstream[n]) for n in dag}
    queue = [n for n in dag if not waiting[n]]
    for name in queue:  # the queue grows while it is read: breadth first, as Data Designer's deque
        for child in downstream[name]:
            waiting[child] -= 1
            if not waiting[child]:
                queue.append(child)
    placed = set(queue)
    return (*samplers, *queue, *(n for n in dag if n not in placed))  # a cycle (refused by DD): recipe order


def write_order(columns: Sequence[RecipeColumn]) -> tuple[str, ...]:
    """The recipe's columns in the order Data Designer writes a row's cells when a row group's model calls run at
    once and each takes the same time, and nothing else takes any: by the model calls on the longest dependency
    chain that ends with the column (a sampler or seed column: none; a column that uses a model: one more than the
    most of its inputs; any other column: the most of its inputs), ties in compile order
    (:func:`dd_compile_order`). Seed columns, not recipe columns, go before all of these (:func:`final_columns`):
    Data Designer dispatches the seed reader before the samplers."""
    graph = ColumnGraph(columns)
    compiled = dd_compile_order(columns)
    calls: dict[str, int] = {}
    for name in compiled:  # topological: a column's producers have their count before it
        before = max((calls.get(p, 0) for p in graph.upstream(name)), default=0)
        calls[name] = before + (1 if graph.columns[name].aliases else 0)
    rank = {name: i for i, name in enumerate(compiled)}
    return tuple(sorted(compiled, key=lambda n: (calls[n], rank[n])))


def final_columns(
    recipe: Mapping[str, Any], columns: Sequence[RecipeColumn], seed_columns: Sequence[str]
) -> tuple[str, ...] | None:
    """The columns of the recipe's dataset in the order Data Designer writes them (:func:`write_order`):
    ``seed_columns`` (the seed dataset's columns in its order, ``()`` without a seed), then the recipe's columns,
    each followed by its side-effect columns; minus what ``drop: true`` and ``drop_columns`` processors remove.
    None when a processor of another type than :data:`KNOWN_PROCESSORS` (a plugin's) may change the columns.

    ``columns``: the recipe's columns (:class:`RecipeColumn`), in recipe order. Collection puts single- and
    two-stage datasets alike in this order (see the module docstring for why one rule, not each run's own order).
    """
    processors = recipe_processors(recipe)
    if any(str(p.get("processor_type")) not in KNOWN_PROCESSORS for p in processors):
        return None
    graph = ColumnGraph(columns)
    names: list[str] = list(seed_columns)
    for name in write_order(columns):
        names.append(name)
        names.extend(graph.columns[name].side_effects)
    dropped = {c.name for c in graph.columns.values() if c.drop}
    for p in processors:
        if is_drop_processor(p):
            for pattern in p.get("column_names") or []:
                dropped.update(fnmatch.filter(names, pattern) if "*" in pattern else [pattern])
    return tuple(n for n in names if n not in dropped)
