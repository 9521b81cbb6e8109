"""Helpers for tests and benchmarks of packages built on the contracts (like Go's ``httptest``).

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config._files import proc_locks
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


def lock_waiters(path: Path) -> int:
    """How many ``flock`` requests wait for the lock file ``path`` now (``->`` lines of ``/proc/locks``)."""
    return sum(parts[1] == "->" for parts in proc_locks(path.stat()))


def wait_for_lock_waiter(path: Path, bound_s: float = 60.0) -> None:
    """Return once a request waits for the lock file ``path``: the event that proves a blocking lock is waiting for
    its holder, not done and not refused. The bound only keeps a waiter that never came from hanging the test
    (an ``AssertionError`` then); nothing asserts how long it took."""
    deadline = time.monotonic() + bound_s
    while lock_waiters(path) == 0:
        if time.monotonic() >= deadline:
            raise AssertionError(f"no request waited for the lock {path} within {bound_s:g} s")
        time.sleep(0.01)
