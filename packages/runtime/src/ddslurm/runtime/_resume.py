"""Where a resumed attempt's dataset starts: the completed batches of the shard's best earlier attempt.

A new attempt of a shard (a requeue, a retry array, ``ddslurm retry``) does not regenerate what an earlier one
completed: its dataset directory is seeded with the batches, fill batches and preserved columns of the earlier
attempt dataset with the most rows it may continue, and Data Designer resumes from there. ``ddslurm retry
--fresh`` excludes the attempts before it (``fresh.json``).

A batch whose empty or null LLM values would take a column over the run's ``max_empty_outputs`` is not
continued: an attempt stopped mid-generation (``scancel``, a node lost) never reached the verification that
sets such a dataset aside, and every attempt resuming its batches would be rejected in turn. Data Designer
generates that batch again instead.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ddslurm.config import FreshRecord, Plan, RunLayout, ShardLayout, llm_columns, read_json, read_yaml, to_builtins
from ddslurm.runtime._verify import DD_DROPPED_DIR, FILL_DIR, FILL_DROPPED_DIR, empty_outputs_in, readable_rows

_FOLDERS = (
    ("parquet-files", "batch_*.parquet", DD_DROPPED_DIR),  # Data Designer's batches, the columns it preserved
    (FILL_DIR, "fill_*.parquet", FILL_DROPPED_DIR),
)


@dataclass(frozen=True)
class EmptyLimit:
    """What verification rejects: more than ``limit`` empty or null values in any of ``columns`` (the stage's
    LLM columns); ``limit`` None: no check."""

    columns: tuple[str, ...]
    limit: int | None


@dataclass(frozen=True)
class ResumeSource:
    """An earlier attempt's dataset and the files of it a new attempt continues (folder and file name, inside
    ``dataset``), with their rows and the batches left out for empty outputs."""

    dataset: Path
    files: tuple[tuple[str, str], ...]
    rows: int
    left_out: int


def _row_groups(dataset: Path) -> int | None:
    """How many batches Data Designer's run of ``dataset`` makes in all (its first target over its buffer size, as
    its metadata says); None when the metadata does not say."""
    try:
        meta = json.loads((dataset / "metadata.json").read_text())
        target = int(meta.get("original_target_num_records", meta["target_num_records"]))
        return -(-target // int(meta["buffer_size"]))
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _batch_id(name: str) -> int:
    """``batch_00007.parquet`` → 7: the row group the batch file holds."""
    return int(name.removeprefix("batch_").removesuffix(".parquet"))


def continued_files(dataset: Path, empty: EmptyLimit) -> ResumeSource:
    """The files of ``dataset`` a new attempt may continue.

    Each readable batch in order, with its preserved columns, while the empty values it adds keep every column
    within ``empty.limit``; a batch over it (or unreadable) is left out, and Data Designer fills the hole. Fill
    batches are continued only when every batch of Data Designer's is, and none is missing (a batch whose every
    record was dropped leaves no file; resuming, Data Designer generates every batch of its run that has none):
    they make up records missing from those batches, which a batch generated again holds itself.
    """
    import pyarrow.parquet as pq

    files: list[tuple[str, str]] = []
    used: dict[str, int] = {}
    rows = left_out = 0
    whole = True
    groups = _row_groups(dataset)
    for folder, pattern, preserved_folder in _FOLDERS:
        if folder == FILL_DIR:
            present = {_batch_id(name) for f, name in files if f == "parquet-files"}
            if groups is not None and present != set(range(groups)):
                whole = False  # Data Designer generates the missing batches again
            if not whole:
                break
        for batch in sorted((dataset / folder).glob(pattern)):
            preserved = dataset / preserved_folder / batch.name
            preserved_ok = preserved.is_file() and readable_rows([preserved])[1] == 1
            counted = [batch, preserved] if preserved_ok else [batch]
            try:
                batch_rows = pq.read_metadata(batch).num_rows
                added = {} if empty.limit is None else empty_outputs_in(counted, empty.columns)
            except Exception:  # a damaged batch is not continued either: Data Designer generates it again
                whole = False
                continue
            if empty.limit is not None and any(used.get(c, 0) + n > empty.limit for c, n in added.items()):
                whole = False
                left_out += 1
                continue
            for c, n in added.items():
                used[c] = used.get(c, 0) + n
            files.append((folder, batch.name))
            if preserved_ok:
                files.append((preserved_folder, batch.name))
            rows += batch_rows
    return ResumeSource(dataset=dataset, files=tuple(files), rows=rows, left_out=left_out)


def resume_source(shard: ShardLayout, attempt_id: str, empty: EmptyLimit) -> ResumeSource | None:
    """The earlier attempt dataset of ``shard`` (one with a metadata file, never ``attempt_id``'s own) with the
    most rows a new attempt may continue (:func:`continued_files`)."""
    best: ResumeSource | None = None
    excluded: set[str] = set()
    if shard.fresh.is_file():  # `ddslurm retry --fresh`: these attempts' batches are never continued
        excluded = set(read_json(shard.fresh, FreshRecord).excluded)
    for dataset in sorted(shard.attempts.glob("attempt-*/output/shard-*")):
        owner = dataset.parent.parent.name
        if owner == attempt_id or owner in excluded or dataset.is_symlink():
            continue
        if not (dataset / "metadata.json").is_file():
            continue
        source = continued_files(dataset, empty)
        if source.rows and (best is None or source.rows > best.rows):
            best = source
    return best


def next_resume(layout: RunLayout, plan: Plan, shard: int, stage: int | None = None) -> ResumeSource | None:
    """What the next attempt of ``shard`` (``stage``: of that stage of a two-stage run, 0 the GPU stage's) would
    continue if it began now, as an attempt seeds its dataset (:func:`resume_source`, with the stage's LLM columns and
    the plan's ``max_empty_outputs``): None when the plan's ``resume`` is ``never`` or no earlier attempt has a batch
    it may continue. ``ddslurm retry --dry-run`` previews it, and ``retry`` asks it whether a shard that ran out of time
    would start from nothing again. The recipe is read from the run directory unchecked: a preview, not an attempt."""
    if plan.resume == "never":
        return None
    recipe = to_builtins(read_yaml(Path(plan.recipe_file)))
    columns = llm_columns(recipe)
    if stage is not None and plan.stages:  # the columns stage_recipe keeps, in the recipe's order
        columns = tuple(c for c in columns if c in plan.stages[stage].columns)
    return resume_source(layout.stage_shard(shard, stage), "", EmptyLimit(columns, plan.max_empty_outputs))


def seed_from(source: ResumeSource, target: Path) -> int:
    """A new dataset directory holding the source's metadata and the files it continues (hard links, never the
    originals moved or changed); returns the rows it holds."""
    (target / "parquet-files").mkdir(parents=True, mode=0o700)
    shutil.copy2(source.dataset / "metadata.json", target / "metadata.json")
    for folder, name in source.files:
        (target / folder).mkdir(mode=0o700, exist_ok=True)
        try:
            os.link(source.dataset / folder / name, target / folder / name)
        except OSError:
            shutil.copy2(source.dataset / folder / name, target / folder / name)
    return source.rows
