"""``stages: auto``: split a recipe's column graph into a GPU stage and a CPU stage (pure functions).

A mixed recipe has columns that a local model (vLLM inside the GPU job) generates and columns that only hosted
models generate. :func:`split_stages` puts every column that needs a local model, and everything those columns
depend on, in a GPU stage; every other column goes to a CPU stage that reads the GPU stage's output as its seed
dataset (:func:`stage_recipe`). The two-stage dataset then holds what the single-stage one holds, column for
column; :func:`final_columns` gives the one column order to put either in.

Data Designer facts this relies on (data-designer 0.9.7, ``data_designer.config`` and ``engine``):

- Dependencies are the column configs' own ``required_columns`` plus ``skip.when`` columns, resolved through
  ``side_effect_columns`` to the producing column: exactly the edges ``ExecutionGraph.create`` builds. Model
  use is ``get_model_aliases()`` (what DD's start-up health check pings: only aliases that columns use).
- Seed columns are not in the recipe: DD appends one ``seed-dataset`` column per seed column at compile time.
  A reference that names no recipe column (nor a side effect of one) is a seed column, available in both
  stages (stage 2 gets the seed columns through stage 1's output).
- Sampler columns are generated together, by one generator per row group, with ``constraints``, conditional
  params and subcategory parents between them: they stay in one stage.
- ``drop: true`` removes only the column itself (DD's default ``drop_columns`` processor runs after each batch,
  after every column of the batch exists); its side-effect columns stay. A ``drop_columns`` processor drops the
  columns it names (globs against the batch's columns) and is what DD itself uses to drop seed columns
  (``_mark_processor_dropped_seed_columns``): stage 2 drops the columns stage 1 kept only for it that way.
- The output column order is the order cells were first written, which depends on which task finished first:
  seed columns and samplers swap places from run to run, and independent columns (an expression and a judge over
  the same column) come in completion order. It is not derivable, so :func:`final_columns` defines one order,
  Data Designer's compile order (seed columns, samplers, the other columns in dependency order, ties in recipe
  order), for single- and two-stage datasets alike.
- Values that a stage-2 column reads from stage 1 pass through Parquet and DuckDB. Strings and scalars come back
  as they were; structs (judge, structured, person samplers, traces) may come back with other or more keys (a
  struct type is the union of the rows' keys), so such columns are not read across the boundary.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ddslurm.config import recipe_section
from ddslurm.runtime.errors import RecipeError

StageKind = Literal["gpu", "cpu"]

KEEP_PROCESSOR = "ddslurm-stage-dropped"
"""Name of the ``drop_columns`` processor stage 2 gets for the columns stage 1 kept only for it (and
:data:`STAGE_ROW`)."""

STAGE_ROW = "_ddslurm_stage_row"
"""The column of a CPU-stage seed file that numbers its rows (the GPU stage's winner rows, 0..n-1). Stage 2 drops
it with the columns stage 1 kept only for it, and Data Designer preserves what it drops
(``preserve_dropped_columns``), so a fill knows exactly which GPU-stage rows the dropped records were."""

# Column types whose values come back from Parquet as Data Designer made them (strings, scalars, float lists).
_SAFE_ACROSS = frozenset({"llm-text", "llm-code", "expression", "sampler", "embedding"})
_STRUCT_SAMPLERS = frozenset({"person", "person_from_faker"})
_REASONING_SUFFIX = "__reasoning_content"  # DD's REASONING_CONTENT_COLUMN_POSTFIX: a plain string


@dataclass(frozen=True, slots=True)
class Stage:
    kind: StageKind
    columns: tuple[str, ...]
    """Recipe columns generated in this stage, in recipe order."""
    keep: tuple[str, ...] = ()
    """Columns this stage must output for a later stage although the recipe drops them (a later stage drops
    them)."""


@dataclass(frozen=True, slots=True)
class StageSplit:
    stages: tuple[Stage, ...]
    """One stage (no split), or the GPU stage then the CPU stage."""
    reason: str
    """One line for the dry run: why the recipe stays single-stage, or what was split."""

    @property
    def split(self) -> bool:
        return len(self.stages) > 1


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    column_type: str
    aliases: tuple[str, ...]
    refs: tuple[str, ...]
    """Names the column reads: ``required_columns`` and ``skip.when`` columns, as written."""
    required: tuple[str, ...]
    """``required_columns`` only (what skips propagate along)."""
    side_effects: tuple[str, ...]
    drop: bool
    skips: bool
    propagate_skip: bool
    sampler_type: str | None


class _Graph:
    """The recipe's columns in recipe order and the edges Data Designer's execution graph has between them."""

    def __init__(self, columns: Sequence[_Column]) -> None:
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


def _parse_columns(recipe: Mapping[str, Any]) -> list[Any]:
    """The recipe's column configs as Data Designer's own config objects."""
    from typing import Annotated

    from data_designer.config.column_types import ColumnConfigT
    from data_designer.errors import DataDesignerError
    from pydantic import Field, TypeAdapter, ValidationError

    raw = recipe_section(recipe).get("columns") or []
    adapter: TypeAdapter[list[Any]] = TypeAdapter(list[Annotated[ColumnConfigT, Field(discriminator="column_type")]])
    try:
        return adapter.validate_python(copy.deepcopy(list(raw)))
    except (ValidationError, DataDesignerError) as exc:  # DD's own validators raise DataDesignerError as it is
        raise RecipeError(f"the recipe's columns are not valid Data Designer column configs: {exc}") from exc


def _graph(recipe: Mapping[str, Any]) -> _Graph:
    columns = []
    for config in _parse_columns(recipe):
        skip = getattr(config, "skip", None)
        required = tuple(config.required_columns)
        get_aliases = getattr(config, "get_model_aliases", None)
        alias = getattr(config, "model_alias", None)
        aliases = tuple(get_aliases()) if callable(get_aliases) else ((alias,) if alias is not None else ())
        sampler_type = getattr(config, "sampler_type", None)
        columns.append(
            _Column(
                name=config.name,
                column_type=str(config.column_type),
                aliases=aliases,
                refs=required + (tuple(skip.columns) if skip is not None else ()),
                required=required,
                side_effects=tuple(config.side_effect_columns),
                drop=bool(config.drop),
                skips=skip is not None,
                propagate_skip=bool(getattr(config, "propagate_skip", True)),
                sampler_type=None if sampler_type is None else str(getattr(sampler_type, "value", sampler_type)),
            )
        )
    return _Graph(columns)


def _processors(recipe: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(p) for p in recipe_section(recipe).get("processors") or [] if isinstance(p, Mapping)]


def _is_drop_processor(processor: Mapping[str, Any]) -> bool:
    return str(processor.get("processor_type")) == "drop_columns"


def _single(graph: _Graph, local: Collection[str], reason: str) -> StageSplit:
    kind: StageKind = "gpu" if local else "cpu"
    return StageSplit(stages=(Stage(kind=kind, columns=tuple(graph.columns)),), reason=reason)


def _names(names: Collection[str]) -> str:
    return ", ".join(repr(n) for n in names)


def split_stages(recipe: Mapping[str, Any], local_aliases: Collection[str]) -> StageSplit:
    """Split ``recipe`` (a full config or DD's shorthand) into a GPU stage and a CPU stage, or say why it stays
    one stage. ``local_aliases``: the model aliases served by deployments inside the job.

    A column is local when one of its model aliases is local, hosted when it uses models and none is local. The
    GPU stage is every local column and what they depend on, directly or transitively; the samplers all go there
    when one of them does. The CPU stage is every other column: at least every hosted column.
    """
    graph = _graph(recipe)
    local_set = set(local_aliases)
    local = [c.name for c in graph.columns.values() if local_set.intersection(c.aliases)]
    hosted = [c.name for c in graph.columns.values() if c.aliases and not local_set.intersection(c.aliases)]
    if not local:
        return _single(graph, local, "single stage: no column uses a local model, so the job needs no GPU")
    if not hosted:
        return _single(graph, local, "single stage: every model column uses a local model; no column is hosted-only")

    gpu = graph.closure(local)
    if gpu.intersection(hosted):
        for name in local:
            chain = graph.path(name, set(hosted))
            if chain[-1] in hosted:
                return _single(
                    graph,
                    local,
                    f"single stage: local column {name!r} depends on hosted column {chain[-1]!r} "
                    f"({' -> '.join(chain)}); alternating GPU and CPU stages are not supported",
                )

    section = recipe_section(recipe)
    if section.get("profilers"):
        return _single(graph, local, "single stage: the recipe has profilers, which analyse the whole dataset")
    other = [str(p.get("name")) for p in _processors(recipe) if not _is_drop_processor(p)]
    if other:
        return _single(
            graph,
            local,
            f"single stage: processor(s) {_names(other)} transform whole records after each batch; only "
            "drop_columns processors can be carried across stages",
        )

    samplers = {c.name for c in graph.columns.values() if c.column_type == "sampler"}
    if gpu & samplers:
        gpu |= samplers  # generated together (constraints, conditional params, subcategory parents)
    cpu = [n for n in graph.columns if n not in gpu]

    skippable = graph.skippable()
    keep: set[str] = set()
    for name in cpu:
        for ref in graph.columns[name].refs:
            producer = graph.producer(ref)
            if producer is None or producer not in gpu:
                continue
            problem = _crossing_problem(graph.columns[producer], ref, producer in skippable)
            if problem:
                return _single(
                    graph,
                    local,
                    f"single stage: CPU-stage column {name!r} reads GPU-stage column {ref!r}, {problem}",
                )
            if ref == producer and graph.columns[producer].drop:
                keep.add(producer)

    for kind, names, kept in (("GPU", gpu, keep), ("CPU", set(cpu), set())):
        if all(graph.columns[n].drop and n not in kept for n in names):
            return _single(graph, local, f"single stage: every column of the {kind} stage would be dropped")

    gpu_cols, cpu_cols = graph.in_order(gpu), tuple(cpu)
    reason = (
        f"two stages: GPU stage {len(gpu_cols)} column(s) ({_names(gpu_cols)}); CPU stage {len(cpu_cols)} "
        f"column(s) ({_names(cpu_cols)}) reading the GPU stage's output as its seed dataset"
    )
    if keep:
        reason += f"; the GPU stage keeps dropped column(s) {_names(graph.in_order(keep))} for the CPU stage"
    return StageSplit(
        stages=(Stage(kind="gpu", columns=gpu_cols, keep=graph.in_order(keep)), Stage(kind="cpu", columns=cpu_cols)),
        reason=reason,
    )


def _crossing_problem(producer: _Column, ref: str, skippable: bool) -> str | None:
    """Why stage 2 could not read ``ref`` (``producer`` or one of its side effects) from stage 1's output the way
    Data Designer hands it over in memory; None when it can."""
    if skippable:
        return (
            "whose cells may be skipped: a skip does not travel through the seed dataset (the reader would "
            "see the skip value instead of skipping)"
        )
    if ref != producer.name:
        if ref == producer.name + _REASONING_SUFFIX:
            return None
        return f"a {producer.column_type} side-effect column whose nested values do not round-trip through Parquet"
    if producer.column_type not in _SAFE_ACROSS or producer.sampler_type in _STRUCT_SAMPLERS:
        kind = producer.column_type if producer.sampler_type is None else f"{producer.sampler_type} sampler"
        return f"a {kind} column whose struct values may come back from Parquet with other keys"
    return None


def stage_recipe(
    recipe: Mapping[str, Any], split: StageSplit, index: int, *, seed_path: str | None = None
) -> dict[str, Any]:
    """The recipe that stage ``index`` of ``split`` runs (same shape as ``recipe``: full config or shorthand).

    Stage 0 of a split: only the GPU stage's columns, the original seed config, no processors (they move to
    stage 1), ``drop`` cleared for the stage's ``keep`` columns. Stage 1: only the CPU stage's columns, reading
    ``seed_path`` (stage 0's rows, numbered in :data:`STAGE_ROW`) in order with no selection, so seed row i
    becomes output row i and, with ``num_records`` equal to stage 0's rows, every row is used once; a
    ``drop_columns`` processor drops the kept columns and the row numbers. Model configs are left as
    they are (stage 1 uses only hosted aliases; DD checks only the aliases its columns use). A single-stage split
    has only stage 0: the recipe unchanged.
    """
    if not 0 <= index < len(split.stages):
        raise IndexError(f"stage {index} does not exist: the split has {len(split.stages)} stage(s)")
    out = copy.deepcopy(dict(recipe))
    if not split.split:
        return out
    section = recipe_section(out)
    stage = split.stages[index]
    wanted = set(stage.columns)
    columns = [dict(c) for c in section.get("columns") or [] if c.get("name") in wanted]
    if not any(c.get("column_type") == "sampler" for c in columns):
        section["constraints"] = None  # constraints only apply to samplers, which are all in one stage
    if index == 0:
        kept = set(stage.keep)
        for c in columns:
            if c.get("name") in kept:
                c["drop"] = False
        section["processors"] = None
    else:
        if seed_path is None:
            raise ValueError("stage 1 reads stage 0's output: seed_path is required")
        section["seed_config"] = {
            "source": {"seed_type": "local", "path": seed_path},
            "sampling_strategy": "ordered",
            "selection_strategy": None,
        }
        section["processors"] = _stage_processors(recipe, split)
    section["columns"] = columns
    return out


def _stage_processors(recipe: Mapping[str, Any], split: StageSplit) -> list[dict[str, Any]]:
    """Stage 1's processors: the recipe's ``drop_columns`` processors without the columns stage 0 already dropped
    (Data Designer refuses to drop a column that does not exist), then one that drops stage 0's ``keep`` and the
    seed file's row numbers (:data:`STAGE_ROW`)."""
    first = split.stages[0]
    by_name = {c.get("name"): c for c in recipe_section(recipe).get("columns") or []}
    gone = {n for n in first.columns if by_name[n].get("drop") and n not in first.keep}
    out = []
    for p in _processors(recipe):
        names = [n for n in p.get("column_names") or [] if n not in gone]
        if names:
            out.append({**p, "column_names": names})
    taken = {str(p.get("name")) for p in out}
    name = KEEP_PROCESSOR
    while name in taken:
        name += "_"
    out.append({"processor_type": "drop_columns", "name": name, "column_names": [*first.keep, STAGE_ROW]})
    return out


def final_columns(recipe: Mapping[str, Any], seed_columns: Sequence[str]) -> tuple[str, ...]:
    """The columns of the recipe's dataset in one defined order: ``seed_columns`` (the seed dataset's columns in
    its order, ``()`` without a seed), the samplers, then the other columns in dependency order (ties in recipe
    order), each followed by its side-effect columns; minus what ``drop: true`` and ``drop_columns``
    processors remove.

    Data Designer itself writes columns in the order their cells were first written, which changes from run to
    run (see the module docstring): reorder single- and two-stage datasets alike by this order.
    """
    graph = _graph(recipe)
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
    for p in _processors(recipe):
        if _is_drop_processor(p):
            for pattern in p.get("column_names") or []:
                dropped.update(fnmatch.filter(names, pattern) if "*" in pattern else [pattern])
    return tuple(n for n in names if n not in dropped)


def plan_split(stages: Sequence[Any], reason: str | None = None) -> StageSplit:
    """The split a plan records (its ``stages``: ``StagePlan`` entries, each with kind, columns and keep) as a
    :class:`StageSplit`; the node rebuilds it from the plan and never splits the recipe again."""
    return StageSplit(
        stages=tuple(Stage(kind=st.kind, columns=tuple(st.columns), keep=tuple(st.keep)) for st in stages),
        reason=reason or "",
    )
