"""A step's output copied to its log file with every byte of the allocation's token taken out.

Why here, and not in the engine: SGLang logs its whole ``ServerArgs`` at INFO when it starts, ``api_key='…'``
included (sgl-project/sglang#37457, open; the redacting fixes #18518 and #19328 unmerged or closed). It does so from
``launch_server``'s process (``_launch_subprocesses``: ``logger.info(f"{server_args=}")``), on every node rank,
and newer releases from ``Engine.__init__`` with ``server_args.resolved_dict()`` instead; the scheduler and
detokenizer processes it spawns receive the same arguments. A patch inside the boot program (a masked
``ServerArgs.__repr__``, a logging filter) would hold for one release's log site and one process: a filter on the
root logger's handlers is dropped by SGLang's own ``logging.basicConfig(force=True)``, a spawned child imports
``sglang`` afresh without the patch, and a new log site (a dict, a traceback that prints the arguments) would carry
the key again. vLLM logs its non-default arguments the same way (``--api-key`` given on a command line would be
among them). The one place every byte a step writes passes, whatever the engine, its version or its processes,
is the step's standard output and error, which the runtime hands it: so the runtime reads that pipe and writes
the log file itself, each occurrence of the token replaced by :data:`REDACTED`, and the token never reaches the
file (the secret scan before publishing then finds nothing to reject).

A token split across two reads is still found: the bytes at the end of a read that could begin a token are held
back until the next read (or the end of the output) says whether they do. Only such a tail is held, never a whole
line that cannot be one (a line ending in a newline is written at once).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REDACTED = b"[redacted]"
"""What stands in a step's log where the step wrote a secret."""
_READ = 1 << 16
DRAIN_S = 10.0
"""How long a step's exit waits for the rest of its output to reach the log (a child that outlives the step and
holds the pipe open does not hold the exit longer; what it writes still reaches the log afterwards)."""


class Redactor:
    """Replaces every occurrence of any of ``secrets`` (non-empty ones) in a stream fed in pieces."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._needles = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes that can be written now: ``chunk`` after what was held, each whole secret replaced, less a
        tail that may be the start of a secret (held for the next feed)."""
        data = self._held + chunk
        for needle in self._needles:
            data = data.replace(needle, REDACTED)
        keep = self._tail(data)
        self._held = data[len(data) - keep :]
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        """What was held at the end of the stream (it never held a whole secret)."""
        rest, self._held = self._held, b""
        return rest

    def _tail(self, data: bytes) -> int:
        """The length of the longest end of ``data`` that is the start (not all) of a secret."""
        best = 0
        for needle in self._needles:
            for size in range(min(len(needle) - 1, len(data)), best, -1):
                if data.endswith(needle[:size]):
                    best = size
                    break
        return best


def _pump(fd: int, log: Path, redactor: Redactor) -> None:
    with open(fd, "rb", buffering=0, closefd=True) as source, log.open("ab", buffering=0) as sink:
        while chunk := source.read(_READ):
            if out := redactor.feed(chunk):
                sink.write(out)
        if rest := redactor.flush():
            sink.write(rest)


class RedactedPopen(subprocess.Popen[bytes]):
    """A process whose standard output and error reach ``log`` through a :class:`Redactor` (a thread of this
    process copies them). Once it has exited, :meth:`poll` and :meth:`wait` return only after its output is in
    the log (up to :data:`DRAIN_S`), so a log tail read at its death holds its last lines."""

    def __init__(self, argv: Sequence[str], *, log: Path, secrets: Iterable[str], **kwargs: Any) -> None:
        self._drained = True  # nothing to drain until the pump runs
        read, write = os.pipe()
        try:
            super().__init__(list(argv), stdout=write, stderr=subprocess.STDOUT, **kwargs)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self._pump = threading.Thread(
            target=_pump, args=(read, log, Redactor(secrets)), name=f"log-{log.name}", daemon=True
        )
        self._pump.start()
        self._drained = False

    def _drain(self) -> None:
        if not self._drained:
            self._pump.join(DRAIN_S)
            self._drained = True

    def poll(self) -> int | None:
        status = super().poll()
        if status is not None:
            self._drain()
        return status

    def wait(self, timeout: float | None = None) -> int:
        status = super().wait(timeout)
        self._drain()
        return status
