"""The recipe's seed dataset becomes part of the run's inputs: copied, hashed and counted on the submit host.

Nodes never read the submitter's tree: a seed file, the files of a wildcard pattern or a seed directory (Data
Designer's directory, file-contents and agent-rollout sources) is copied under ``inputs/seed/`` with a manifest
of sizes and sha256 digests in the plan, and the stored recipe points at the copy. Seed sources that cannot
be captured (Hugging Face datasets, which the offline nodes cannot download; in-memory data frames) are refused
at submit, before anything is written, and so are seed files that hold the value of one of the run's secrets
(:func:`refuse_seed_secrets`). The seed rows are counted with Data Designer's own seed readers, so the planner can
give every shard exactly the rows an unsharded run would use.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config import FileEntry, RunLayout, SeedKind, SeedPlan, SeedRows, recipe_section, sha256_file
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.submission._recipe_at import recipe_field_at
from ddslurm.providers import holds_secret
from ddslurm.providers.discovery import is_home_relative
from ddslurm.runtime import scan_for_secrets, seed_reader

FILESYSTEM_SOURCES = ("directory", "file_contents", "agent_rollout")
CountRows = Callable[[dict[str, Any]], int]


@dataclass(frozen=True, slots=True)
class SeedCapture:
    """What submit copies (``sources[i]`` to ``root / plan.files[i].path``) and the recipe that points at it."""

    plan: SeedPlan
    sources: tuple[Path, ...]
    recipe_bytes: bytes
    source: dict[str, Any] | None = None
    """The seed source as found on the submit host (its path the original files): for reading its column names."""


def dd_seed_rows(source: dict[str, Any]) -> int:
    """Seed rows as Data Designer counts them (its own readers; manifest rows for directory sources)."""
    return int(seed_reader(source).get_seed_dataset_size())


def dd_seed_columns(source: dict[str, Any]) -> list[str]:
    """The seed dataset's column names as Data Designer's reader outputs them (in its order)."""
    reader = seed_reader(source)
    names = getattr(reader, "get_output_column_names", None)
    return list(names() if callable(names) else reader.get_column_names())


def _field(recipe_path: Path, field: str, message: str) -> SubmitError:
    """A refusal of the recipe's ``seed_config.FIELD``, at its line and column in a config file."""
    steps: list[str | int] = ["seed_config", *field.split(".")]
    return SubmitError(f"{recipe_field_at(recipe_path, steps, f'seed_config.{field}')}: {message}")


def _resolve(recipe_path: Path, raw: object, field: str) -> Path:
    if not isinstance(raw, str) or not raw.strip():
        raise _field(recipe_path, field, "must name a file or directory")
    if is_home_relative(raw):
        raise _field(recipe_path, field, f"{raw!r}: use an absolute path or one relative to the recipe")
    path = Path(raw)
    return path if path.is_absolute() else (recipe_path.parent / path).resolve()


def _walk(root: Path, pattern: str, recursive: bool) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        if not recursive:
            dirnames.clear()
        for name in sorted(filenames):
            if fnmatch.fnmatchcase(name, pattern):
                yield Path(dirpath) / name


def _files(recipe_path: Path, seed_type: str, source: dict[str, Any]) -> tuple[SeedKind, Path, list[Path], str]:
    """(kind, source root, files to copy, the recipe path relative to the copied root)."""
    raw = source.get("path")
    if seed_type == "local":
        if isinstance(raw, str) and "*" in raw:
            prefix, suffix = raw.split("*", 1)
            root = _resolve(recipe_path, prefix or ".", "source.path")
            if not root.is_dir():
                raise _field(recipe_path, "source.path", f"{root} is not a directory (for the pattern {raw!r})")
            files = sorted(p for p in root.glob(f"*{suffix}") if p.is_file())
            if not files:
                raise _field(recipe_path, "source.path", f"no file matches {root}/*{suffix}")
            return "files", root, files, f"*{suffix}"
        path = _resolve(recipe_path, raw, "source.path")
        if not path.is_file():
            raise _field(
                recipe_path, "source.path", f"{path} is not a file (relative paths are relative to the recipe)"
            )
        return "file", path.parent, [path], path.name
    if raw is None:
        raise _field(
            recipe_path, "source.path", f"a {seed_type} seed needs its directory named explicitly (ddslurm copies it)"
        )
    root = _resolve(recipe_path, raw, "source.path")
    if not root.is_dir():
        raise _field(
            recipe_path, "source.path", f"{root} is not a directory (relative paths are relative to the recipe)"
        )
    pattern = source.get("file_pattern") or "*"
    if seed_type == "agent_rollout":  # its reader picks files by format: take the whole tree
        pattern = "*"
    files = list(_walk(root, str(pattern), bool(source.get("recursive", True))))
    if not files:
        raise _field(recipe_path, "source.file_pattern", f"no file under {root} matches {pattern!r}")
    return "directory", root, files, "."


def _pool(recipe_path: Path, seed: dict[str, Any], rows: int) -> SeedRows:
    """The recipe's own selection of seed rows, checked the way Data Designer checks it."""
    selection = seed.get("selection_strategy")
    if selection is None:
        return SeedRows.of(0, rows)
    if not isinstance(selection, dict):
        raise _field(recipe_path, "selection_strategy", "must be an index range {start, end} or a partition block")
    if "start" in selection or "end" in selection:
        pool = SeedRows(int(selection.get("start", 0)), int(selection.get("end", -1)))
        if not 0 <= pool.start <= pool.end:
            raise _field(recipe_path, "selection_strategy", f"start {pool.start} and end {pool.end} are not a range")
        if pool.end >= rows:
            raise _field(recipe_path, "selection_strategy.end", f"{pool.end} is past the seed dataset's {rows} rows")
        return pool
    index, parts = int(selection.get("index", 0)), int(selection.get("num_partitions", 1))
    if not 0 <= index < parts:
        raise _field(recipe_path, "selection_strategy.index", f"{index} is not a partition of {parts}")
    if parts > rows:
        raise _field(recipe_path, "selection_strategy.num_partitions", f"{parts} exceeds the seed's {rows} rows")
    from data_designer.config.seed import PartitionBlock

    block = PartitionBlock(index=index, num_partitions=parts).to_index_range(rows)  # DD's own arithmetic
    return SeedRows(block.start, block.end)


