"""Following a run until it ends: the refreshes of ``status --watch`` and ``wait``, and what ``wait`` does once
the run has ended.

:func:`follow_run` yields the run's status again and again (a scheduler query that fails is yielded as
:class:`SchedulerBusy` and retried with a growing back-off) and stops after the first status in
:data:`~ddslurm.launcher.runs._status_model.TERMINAL`; with a ``timeout`` it raises :class:`WaitTimeout` instead of
going on.
:func:`wait_for_run` follows the run to its end; :func:`release` then cancels what the queue still holds of a
succeeded run; :func:`wait_to_end` is ``ddslurm wait`` without the terminal (both, then the run's facts), for the
command, for ``ddslurm workflow`` and for :meth:`ddslurm.launcher.api.Client.wait`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

from ddslurm.config import RunLayout
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import LauncherError, SlurmError
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.runs._status_model import TERMINAL, RunStatus
from ddslurm.launcher.runs._steer import release_leftovers

WATCH_EVERY = 2.0
"""Seconds between the refreshes of ``status --watch``."""
WAIT_EVERY, WAIT_GROW = 1.0, 1.3
"""``wait``: the first refreshes 1 s apart, each wait 1.3 times the one before, up to :data:`MAX_EVERY`."""
MAX_EVERY = 5.0
FIRST_BACKOFF, MAX_BACKOFF = 2.0, 60.0
"""After a scheduler query that failed: the wait before the next one, doubled each time up to 60 s."""


@dataclass(frozen=True, slots=True)
class SchedulerBusy:
    """A refresh whose scheduler query failed (a busy controller); the next one comes ``retry_in`` seconds later."""

    error: SlurmError
    retry_in: float

    def note(self) -> str:
        """What ``status --watch`` and ``wait`` say of it."""
        return f"scheduler query failed ({self.error}); retrying in {self.retry_in:.0f} s"


class WaitTimeout(LauncherError):
    """The run had not ended ``seconds`` after the wait began; ``status``: its last status (None: none was read)."""

    def __init__(self, status: RunStatus | None, seconds: float) -> None:
        state = status.state if status is not None else "unknown"
        super().__init__(f"run still {state} after {seconds:.0f} s")
        self.status, self.seconds = status, seconds


def follow_run(
    layout: RunLayout,
    slurm: Slurm,
    *,
    every: float = WATCH_EVERY,
    grow: float = 1.0,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[RunStatus | SchedulerBusy]:
    """The run's status, ``every`` seconds apart (times ``grow`` each time, at most :data:`MAX_EVERY` s when
    growing), up to and including the first status in ``TERMINAL``. A scheduler query that failed is yielded as
    :class:`SchedulerBusy` (then waiting twice as long each time, up to 60 s). With ``timeout``: once that many
    seconds have passed without a terminal status, :class:`WaitTimeout` (with the last status read)."""
    start = clock()
    wait, backoff = every, FIRST_BACKOFF
    last: RunStatus | None = None
    while True:
        try:
            st = run_status(layout, slurm)
        except SlurmError as exc:
            yield SchedulerBusy(exc, backoff)
            pause, backoff = backoff, min(backoff * 2, MAX_BACKOFF)
        else:
            backoff, last = FIRST_BACKOFF, st
            yield st
            if st.state in TERMINAL:
                return
            pause = wait
            wait = min(wait * grow, MAX_EVERY) if grow > 1.0 else wait
        if timeout is not None and clock() - start > timeout:
            raise WaitTimeout(last, timeout)
        sleep(pause)


def wait_for_run(
    layout: RunLayout,
    slurm: Slurm,
    *,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_update: Callable[[RunStatus | SchedulerBusy], None] | None = None,
) -> RunStatus:
    """``ddslurm wait``: follow the run until it ends and return its terminal status (``succeeded`` is the only
    success); :class:`WaitTimeout` after ``timeout`` seconds. ``on_update``: told of every refresh. ``wait`` then
    calls :func:`release`."""
    st: RunStatus | None = None
    for polled in follow_run(layout, slurm, every=WAIT_EVERY, grow=WAIT_GROW, timeout=timeout, sleep=sleep):
        if on_update is not None:
            on_update(polled)
        if not isinstance(polled, SchedulerBusy):
            st = polled
    assert st is not None  # follow_run ends only after a terminal status
    return st


@dataclass(frozen=True, slots=True)
class Released:
    """What :func:`release` cancelled of a succeeded run's queued tasks; ``error``: why it could not."""

    tasks: tuple[str, ...] = ()
    error: SlurmError | None = None


def release(layout: RunLayout, slurm: Slurm, status: RunStatus) -> Released:
    """``release_leftovers`` for a run that has ended, where a scheduler that fails is said, not raised: the run's
    result stands, and the leftovers only cost job starts."""
    try:
        return Released(release_leftovers(layout, slurm, status))
    except SlurmError as exc:
        return Released(error=exc)


def wait_to_end(
    layout: RunLayout,
    slurm: Slurm,
    *,
    notes: TextIO,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_update: Callable[[RunStatus], None] | None = None,
) -> RunStatus:
    """``ddslurm wait``: follow the run until it ends (each status to ``on_update``, a busy scheduler said on
    ``notes``) and return its terminal status; then cancel what a succeeded run left queued and record a succeeded
    run's facts (what either could not do, or did, is a line on ``notes``: the run's result stands).
    :class:`WaitTimeout` after ``timeout`` seconds."""

    def update(polled: RunStatus | SchedulerBusy) -> None:
        if isinstance(polled, SchedulerBusy):
            notes.write(f"{polled.note()}\n")
            notes.flush()
        elif on_update is not None:
            on_update(polled)

    st = wait_for_run(layout, slurm, timeout=timeout, sleep=sleep, on_update=update)
    released = release(layout, slurm, st)
    if released.error is not None:  # the run's result stands; the leftovers only cost job starts
        notes.write(f"note: the run's leftover queued tasks could not be cancelled ({released.error})\n")
    if released.tasks:
        notes.write(
            f"note: cancelled {len(released.tasks)} queued task(s) of the succeeded run that could only have "
            f"recorded superseded: {', '.join(released.tasks)}\n"
        )
    if st.state == "succeeded":  # what the run measured, into the workspace's facts (never fails the wait)
        from ddslurm.launcher.facts._workspace import record_after

        record_after(layout, slurm, notes)
    return st
