"""A recipe's column graph: the facts Data Designer's column configs give about each column
(:class:`RecipeColumn`), the edges Data Designer's execution graph has between them (:class:`ColumnGraph`), and the
one column order a dataset of the recipe is put in (:func:`final_columns`).

The facts are read with Data Designer's own config types where Data Designer is installed (the runtime's
``recipe_columns``); everything here works on them without Data Designer. Data Designer facts this relies on
(data-designer 0.9.7, ``data_designer.config`` and ``engine``):

- Dependencies are the column configs' own ``required_columns`` plus ``skip.when`` columns, resolved through
  ``side_effect_columns`` to the producing column: exactly the edges ``ExecutionGraph.create`` builds. Model
  use is ``get_model_aliases()`` (what DD's start-up health check pings: only aliases that columns use).
- Seed columns are not in the recipe: DD appends one ``seed-dataset`` column per seed column at compile time.
  A reference that names no recipe column (nor a side effect of one) is a seed column.
- The output column order is the order cells were first written, which depends on which task finished first:
  seed columns and samplers swap places from run to run, and independent columns (an expression and a judge over
  the same column) come in completion order. It is not derivable, so :func:`final_columns` defines one order,
  Data Designer's compile order (seed columns, samplers, the other columns in dependency order, ties in recipe
  order), for single- and two-stage datasets alike.
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


def final_columns(
    recipe: Mapping[str, Any], columns: Sequence[RecipeColumn], seed_columns: Sequence[str]
) -> tuple[str, ...]:
    """The columns of the recipe's dataset in one defined order: ``seed_columns`` (the seed dataset's columns in
    its order, ``()`` without a seed), the samplers, then the other columns in dependency order (ties in recipe
    order), each followed by its side-effect columns; minus what ``drop: true`` and ``drop_columns``
    processors remove.

    ``columns``: the recipe's columns (:class:`RecipeColumn`), in recipe order. Data Designer itself writes
    columns in the order their cells were first written, which changes from run to run (see the module
    docstring): reorder single- and two-stage datasets alike by this order.
    """
    graph = ColumnGraph(columns)
    samplers = [c.name for c in graph.columns.values() if c.column_type == "sampler"]
    done: set[str] = set(samplers)
    ordered: list[str] = []
    pending = [n for n in graph.columns if n not in done]
    while pending:  # stable topological order: the first pending column whose producers are all placed
        name = next((n for n in pending if all(p in done for p in graph.upstream(n))), pending[0])
        pending.remove(name)
        done.add(name)
        ordered.append(name)
    names: list[str] = list(seed_columns)
    for name in [*samplers, *ordered]:
        names.append(name)
        names.extend(graph.columns[name].side_effects)
    dropped = {c.name for c in graph.columns.values() if c.drop}
    for p in recipe_processors(recipe):
        if is_drop_processor(p):
            for pattern in p.get("column_names") or []:
                dropped.update(fnmatch.filter(names, pattern) if "*" in pattern else [pattern])
    return tuple(n for n in names if n not in dropped)
