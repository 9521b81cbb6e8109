"""Issue 37: what another user can plant in a workspace. A workspace (or its ``runs/``) others can write is refused,
sticky or not; the files ddslurm reads there are read only when they are this user's own regular files that no
one else can write, opened without following a link and without blocking; the facts' lock is waited for a bounded
time and then refused with the file and its holder."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddslurm.config import (
    ConfigError,
    Facts,
    ModelFact,
    ModelShape,
    UnsafePathError,
    check_not_swappable,
    check_workspace,
    exclusive_lock,
    facts_lock,
    own_facts,
    read_facts,
    read_regular,
    update_facts,
    write_facts,
)

ROOT = os.geteuid() == 0
NOBODY = 65534


def _fact(model: str, load_s: float = 60.0) -> ModelFact:
    return ModelFact(
        shape=ModelShape(model=model), load_s=load_s, requests_per_s=4.0, capacity=8, measured_by="run",
        run_id="r1", measured_at="t",
    )  # fmt: skip


def finishes(call: Callable[[], object]) -> object:
    """``call()``'s result (or what it raised, raised again), run in a thread: a call that blocks (the open of a
    FIFO, a lock never released) fails the test instead of hanging the suite. The bound is a safety net only;
    nothing asserts how long the call took."""
    result: list[object] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the call blocked"
    if raised:
        raise raised[0]
    return result[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO nobody writes to; released at the end so that a reader blocked on it (before the fix) ends."""
    path = tmp_path / "facts.json"
    os.mkfifo(path, 0o644)
    yield path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


# --- the workspace ---


@pytest.mark.parametrize("mode", [0o1777, 0o1770, 0o777, 0o775, 0o757])
def test_a_workspace_others_can_write_is_refused_sticky_or_not(tmp_path: Path, mode: int) -> None:
    workspace = tmp_path / "shared"
    workspace.mkdir()
    workspace.chmod(mode)
    with pytest.raises(UnsafePathError) as refused:
        check_workspace(workspace)
    message = str(refused.value)
    assert f"{workspace}: mode {mode:04o} lets other users write in it" in message, message
    assert ("sticky bit" in message) == bool(mode & stat.S_ISVTX), message
    # what to do instead: a directory of one's own, named in the message
    assert f"mkdir -m 700 {workspace}/" in message and "profile's workspace" in message, message
    with pytest.raises(UnsafePathError, match="lets other users write in it"):
        check_not_swappable(workspace)  # the same check every command makes of a run's workspace


def test_a_private_workspace_and_one_not_made_yet_pass_and_a_shared_runs_directory_is_refused(tmp_path: Path) -> None:
    check_workspace(tmp_path / "not-yet")  # submit makes it 0700
    workspace = tmp_path / "ws"
    (workspace / "runs").mkdir(parents=True)
    workspace.chmod(0o700)
    check_workspace(workspace)
    (workspace / "runs").chmod(0o1777)
    with pytest.raises(UnsafePathError, match=r"runs: mode 1777 .*chmod 700"):
        check_workspace(workspace)


@pytest.mark.skipif(not ROOT, reason="giving a directory to another uid needs root")
def test_a_workspace_another_user_owns_is_refused(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir(mode=0o700)
    os.chown(workspace, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match=f"belongs to uid {NOBODY}"):
        check_workspace(workspace)


# --- files read in it ---


def test_a_fifo_is_refused_without_blocking(fifo: Path) -> None:
    for own in (False, True):
        with pytest.raises(UnsafePathError, match="is a FIFO, not a regular file"):
            finishes(lambda own=own: read_regular(fifo, own=own))


def test_an_own_file_is_a_regular_file_of_this_user_that_no_one_else_can_write(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"mine")
    path.chmod(0o600)
    assert read_regular(path, own=True) == b"mine"
    path.chmod(0o644)
    assert read_regular(path, own=True) == b"mine"  # others may read it, not change it
    for mode in (0o666, 0o620):
        path.chmod(mode)
        with pytest.raises(UnsafePathError, match=f"mode {mode:04o} lets other users change it"):
            read_regular(path, own=True)
        assert read_regular(path) == b"mine"  # without own: any regular file
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        read_regular(link, own=True)
    with pytest.raises(UnsafePathError, match="is a directory"):
        read_regular(tmp_path, own=True)


@pytest.mark.skipif(not ROOT, reason="giving a file to another uid needs root")
def test_a_file_of_another_user_is_not_own(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"theirs")
    path.chmod(0o644)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match=f"belongs to uid {NOBODY}, not to this user"):
        read_regular(path, own=True)


