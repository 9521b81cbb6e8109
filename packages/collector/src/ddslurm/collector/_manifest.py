"""The collected dataset's manifest (``_manifest.json``): what :func:`ddslurm.collector.collect` writes beside the
Parquet files and what ``status``, ``report`` and the facts read back. Reading it needs no pyarrow, so a command
that only reads a manifest (``ddslurm submit`` reading the workspace's facts among them) does not load it; the
Arrow schema it carries is read by ``_merge.manifest_schema``."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ddslurm.config import FileEntry, Frozen

MANIFEST = "_manifest.json"  # leading underscore: pyarrow and pandas skip it when reading the directory


MANIFEST_VERSION = 2
"""2: ``schema`` is a list of fields (1: pyarrow's text, possibly truncated); ``arrow_schema``; shards' ``partial``."""


class ShardEntry(Frozen, frozen=True, kw_only=True):
    shard: int
    attempt: str
    rows: int
    partial: bool = False
    """A short shard accepted with ``ddslurm accept-partial`` (its winner is marked partial)."""


class SchemaField(Frozen, frozen=True, kw_only=True):
    """One column (or, in ``fields``, one child of a struct, list or map column) of the dataset."""

    name: str
    type: str
    """Arrow's name of the type (``int64``, ``large_string``, ``struct<a: int64>``, ...)."""
    nullable: bool = True
    fields: tuple[SchemaField, ...] = ()
    """The children of a nested type: a struct's fields, a list's item, a map's entries."""


class Manifest(Frozen, frozen=True, kw_only=True):
    version: int = 1
    """Absent in (and so 1 for) manifests written before version 2."""
    run_id: str
    plan_sha256: str
    rows: int
    shards: tuple[ShardEntry, ...]
    schema: tuple[SchemaField, ...] | str
    """The unified schema, one entry per column; a string (pyarrow's text) in version 1 manifests."""
    arrow_schema: str | None = None
    """The same schema exactly, as Arrow IPC bytes in base64 (:func:`manifest_schema` reads it); None in version 1."""
    files: tuple[FileEntry, ...]
    collected_at: str


def read_manifest(dataset: Path) -> Manifest:
    """The manifest of the collected ``dataset`` directory."""
    return msgspec.json.decode((dataset / MANIFEST).read_bytes(), type=Manifest)
