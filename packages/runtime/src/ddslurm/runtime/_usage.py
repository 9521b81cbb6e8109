"""What a client step used: its CPU-seconds and wall time, written to its attempt's ``client-usage.json`` when it
ends (:class:`~ddslurm.config.ClientUsage`); the facts' client CPU per request comes from it."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ddslurm.config import ClientUsage, atomic_write, encode_pretty


def process_cpu_s() -> float:
    """User + system CPU-seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def recording_usage(
    path: Path,
    log: Any,
    *,
    cpu: Callable[[], float] = process_cpu_s,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[None]:
    """Write what the block (the client step's generation) used to ``path`` when it ends, whether it succeeded or
    failed: the process's CPU-seconds, those it had spent before the block (its imports), and the block's wall
    time; a write that fails is logged (``client.usage_unwritten``) and never fails the attempt."""
    started, setup = clock(), cpu()
    try:
        yield
    finally:
        usage = ClientUsage(cpu_s=round(cpu(), 3), setup_cpu_s=round(setup, 3), wall_s=round(clock() - started, 3))
        try:
            atomic_write(path, encode_pretty(usage))
        except OSError as exc:
            log.warning("client.usage_unwritten", path=str(path), error=f"{type(exc).__name__}: {exc}")
