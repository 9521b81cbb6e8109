"""The free worker slots of a pulling array's allocations: what a spare client asks before it claims a shard.

A pulling allocation keeps one spare client ready, which claims the next shard while every worker slot is still
busy. When another allocation of the same array (its sibling: same array job, so same stage and pool) has a free
slot and is waiting for a shard, that early claim would take the shard from the one that could start it now.
So each allocation publishes its free slots (:class:`SlotBoard`, ``slots/<array>/task-<task>.json``,
a ``SlotsRecord`` rewritten atomically at least every ``HEARTBEAT_S`` while it has any, removed when it has none
or exits), and a spare claims only when no sibling publishes a free slot. An entry older than ``STALE_S`` (an
allocation that crashed or hangs) counts as gone, so it never holds spares back for long. A worker slot claiming
for itself never asks. Publishing is best effort: an entry that cannot be written (a full disk) only means the
siblings' spares are not held back, as before this rule; it never fails the allocation.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ddslurm.config import (
    ConfigError,
    ConfigFileError,
    RunLayout,
    SlotsRecord,
    atomic_write,
    encode,
    make_private_dir,
    read_json,
)

HEARTBEAT_S = 2.0
"""How often an allocation with free slots rewrites its entry (its heartbeat)."""
STALE_S = 10.0
"""An entry not rewritten for this long is an allocation that is gone (or stuck): it holds no spare back."""
CHECK_EVERY_S = 1.0
"""How often a spare held back reads its siblings' entries again."""


class Siblings(Protocol):
    """What an allocation tells the other allocations of its array, and what it learns from them."""

    def publish(self, free: int) -> None:
        """This allocation has ``free`` worker slots waiting for a shard (0: none)."""
        ...

    def sibling_idle(self) -> bool:
        """Another allocation of the array has a free worker slot and waits for a shard."""
        ...

    def close(self) -> None:
        """The allocation exits: it waits for nothing any more."""
        ...


class NoSiblings:
    """A one-shard task, or an allocation whose siblings are not asked: never holds a spare back."""

    def publish(self, free: int) -> None:
        return None

    def sibling_idle(self) -> bool:
        return False

    def close(self) -> None:
        return None


class SlotBoard:
    """The free slots of array task ``task`` of ``array_job_id``, published in the run directory, and its
    siblings' (every other ``task-*.json`` of the array). ``clock``: seconds since the epoch."""

    def __init__(
        self,
        layout: RunLayout,
        *,
        array_job_id: str,
        task: int,
        job_id: str,
        node: str,
        clock: Callable[[], float] = time.time,
        pid: int | None = None,
    ) -> None:
        self._dir = layout.slots(array_job_id)
        self._own = layout.slot_file(array_job_id, task)
        self._array, self._task, self._job, self._node = array_job_id, task, job_id, node
        self._pid = os.getpid() if pid is None else pid
        self._clock = clock
        self._free = 0
        self._written: float | None = None
        """When this allocation's entry was last written; None while it has none."""
        self._checked: tuple[float, bool] | None = None
        """The last answer of :meth:`sibling_idle` and when it was read."""

    def publish(self, free: int) -> None:
        now = self._clock()
        if free <= 0:
            if self._written is not None:
                self.close()
            return
        if self._written is not None and free == self._free and now - self._written < HEARTBEAT_S:
            return
        record = SlotsRecord(
            array_job_id=self._array,
            task=self._task,
            job_id=self._job,
            node=self._node,
            pid=self._pid,
            free=free,
            updated_at=now,
        )
        try:
            make_private_dir(self._dir, exist_ok=True)
            atomic_write(self._own, encode(record))
        except (OSError, ConfigError):
            return  # unpublished: siblings' spares claim as they would without the entry
        self._free, self._written = free, now

    def sibling_idle(self) -> bool:
        now = self._clock()
        if self._checked is not None and now - self._checked[0] < CHECK_EVERY_S:
            return self._checked[1]
        idle = any(self._waiting(path, now) for path in self._entries())
        self._checked = (now, idle)
        return idle

    def close(self) -> None:
        with contextlib.suppress(OSError):  # gone already; one left behind goes stale within STALE_S
            self._own.unlink()
        self._free, self._written = 0, None

    def _entries(self) -> list[Path]:
        try:
            with os.scandir(self._dir) as entries:
                names = [e.name for e in entries if e.name.startswith("task-") and e.name != self._own.name]
        except OSError:
            return []  # none published yet (or unreadable: then no sibling holds the spare back)
        return [self._dir / name for name in names]

    @staticmethod
    def _waiting(path: Path, now: float) -> bool:
        """A sibling's entry that says it waits for a shard now: a free slot, rewritten within ``STALE_S``."""
        try:
            record = read_json(path, SlotsRecord)
        except (OSError, ConfigFileError):
            return False  # gone meanwhile, or not an entry this version reads
        return record.free > 0 and now - record.updated_at <= STALE_S
