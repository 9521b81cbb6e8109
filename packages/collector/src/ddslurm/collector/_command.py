"""A collection as a command: output and exit code, the same for ``ddslurm-collect`` (the Slurm job's entry
point) and ``ddslurm collect --local``.

Exit codes: 0 collected; 1 (``EXIT_FAILED``) the collection failed (:class:`CollectError`: missing winners, a
changed batch file, a schema conflict, an existing destination); 2 (``EXIT_UNREADABLE``) the run directory
cannot be read; 128 + N when signal N (SIGTERM: 143, SIGINT: 130) interrupted it. In every failing case
nothing was published and no staging directory is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import msgspec

from ddslurm.collector._merge import CollectResult, collect, progress_reporter
from ddslurm.collector.errors import CollectError
from ddslurm.config import ConfigError, RunLayout, check_run_tree

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREADABLE = 2
EXIT_SIGNAL_BASE = 128


def result_json(result: CollectResult) -> dict[str, Any]:
    """What ``--json`` prints: ``{"dataset", "rows", "files", "manifest"}``."""
    return {
        "dataset": str(result.dataset),
        "rows": result.rows,
        "files": [str(f) for f in result.files],
        "manifest": str(result.manifest),
    }


def print_result(result: CollectResult, *, as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(msgspec.json.encode(result_json(result)).decode() + "\n")
    else:
        out.write(f"collected {result.rows} rows into {result.dataset}\n")
    out.flush()


@dataclass(slots=True)
class Termination:
    """What SIGTERM does during a collection: unwind (KeyboardInterrupt) until the dataset is being renamed into
    place; from then on only recorded, so a collection is never interrupted between publishing and saying so."""

    received: list[int] = field(default_factory=list)
    holding: bool = False
    published: bool = False

    def on_signal(self, signum: int, _: FrameType | None) -> None:
        self.received.append(signum)
        if not (self.holding or self.published):
            raise KeyboardInterrupt(f"signal {signum}")

    @contextlib.contextmanager
    def publishing(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
            self.published = True
        finally:
            self.holding = False


@contextlib.contextmanager
def sigterm_unwinds(termination: Termination) -> Iterator[None]:
    """While active, SIGTERM is handled by ``termination`` (main thread only): before publication it raises
    KeyboardInterrupt, so a collection unwinds like Ctrl-C: its staging directory is removed, nothing published."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, termination.on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def collect_command(
    layout: RunLayout,
    *,
    destination: Path | None = None,
    overwrite: bool = False,
    as_json: bool = False,
    out: TextIO,
    err: TextIO,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Collect, print the result to ``out`` (errors to ``err``) and return the exit code. ``progress`` is called
    with (batch files done, total) as the collection advances; by default a line on ``err`` every 5 %. A run
    directory another user could have changed is refused (:func:`~ddslurm.config.check_run_tree`); a write that
    fails (a full disk or quota) ends in an error, nothing published."""
    termination = Termination()
    received = termination.received
    try:
        check_run_tree(layout.root)
        with sigterm_unwinds(termination):
            result = collect(
                layout,
                destination=destination,
                overwrite=overwrite,
                progress=progress if progress is not None else progress_reporter(err),
                publishing=termination.publishing,
            )
            print_result(result, as_json=as_json, out=out)
        if received:
            name = signal.Signals(received[0]).name
            print(f"note: {name} arrived after the dataset was published; it is complete", file=err, flush=True)
    except KeyboardInterrupt:
        signum = received[0] if received else signal.SIGINT
        name = signal.Signals(signum).name
        print(f"error: collection interrupted by {name}; nothing was published", file=err, flush=True)
        return EXIT_SIGNAL_BASE + signum
    except CollectError as exc:
        print(f"error: {exc}", file=err, flush=True)
        return EXIT_FAILED
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=err, flush=True)
        return EXIT_UNREADABLE
    except OSError as exc:  # the staging directory or the manifest: the dataset was not published
        where = f" ({exc.filename})" if exc.filename else ""
        full = ": the file system or your quota is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        message = f"cannot write the dataset of run {layout.run_id}: {exc.strerror or exc}{where}{full}"
        print(f"error: {message}; nothing was published", file=err, flush=True)
        return EXIT_FAILED
    return EXIT_OK
