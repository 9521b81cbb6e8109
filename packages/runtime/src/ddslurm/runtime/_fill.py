"""Which records a short shard is missing, so that a rerun or retry generates exactly those.

Data Designer drops a record whose cells failed after its retries and salvage rounds, and then counts the
dataset complete: resuming it generates nothing. Without a seed dataset any new record takes a dropped one's
place. With a seed, each record belongs to a seed row; the missing ones are the seed rows of the shard's block
that the dataset uses fewer times than an unsharded run would (matched by the values of the seed columns,
which Data Designer copies into every record). :func:`fill_missing` generates them again.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ddslurm.config import FILL_DONE, STAGE_ROW, make_private_dir, recipe_section
from ddslurm.runtime._attempt_record import Began, StageRun
from ddslurm.runtime._engine import EngineRequest, EngineResult, HostedCheck
from ddslurm.runtime._hosted_gate import gate_wait_s
from ddslurm.runtime._inputs import Inputs
from ddslurm.runtime._progress import ProgressFile
from ddslurm.runtime._verify import DD_DROPPED_DIR, FILL_DIR, FILL_DROPPED_DIR, parquet_files, rows_in

if TYPE_CHECKING:
    import pyarrow as pa
from ddslurm.runtime.errors import RuntimeFailure


def row_keys(table: pa.Table, columns: Sequence[str]) -> list[str]:
    """One comparable key per row from the values of ``columns``."""
    return [json.dumps(row, default=str) for row in table.select(list(columns)).to_pylist()]


def observed_keys(files: Sequence[Path], columns: Sequence[str]) -> Counter[str] | None:
    """How often each seed row (by its key) occurs in ``files``; None when a seed column is missing from one."""
    import pyarrow.parquet as pq

    seen: Counter[str] = Counter()
    for f in files:
        names = set(pq.read_schema(f).names)
        if not set(columns) <= names:
            return None
        seen.update(row_keys(pq.read_table(f, columns=list(columns)), columns))
    return seen


def missing_rows(
    block: Sequence[str], observed: Counter[str], records: int, sampling: Literal["ordered", "shuffle"]
) -> list[int] | None:
    """Indexes into ``block`` (the keys of the shard's seed rows) of the records to generate again, in block order.

    ``records`` records over a block of ``width`` rows use each row ``records // width`` times plus, for the
    remainder, the first rows once more (ORDERED) or a random choice of rows (SHUFFLE; any rows not yet used
    that extra time may stand in for it). None when the dataset holds rows the block cannot explain.
    """
    width = len(block)
    full, rest = divmod(records, width)
    positions: dict[str, list[int]] = defaultdict(list)
    for index, key in enumerate(block):
        positions[key].append(index)
    if set(observed) - positions.keys():
        return None
    chosen: list[int] = []
    extra_used = 0
    for key, indexes in positions.items():
        remainder = sum(1 for i in indexes if i < rest) if sampling == "ordered" else 0
        expected = full * len(indexes) + remainder
        have = observed.get(key, 0)
        if have > expected:
            if sampling == "ordered" or have - expected > len(indexes):
                return None
            extra_used += have - expected
            continue
        # The key's rows with the fewest uses are the ones to make again (rows are interchangeable by value).
        chosen += [indexes[i % len(indexes)] for i in range(expected - have)]
    if sampling == "shuffle":
        spare = rest - extra_used
        if spare < 0:
            return None
        used_extra = {k for k, idx in positions.items() if observed.get(k, 0) > full * len(idx)}
        candidates = [i for i, key in enumerate(block) if key not in used_extra]
        chosen += candidates[:spare]
    return sorted(chosen)


def recipe_reading(recipe: Mapping[str, Any], seed_file: Path | None) -> dict[str, Any]:
    """The recipe reading ``seed_file`` in order, every row once per cycle (the rows a fill generates again, a
    shuffled shard's seed block in its fixed order), or unchanged without a seed."""
    out = copy.deepcopy(dict(recipe))
    if seed_file is not None:
        recipe_section(out)["seed_config"] = {
            "source": {"seed_type": "local", "path": str(seed_file)},
            "sampling_strategy": "ordered",
            "selection_strategy": None,
        }
    return out


def numbered_rows(dataset_dir: Path, column: str) -> Counter[int] | None:
    """How often each seed row number (``column``, kept by Data Designer among its preserved dropped columns)
    occurs in the records of ``dataset_dir``: Data Designer's batches and the fill batches, each
    read from its namesake preserved-columns file. None when a batch has no such file, the file lacks the column
    or holds another number of rows: the records cannot be told apart then."""
    import pyarrow.parquet as pq

    seen: Counter[int] = Counter()
    pairs = [
        (f, dataset_dir / DD_DROPPED_DIR / f.name) for f in sorted((dataset_dir / "parquet-files").glob("*.parquet"))
    ]
    pairs += [(f, dataset_dir / FILL_DROPPED_DIR / f.name) for f in sorted((dataset_dir / FILL_DIR).glob("*.parquet"))]
    for batch, numbers in pairs:
        try:
            rows = pq.read_metadata(batch).num_rows
            if not numbers.is_file() or column not in pq.read_schema(numbers).names:
                return None
            values = pq.read_table(numbers, columns=[column]).column(column).to_pylist()
        except Exception:
            return None
        if len(values) != rows or any(v is None for v in values):
            return None
        seen.update(int(v) for v in values)
    return seen


def missing_numbered(block: pa.Table, present: Counter[int], column: str) -> list[int] | None:
    """Indexes into ``block`` (seed rows numbered in ``column``, each used once) of the rows no record holds, in
    block order; None when a record holds a number twice or one the block does not have."""
    numbers = [int(v) for v in block.column(column).to_pylist()]
    if any(n > 1 for n in present.values()) or set(present) - set(numbers):
        return None
    return [i for i, n in enumerate(numbers) if n not in present]


def fill_missing(
    engine: Callable[[EngineRequest], EngineResult],
    scratch_home: Callable[[], Path],
    inputs: Inputs,
    began: Began,
    stage: StageRun,
    target: Path,
    dd_rows: int,
    endpoints: Mapping[str, str],
    progress: ProgressFile,
    log: Any,
    checked: HostedCheck,
) -> int:
    """Generate again exactly the records the shard's dataset is missing (Data Designer dropped them and
    counts the dataset complete); the new batches go to ``fill-files/``. Returns the rows added.

    Once per generation step: what is still missing afterwards leaves the attempt partial, and the next
    rerun or ``ddslurm retry`` (which resumes from this dataset) fills again. ``engine`` runs Data Designer,
    ``scratch_home`` says where (the attempt runner's).
    """
    import pyarrow.parquet as pq

    plan = inputs.plan
    fill_dir = target / FILL_DIR
    missing = began.num_records - dd_rows - rows_in(fill_dir)
    if missing <= 0:
        return 0
    number = len(list(fill_dir.glob("fill_*.parquet"))) if fill_dir.is_dir() else 0
    name = f"fill-{number:05d}-{secrets.token_hex(3)}"
    recipe = stage.recipe
    seed_file: Path | None = None
    if stage.seed_block is not None:
        try:
            block = stage.seed_block()
        except Exception as exc:
            log.warning("fill.skipped", why=f"cannot read the shard's seed rows: {exc}", missing=missing)
            return 0
        chosen: list[int] | None = None
        if stage.numbered:  # each record names its seed row: exactly the rows no record holds
            numbered = numbered_rows(target, STAGE_ROW)
            chosen = None if numbered is None else missing_numbered(block, numbered, STAGE_ROW)
        else:
            columns = list(block.column_names)
            observed = observed_keys(parquet_files(target), columns)
            if observed is not None:
                chosen = missing_rows(row_keys(block, columns), observed, began.num_records, stage.sampling)
        if chosen is None or len(chosen) != missing:
            log.warning("fill.skipped", why="cannot tell which seed rows the dropped records used", missing=missing)
            return 0
        seed_file = began.layout.dir / f"{name}-seed.parquet"
        pq.write_table(block.take(chosen), seed_file)
    log.info("fill.start", missing=missing, seeded=seed_file is not None)
    try:
        result = engine(
            EngineRequest(
                recipe=recipe_reading(recipe, seed_file),
                snapshot=inputs.snapshot,
                endpoints=endpoints,
                artifact_path=began.layout.output,
                scratch_home=scratch_home(),
                dataset_name=name,
                num_records=missing,
                buffer_size=missing,
                serving=plan.serving,
                preserve_dropped_columns=stage.numbered,
                source=plan.recipe_source,
                plugins=plan.plugins,
                hosted_wait_s=gate_wait_s(inputs.snapshot, endpoints),
                hosted_check=checked,
                run_config=plan.run_config,
            )
        )
    except RuntimeFailure as exc:
        log.warning("fill.failed", reason=exc.reason, message=exc.message, missing=missing)
        return 0
    batches = sorted((result.dataset_dir / "parquet-files").glob("batch_*.parquet"))
    added = rows_in(result.dataset_dir / "parquet-files")
    if added > missing:
        log.warning("fill.discarded", why=f"{added} rows for {missing} missing records", dataset=str(name))
        return 0
    make_private_dir(fill_dir, exist_ok=True)
    for index, batch in enumerate(batches):
        name = f"fill_{number:05d}_{index:05d}.parquet"
        preserved = result.dataset_dir / DD_DROPPED_DIR / batch.name
        if preserved.is_file():  # first, so that every fill batch in place has its row numbers beside it
            make_private_dir(target / FILL_DROPPED_DIR, exist_ok=True)
            preserved.rename(target / FILL_DROPPED_DIR / name)
        batch.rename(fill_dir / name)
    progress.write(target)
    log.info(FILL_DONE, added=added, missing=missing - added)
    return added
