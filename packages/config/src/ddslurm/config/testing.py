"""Helpers for tests and benchmarks of packages built on the contracts (like Go's ``httptest``).

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ddslurm.config._plan import Plan, Resources, ShardSpec


def make_plan(run_id: str = "run-1", shard_rows: tuple[int, ...] = (2,), **overrides: Any) -> Plan:
    """A valid plan with contiguous shards of ``shard_rows`` records; any field can be overridden."""
    shards, first = [], 0
    for index, rows in enumerate(shard_rows):
        shards.append(ShardSpec(index=index, first_record=first, num_records=rows))
        first += rows
    resources = Resources(time_minutes=10)
    plan = Plan(
        run_id=run_id,
        run_name="test",
        num_records=first,
        shards=tuple(shards),
        resume="never",
        buffer_size=max(shard_rows),
        recipe_file="-",
        recipe_sha256="-",
        snapshot_file="-",
        snapshot_sha256="-",
        secret_env=(),
        python_env="-",
        generation=resources,
        collection=resources,
    )
    return msgspec.structs.replace(plan, **overrides) if overrides else plan