def shuffle_seed(run_id: str) -> int:
    """The seed of a shuffled run's per-shard seed orders: fixed by the run id (itself unique per submission), so
    the plan is a function of its inputs and every shard of one run shuffles differently from another run's."""
    return int.from_bytes(hashlib.sha256(f"ddslurm-shuffle:{run_id}".encode()).digest()[:8], "big") >> 1


def _seed_source(recipe: dict[str, Any], recipe_path: Path) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """The recipe's ``seed_config``, its source and seed type, checked to be one ddslurm can capture; None when
    the recipe has no seed."""
    seed = recipe_section(recipe).get("seed_config")
    if seed is None:
        return None
    if not isinstance(seed, dict) or not isinstance(seed.get("source"), dict):
        raise _field(recipe_path, "source", "must be a mapping with a seed_type")
    source = seed["source"]
    seed_type = str(source.get("seed_type", "local"))
    if seed_type == "hf":
        raise _field(
            recipe_path,
            "source.seed_type",
            "Hugging Face seed datasets cannot be read on the nodes (they run offline); download the files and "
            "use a local seed (seed_type: local, path: FILE or DIR/*.parquet)",
        )
    if seed_type not in ("local", *FILESYSTEM_SOURCES):
        raise _field(recipe_path, "source.seed_type", f"{seed_type!r} cannot be captured into the run's inputs")
    return seed, source, seed_type


def refuse_seed_secrets(recipe: dict[str, Any], recipe_path: Path, secrets: Mapping[str, str]) -> None:
    """Refuse (SubmitError, naming the file and the variable) a seed dataset whose files hold the value of one of
    ``secrets``: every seed row is sent to the models and lands in the dataset. The files :func:`capture_seed`
    would copy are read in full with the node's own scan (``scan_for_secrets``: the bytes, and a Parquet file's
    decoded values too, which compression hides), links followed to the data they name. A seed that cannot be
    captured is left to :func:`capture_seed`, which says why."""
    if not secrets:
        return
    try:
        found = _seed_source(recipe, recipe_path)
        if found is None:
            return
        _, _, files, _ = _files(recipe_path, found[2], found[1])
    except SubmitError:
        return
    targets = [f.resolve() for f in files]
    hits = scan_for_secrets(targets, secrets.values())
    if not hits:
        return
    hit = hits[0]
    name = next(n for n, value in sorted(secrets.items()) if scan_for_secrets([hit], [value]))
    shown = files[targets.index(hit)]
    raise _field(
        recipe_path,
        "source.path",
        f"{shown} {holds_secret(name)}; every seed row goes to the models and into the run's inputs and dataset: "
        "remove the key from the seed data",
    )


def capture_seed(
    recipe: dict[str, Any], recipe_path: Path, layout: RunLayout, *, count_rows: CountRows = dd_seed_rows
) -> SeedCapture | None:
    """The recipe's seed dataset as run inputs, or None when the recipe has none. Writes nothing. (Its files are
    checked for the run's secrets when the recipe is loaded: :func:`refuse_seed_secrets`.)"""
    found = _seed_source(recipe, recipe_path)
    if found is None:
        return None
    seed, source, seed_type = found
    kind, src_root, files, inner = _files(recipe_path, seed_type, source)
    sampling = str(seed.get("sampling_strategy", "ordered"))
    if sampling not in ("ordered", "shuffle"):
        raise _field(recipe_path, "sampling_strategy", f"{sampling!r} is not ordered or shuffle")
    original = copy.deepcopy(source)
    original["path"] = str(src_root / inner) if kind != "directory" else str(src_root)
    try:
        rows = count_rows(original)
    except Exception as exc:
        raise _field(recipe_path, "source", f"Data Designer cannot read the seed dataset: {exc}") from exc
    if rows < 1:
        raise _field(recipe_path, "source", "the seed dataset has no rows")
    pool = _pool(recipe_path, seed, rows)
    root = layout.seed_dir if kind == "file" else layout.seed_dir / (src_root.name or "seed")
    entries = tuple(
        FileEntry(path=str(f.relative_to(src_root)), size=f.stat().st_size, sha256=sha256_file(f)) for f in files
    )
    stored_path = str(root / inner) if kind != "directory" else str(root)
    stored = copy.deepcopy(recipe)
    recipe_section(stored)["seed_config"]["source"]["path"] = stored_path
    plan = SeedPlan(
        seed_type=seed_type,
        kind=kind,
        root=str(root),
        path=stored_path,
        files=entries,
        rows=rows,
        pool_start=pool.start,
        pool_size=pool.rows,
        sampling="shuffle" if sampling == "shuffle" else "ordered",
        shuffle_seed=shuffle_seed(layout.run_id) if sampling == "shuffle" else None,
    )
    # JSON is YAML too: the stored recipe stays loadable by Data Designer and by ddslurm's YAML reader. Its keys
    # keep the recipe's order (an output schema's fields, a judge's options are in the requests Data Designer sends).
    recipe_bytes = msgspec.json.format(msgspec.json.encode(stored), indent=2) + b"\n"
    return SeedCapture(plan=plan, sources=tuple(files), recipe_bytes=recipe_bytes, source=original)
