"""``stages: auto``: split a recipe's column graph into a GPU stage and a CPU stage (pure functions, no Data Designer).

A mixed recipe has columns that a local model (vLLM inside the GPU job) generates and columns that only hosted
models generate. :func:`split_stages` puts every column that needs a local model, and everything those columns
depend on, in a GPU stage; every other column goes to a CPU stage that reads the GPU stage's output as its seed
dataset (:func:`stage_recipe`). The two-stage dataset then holds what the single-stage one holds, column for
column; ``final_columns`` (``_recipe_graph``) gives the one column order to put either in. The planner splits;
the node runs each stage's recipe.

Data Designer facts this relies on beyond the column graph's (``_recipe_graph``; data-designer 0.9.7):

- Seed columns are available in both stages (stage 2 gets the seed columns through stage 1's output).
- Sampler columns are generated together, by one generator per row group, with ``constraints``, conditional
  params and subcategory parents between them: they stay in one stage.
- ``drop: true`` removes only the column itself (DD's default ``drop_columns`` processor runs after each batch,
  after every column of the batch exists); its side-effect columns stay. A ``drop_columns`` processor drops the
  columns it names (globs against the batch's columns) and is what DD itself uses to drop seed columns
  (``_mark_processor_dropped_seed_columns``): stage 2 drops the columns stage 1 kept only for it that way.
- Values that a stage-2 column reads from stage 1 pass through Parquet and DuckDB. Strings and scalars come back
  as they were; structs (judge, structured, person samplers, traces) may come back with other or more keys (a
  struct type is the union of the rows' keys), so such columns are not read across the boundary.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ddslurm.config._recipe import is_drop_processor, recipe_processors, recipe_section
from ddslurm.config._recipe_graph import ColumnGraph, RecipeColumn

StageKind = Literal["gpu", "cpu"]

KEEP_PROCESSOR = "ddslurm-stage-dropped"
"""Name of stage 2's one ``drop_columns`` processor: every column it drops, the columns stage 1 kept only for it
and :data:`STAGE_ROW` among them."""

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


def _single(graph: ColumnGraph, local: Collection[str], reason: str) -> StageSplit:
    kind: StageKind = "gpu" if local else "cpu"
    return StageSplit(stages=(Stage(kind=kind, columns=tuple(graph.columns)),), reason=reason)


def _names(names: Collection[str]) -> str:
    return ", ".join(repr(n) for n in names)


def split_stages(
    recipe: Mapping[str, Any], columns: Sequence[RecipeColumn], local_aliases: Collection[str]
) -> StageSplit:
    """Split ``recipe`` (a full config or DD's shorthand) into a GPU stage and a CPU stage, or say why it stays
    one stage. ``columns``: the recipe's columns (:class:`RecipeColumn`), in recipe order; ``local_aliases``: the
    model aliases served by deployments inside the job.

    A column is local when one of its model aliases is local, hosted when it uses models and none is local. The
    GPU stage is every local column and what they depend on, directly or transitively; the samplers all go there
    when one of them does. The CPU stage is every other column: at least every hosted column.
    """
    graph = ColumnGraph(columns)
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
    other = [str(p.get("name")) for p in recipe_processors(recipe) if not is_drop_processor(p)]
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


def _crossing_problem(producer: RecipeColumn, ref: str, skippable: bool) -> str | None:
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
    becomes output row i and, with ``num_records`` equal to stage 0's rows, every row is used once; one
    ``drop_columns`` processor drops all the stage drops, the kept columns and the row numbers too. Model configs
    are left as they are (stage 1 uses only hosted aliases; DD checks only the aliases its columns use). A
    single-stage split has only stage 0: the recipe unchanged.
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
    """Stage 1's one ``drop_columns`` processor: the columns the recipe's ``drop_columns`` processors name, less
    those stage 0 already dropped (Data Designer refuses to drop a column that does not exist), the stage's own
    ``drop: true`` columns, stage 0's ``keep`` and the seed file's row numbers (:data:`STAGE_ROW`).

    One processor, because Data Designer writes what each ``drop_columns`` processor drops to the batch's one
    preserved file (``dropped-columns-parquet-files/batch_N.parquet``), each over the last: a second one (the
    recipe's own, or the default one Data Designer adds for ``drop: true`` columns no processor names) would
    leave the file without the row numbers a fill reads. Naming every dropped column leaves it nothing to add."""
    first, second = split.stages[0], split.stages[1]
    by_name = {c.get("name"): c for c in recipe_section(recipe).get("columns") or []}
    gone = {n for n in first.columns if by_name[n].get("drop") and n not in first.keep}
    names: dict[str, None] = {}
    for p in recipe_processors(recipe):
        names.update((str(n), None) for n in p.get("column_names") or [] if n not in gone)
    names.update((n, None) for n in second.columns if by_name[n].get("drop"))
    names.update((n, None) for n in (*first.keep, STAGE_ROW))
    return [{"processor_type": "drop_columns", "name": KEEP_PROCESSOR, "column_names": list(names)}]


def plan_split(stages: Sequence[Any], reason: str | None = None) -> StageSplit:
    """The split a plan records (its ``stages``: ``StagePlan`` entries, each with kind, columns and keep) as a
    :class:`StageSplit`; the node rebuilds it from the plan and never splits the recipe again."""
    return StageSplit(
        stages=tuple(Stage(kind=st.kind, columns=tuple(st.columns), keep=tuple(st.keep)) for st in stages),
        reason=reason or "",
    )
