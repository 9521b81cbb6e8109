"""Helpers for tests and benchmarks: a run directory whose shards already published winners.

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.config import (
    FileEntry,
    RunLayout,
    WinnerRecord,
    atomic_write,
    digest,
    encode,
    make_private_dir,
    publish_once,
    sha256_file,
)
from ddslurm.config.testing import make_plan


def make_published_run(
    root: Path,
    shard_batches: Sequence[Sequence[pa.Table]],
    *,
    publish: Sequence[bool] | None = None,
    partial: Sequence[int] = (),
    column_order: tuple[str, ...] | None = None,
) -> RunLayout:
    """``root/run-1`` with one shard per entry of ``shard_batches``, each written as Data Designer would
    (``parquet-files/batch_NNNNN.parquet``) and, unless ``publish`` says otherwise, published as the winner
    (marked partial, as ``accept-partial`` publishes it, for the shards in ``partial``)."""
    layout = RunLayout(root / "run-1")
    make_private_dir(layout.root)  # as submit makes it: commands refuse one others could change
    plan = make_plan(layout.run_id, tuple(sum(t.num_rows for t in batches) for batches in shard_batches))
    if column_order is not None:
        plan = msgspec.structs.replace(plan, column_order=column_order)
    atomic_write(layout.plan, encode(plan))
    for index, batches in enumerate(shard_batches):
        shard = layout.shard(index)
        dataset = shard.attempt("attempt-1").output / f"shard-{index:05d}"
        (dataset / "parquet-files").mkdir(parents=True)
        entries = []
        for number, table in enumerate(batches):
            path = dataset / "parquet-files" / f"batch_{number:05d}.parquet"
            pq.write_table(table, path)
            entries.append(
                FileEntry(path=str(path.relative_to(dataset)), size=path.stat().st_size, sha256=sha256_file(path))
            )
        if publish is None or publish[index]:
            winner = WinnerRecord(
                shard=index,
                attempt="attempt-1",
                rows=sum(t.num_rows for t in batches),
                dataset_dir=str(dataset),
                files=tuple(entries),
                plan_sha256=digest(plan),
                published_at="2026-01-01T00:00:00+00:00",
                partial=index in partial,
            )
            publish_once(shard.winner, encode(winner))
    return layout


class BlockedStderr:
    """A pipe for a child's stderr that is full before the child starts: the child's first write to stderr
    blocks until :meth:`drain` reads it. A collection's first progress line then holds it half-way, so a
    test can signal it at a known point without sleeping."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self._filler = 0
        os.set_blocking(self.write_fd, False)
        chunk = b"." * 4096
        while True:
            try:
                self._filler += os.write(self.write_fd, chunk)
            except BlockingIOError:
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
        os.set_blocking(self.write_fd, True)

    def child_started(self) -> None:
        """Close this process's copy of the write end (the child holds its own)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def wait_for(self, condition: Callable[[], bool], proc: subprocess.Popen[Any], timeout: float = 60.0) -> bool:
        """Poll ``condition`` until it holds, the child exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if proc.poll() is not None:
                return condition()
            time.sleep(0.01)
        return False

    def drain(self, timeout: float = 60.0) -> str:
        """Everything the child wrote to stderr until it closed it (the filler removed)."""
        data = bytearray()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                break
            data += chunk
        return bytes(data[self._filler :]).decode(errors="replace")

    def close(self) -> None:
        self.child_started()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


@contextlib.contextmanager
def blocked_stderr() -> Iterator[BlockedStderr]:
    pipe = BlockedStderr()
    try:
        yield pipe
    finally:
        pipe.close()
