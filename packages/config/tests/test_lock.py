"""Issue 39: the one lock helper (:func:`ddslurm.config.exclusive_lock`) for every package: bounded (the workspace's
facts), tried once (a second submitter, a second collection: :class:`LockHeldError`, which the caller words), or
blocking (the hosted key budget). No timing is asserted: a blocking lock is seen waiting in ``/proc/locks``, and
released on the test's cue."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ddslurm.config import ConfigError, LockHeldError, exclusive_lock
from ddslurm.config.testing import lock_waiters, wait_for_lock_waiter


def test_a_blocking_lock_waits_as_long_as_the_holder_holds_it(tmp_path: Path) -> None:
    lock = tmp_path / "budget.json.lock"
    got, leave = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def waiter() -> None:
        try:
            with exclusive_lock(lock, wait_s=None):
                got.set()
                leave.wait(60)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    with exclusive_lock(lock, wait_s=0):  # the holder: a descriptor of its own, as another process would have
        thread.start()
        wait_for_lock_waiter(lock)  # it asked, and waits: not refused, not through
        assert not got.is_set() and not raised and thread.is_alive()
    got.wait(60)  # released: it takes the lock
    assert got.is_set() and not raised, raised
    assert lock_waiters(lock) == 0
    with pytest.raises(LockHeldError), exclusive_lock(lock, wait_s=0):  # and holds it until its block ends
        pass
    leave.set()
    thread.join(60)
    assert not thread.is_alive() and not raised, raised
    with exclusive_lock(lock, wait_s=0):
        pass


def test_a_lock_tried_once_is_refused_at_once_naming_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / ".submit.lock"
    with exclusive_lock(lock, wait_s=0), pytest.raises(LockHeldError) as refused, exclusive_lock(lock, wait_s=0):
        pass
    error = refused.value
    assert isinstance(error, ConfigError)  # every caller that catches the bounded wait's refusal still does
    assert error.path == lock and error.holder == f"process {os.getpid()} of uid {os.geteuid()}"
    assert str(error).startswith(f"{lock}: still locked after 0 s: process {os.getpid()} of uid {os.geteuid()} ")
    with exclusive_lock(lock, wait_s=0):  # released: taken at the first try
        pass


def test_the_lock_file_is_open_for_writing_while_held(tmp_path: Path) -> None:
    """Over NFS ``flock`` is a byte-range lock, and an exclusive one needs a descriptor open for writing."""
    lock = tmp_path / "facts.json.lock"
    with exclusive_lock(lock, wait_s=None):
        (fd,) = [entry.name for entry in Path("/proc/self/fd").iterdir() if entry.resolve() == lock.resolve()]
        info = (Path("/proc/self/fdinfo") / fd).read_text().splitlines()
        flags = int(next(line for line in info if line.startswith("flags:")).split()[1], 8)
        assert flags & os.O_ACCMODE == os.O_RDWR, info