# --- the facts file ---


def _planted(workspace: Path) -> Path:
    """A facts file another user planted: one fact of a quick load, in a file others can write (as root, the other
    user's own file)."""
    path = workspace / "facts.json"
    write_facts(path, Facts(models=(_fact("planted", load_s=1.0),)))
    if ROOT:
        os.chown(path, NOBODY, NOBODY)
    else:
        path.chmod(0o666)
    return path


def test_facts_that_are_not_the_users_own_are_ignored_with_a_warning(tmp_path: Path) -> None:
    path = _planted(tmp_path)
    with pytest.raises(UnsafePathError):
        read_facts(path)
    facts, warning = own_facts(path)
    assert facts == Facts()
    assert warning is not None and warning.startswith(f"{path}: ") and "ignored" in warning, warning
    assert f"rm {path}" in warning, warning
    path.unlink()
    write_facts(path, Facts(models=(_fact("mine"),)))
    assert own_facts(path) == (Facts(models=(_fact("mine"),)), None)


def test_a_fifo_or_a_link_in_place_of_the_facts_is_ignored_without_blocking(fifo: Path, tmp_path: Path) -> None:
    facts, warning = finishes(lambda: own_facts(fifo))
    assert facts == Facts() and warning is not None and "is a FIFO" in warning
    elsewhere = tmp_path / "elsewhere.json"
    write_facts(elsewhere, Facts(models=(_fact("theirs"),)))
    link = tmp_path / "linked" / "facts.json"
    link.parent.mkdir()
    link.symlink_to(elsewhere)
    facts, warning = own_facts(link)
    assert facts == Facts() and warning is not None and "symbolic link" in warning


def test_recorded_facts_replace_a_planted_file_with_the_users_own_never_writing_into_it(tmp_path: Path) -> None:
    path = _planted(tmp_path)
    kept = tmp_path / "their-copy"
    os.link(path, kept)  # the planted file's inode, as its planter keeps it
    before = kept.read_bytes()
    update_facts(path, lambda facts: facts.with_model(_fact("measured")))
    assert kept.read_bytes() == before  # nothing written through the planted file
    st = path.stat()
    assert st.st_ino != kept.stat().st_ino and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert read_facts(path) == Facts(models=(_fact("measured"),))  # its facts were not merged


def test_a_fifo_in_place_of_the_facts_is_replaced_by_what_a_run_records(fifo: Path) -> None:
    finishes(lambda: update_facts(fifo, lambda facts: facts.with_model(_fact("measured"))))
    assert stat.S_ISREG(fifo.lstat().st_mode) and read_facts(fifo) == Facts(models=(_fact("measured"),))


# --- the lock ---


def test_a_held_lock_times_out_naming_the_file_and_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    lock = facts_lock(path)
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process's hold: a descriptor of its own
    try:
        with pytest.raises(ConfigError) as refused:
            finishes(lambda: update_facts(path, lambda facts: facts.with_model(_fact("m")), wait_s=0))
        message = str(refused.value)
        assert message.startswith(f"{lock}: still locked after 0 s"), message
        assert f"process {os.getpid()} of uid {os.geteuid()} holds it" in message and f"kill {os.getpid()}" in message
        assert not path.exists()  # nothing written
    finally:
        os.close(held)
    update_facts(path, lambda facts: facts.with_model(_fact("m")), wait_s=0)  # released: it goes through
    assert read_facts(path) == Facts(models=(_fact("m"),))


def test_a_lock_that_is_not_the_users_own_is_refused_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    lock = tmp_path / "facts.json.lock"
    lock.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"), exclusive_lock(lock, wait_s=0):
        pass
    assert not target.exists()  # not created through the link
    lock.unlink()
    os.mkfifo(lock, 0o600)
    with pytest.raises(UnsafePathError, match="is a FIFO"):
        finishes(lambda: update_facts(tmp_path / "facts.json", lambda facts: facts, wait_s=0))
    lock.unlink()
    lock.write_bytes(b"")
    lock.chmod(0o666)
    with pytest.raises(UnsafePathError, match="lets other users change it"), exclusive_lock(lock, wait_s=0):
        pass
    lock.unlink()
    with exclusive_lock(lock, wait_s=0):  # made by the lock itself: this user's, owner-only
        assert lock.stat().st_uid == os.geteuid() and stat.S_IMODE(lock.stat().st_mode) & 0o077 == 0
