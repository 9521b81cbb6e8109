"""An attempt's progress file (``progress.json``), from Data Designer's callbacks: the rows and batches on disk
after each completed batch, and the records of the batch being generated from its finished cells."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddslurm.config import BATCH_COMPLETE, Progress, atomic_write, encode
from ddslurm.runtime._verify import rows_on_disk


class CellProgress:
    """Records of the batch being generated, from Data Designer's finished cells: cells since the last completed
    batch over the recipe's LLM columns, capped one short of a batch. Reported at most once per ``interval``
    seconds (cells finish from many threads at once)."""

    def __init__(self, columns: int, batch: int, *, clock: Callable[[], float], interval: float = 1.0) -> None:
        self._columns, self._batch, self._clock, self._interval = max(1, columns), batch, clock, interval
        self._lock = threading.Lock()
        self._cells = 0
        self._rows = self._batches = 0
        self._last = float("-inf")

    def batch_done(self, rows: int, batches: int) -> None:
        with self._lock:
            self._cells, self._rows, self._batches = 0, rows, batches

    def cell_done(self) -> tuple[int, int, int] | None:
        """(rows on disk, batches, records of the current batch) when a report is due, else None."""
        with self._lock:
            self._cells += 1
            now = self._clock()
            if now - self._last < self._interval:
                return None
            self._last = now
            in_batch = min(self._cells // self._columns, max(0, self._batch - 1))
            return self._rows, self._batches, in_batch


class ProgressFile:
    """Writes ``path`` (an attempt's ``progress.json``) as Data Designer completes batches of ``batch`` records and
    cells of ``columns`` LLM columns for the dataset in ``target``; the batches already there (a resumed dataset)
    count from the start."""

    def __init__(
        self,
        path: Path,
        target: Path,
        *,
        columns: int,
        batch: int,
        now: Callable[[], str],
        log: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._cells = CellProgress(columns, batch, clock=clock)
        self._now = now
        self._log = log
        if target.is_dir():
            self._cells.batch_done(*rows_on_disk(target))

    def batch_done(self, batch: Path) -> None:
        """Data Designer wrote the batch file ``batch``."""
        rows, batches = self.write(batch.parent)
        self._cells.batch_done(rows, batches)
        self._log.info(BATCH_COMPLETE, file=str(batch), rows=rows, batches=batches)

    def cell_done(self) -> None:
        """Data Designer finished a cell (from any of its threads)."""
        due = self._cells.cell_done()
        if due is not None:
            rows, batches, in_batch = due
            progress = Progress(rows=rows, batches=batches, updated_at=self._now(), in_batch=in_batch)
            atomic_write(self._path, encode(progress))

    def write(self, directory: Path) -> tuple[int, int]:
        """Record the rows and batches on disk in ``directory`` (see :func:`rows_on_disk`); returns them."""
        rows, batches = rows_on_disk(directory)
        atomic_write(self._path, encode(Progress(rows=rows, batches=batches, updated_at=self._now())))
        return rows, batches
