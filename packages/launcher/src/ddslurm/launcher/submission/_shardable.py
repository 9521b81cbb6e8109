"""Recipe parts that cannot be sharded exactly, refused at submit with the field and the reason.

A run's shards are Data Designer runs of their own, each writing one dataset directory; collection merges their
``parquet-files/`` batches (``ddslurm.collector``) and nothing else. What Data Designer 0.9.7 writes outside them
would be split over the shards' directories and left out of the collected dataset, so it is refused:

- ``image`` columns: each image is a file (``images/<column>/<uuid>.png``) beside the shard's batches, and the
  column holds its path relative to the shard's dataset directory;
- ``schema_transform`` processors: the transformed dataset is a second set of batches
  (``processors-files/<name>/``) beside each shard's.

And what no node can generate: ``person`` samplers read Data Designer's managed person datasets
(``managed-assets/datasets/<locale>.parquet``), and the node runs Data Designer in a scratch home of its own
(``ddslurm.runtime._engine.engine_environment``) that holds none.

Every other column and processor type of Data Designer is sharded exactly: docs/recipes.md says how, type by
type.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddslurm.config import recipe_section
from ddslurm.launcher.errors import SubmitError
from ddslurm.providers import Origin

REFUSED_COLUMNS: Mapping[str, str] = {
    "image": (
        "image columns cannot be sharded: Data Designer writes each image as a file beside the shard's batches "
        "(images/<column>/) and the column holds its path relative to the shard's dataset directory, which "
        "collection does not carry; generate images with one plain Data Designer run"
    ),
}
"""Column types refused at submit, with the reason."""
REFUSED_SAMPLERS: Mapping[str, str] = {
    "person": (
        "person samplers read Data Designer's managed person datasets (managed-assets/datasets/<locale>.parquet), "
        "and the nodes run Data Designer in a scratch home that holds none; use sampler_type: person_from_faker"
    ),
}
"""Sampler types refused at submit, with the reason."""
REFUSED_PROCESSORS: Mapping[str, str] = {
    "schema_transform": (
        "schema_transform processors cannot be sharded: Data Designer writes the transformed dataset as a second "
        "set of batches beside each shard's (processors-files/<name>/), which collection does not merge; run "
        "the transform on the collected dataset instead"
    ),
}
"""Processor types refused at submit, with the reason."""


def refuse_unshardable(recipe: Mapping[str, Any], origin: Path | Origin) -> None:
    """Refuse (:class:`SubmitError`) the first column or processor of ``recipe`` whose type cannot be sharded
    exactly, at ``origin``'s line and column of its type (``origin``: the recipe file, or the builder's
    ``build.py:function()``, which has none: its line that made the column, where the build recorded it)."""
    section = recipe_section(recipe)
    prefix: list[str | int] = ["data_designer"] if section is not recipe else []
    for key, field, refused in (
        ("columns", "column_type", REFUSED_COLUMNS),
        ("columns", "sampler_type", REFUSED_SAMPLERS),
        ("processors", "processor_type", REFUSED_PROCESSORS),
    ):
        for i, entry in enumerate(section.get(key) or []):
            kind = str(entry.get(field)) if isinstance(entry, Mapping) else ""
            if kind in refused:
                steps = [*prefix, key, i, field]
                name = entry.get("name")
                placed = origin if isinstance(origin, Origin) else Origin(origin)
                where = placed.at(*steps, shown=f"{key}[{i}].{field}")
                raise SubmitError(f"{where} ({name!r}): {refused[kind]}")
