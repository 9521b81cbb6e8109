"""The output files: row groups of a bounded size, files rolled over at a target size, hashed while written."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ddslurm.collector.errors import OutputWriteError
from ddslurm.config import FileEntry

ROW_GROUP_ROWS = 128 * 1024
ROW_GROUP_BYTES = 128 << 20
TARGET_FILE_BYTES = 512 << 20


class _HashingFile(io.RawIOBase):
    """A file that hashes every byte written to it (Parquet is written front to back, never seeking), so the
    manifest's sha256 needs no second read of the output. :meth:`create` makes a new owner-only one: the file is
    opened before this object exists, so a failed open (a full disk) leaves no half-made object whose finalizer
    closes a file it never had (Python 3.13 reports such errors)."""

    def __init__(self, file: io.FileIO) -> None:
        super().__init__()
        self._file = file
        self._hash = hashlib.sha256()
        self._discard = False
        self.size = 0

    @classmethod
    def create(cls, path: Path) -> _HashingFile:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        return cls(io.FileIO(fd, "wb"))

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if self._discard:
            return len(view)
        self._hash.update(view)
        written = 0
        while written < len(view):
            written += self._file.write(view[written:]) or 0
        self.size += written
        return written

    def tell(self) -> int:
        return self.size

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def discard(self) -> None:
        """Accept and drop further writes (a writer being abandoned may still write its footer)."""
        self._discard = True


class PartWriter:
    """Buffers batches into row groups of at most ``row_group_rows`` rows and about ``row_group_bytes`` bytes
    (a batch larger than that is split across groups) and rolls over to a new file at the target size; memory
    holds at most one row group."""

    def __init__(
        self,
        directory: Path,
        schema: pa.Schema,
        *,
        target_file_bytes: int = TARGET_FILE_BYTES,
        row_group_rows: int = ROW_GROUP_ROWS,
        row_group_bytes: int = ROW_GROUP_BYTES,
    ) -> None:
        self._dir = directory
        self._schema = schema
        self._target = target_file_bytes
        self._group_rows = max(1, row_group_rows)
        self._group_bytes = max(1, row_group_bytes)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0.0
        self._writer: pq.ParquetWriter | None = None
        self._sink: _HashingFile | None = None
        self.files: list[FileEntry] = []

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write that fails (a full disk or quota: any OSError, from the file or from Parquet's writer) is an
        :class:`OutputWriteError` naming the file."""
        try:
            yield
        except OSError as exc:
            raise OutputWriteError(self._dir / f"part-{len(self.files):05d}.parquet", exc) from exc

    def add(self, table: pa.Table) -> None:
        with self._writing():
            self._add(table)

    def _add(self, table: pa.Table) -> None:
        rows = table.num_rows
        row_bytes = table.nbytes / rows if rows else 0.0
        offset = 0
        while offset < rows:
            room = min(rows - offset, self._group_rows - self._pending_rows)
            if row_bytes:
                room = min(room, int((self._group_bytes - self._pending_bytes) // row_bytes))
            if room <= 0:
                if self._pending_rows:
                    self._flush()
                    continue
                room = 1  # a single row larger than the byte bound is a group of its own
            self._pending.append(table.slice(offset, room) if room < rows else table)
            self._pending_rows += room
            self._pending_bytes += room * row_bytes
            offset += room
            if self._pending_rows >= self._group_rows or self._pending_bytes + row_bytes > self._group_bytes:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None or (self._sink is not None and self._sink.size >= self._target):
            self._close_file()
            self._sink = _HashingFile.create(self._dir / f"part-{len(self.files):05d}.parquet")
            self._writer = pq.ParquetWriter(self._sink, self._schema)
        group = self._pending[0] if len(self._pending) == 1 else pa.concat_tables(self._pending)
        self._writer.write_table(group, row_group_size=max(1, group.num_rows))
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0.0

    def _close_file(self) -> None:
        if self._writer is not None and self._sink is not None:
            self._writer.close()
            self._sink.close()
            name = f"part-{len(self.files):05d}.parquet"
            self.files.append(FileEntry(path=name, size=self._sink.size, sha256=self._sink.hexdigest()))
        self._writer, self._sink = None, None

    def close(self) -> list[FileEntry]:
        """Write what is pending and close the last file; the written files with their size and sha256."""
        with self._writing():
            self._flush()
            self._close_file()
        return self.files

    def abort(self) -> None:
        """Close the open file without finishing it (the staging directory is about to be removed), so that
        nothing is left for a destructor to write (or complain about) later."""
        if self._sink is not None:
            self._sink.discard()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._sink is not None:
            self._sink.close()
        self._writer, self._sink, self._pending = None, None, []
