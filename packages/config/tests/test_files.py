"""Safe file primitives: atomic_write, publish_once, make_private_dir, read_regular, hashing."""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ddslurm.config import (
    FileEntry,
    UnsafePathError,
    atomic_write,
    check_run_tree,
    make_private_dir,
    open_append,
    publish_once,
    read_regular,
    sha256_bytes,
    sha256_file,
)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# --- atomic_write ---


def test_atomic_write_creates_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write(path, b"one")
    assert path.read_bytes() == b"one"
    assert mode_of(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_atomic_write_replaces_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"old content that is longer")
    atomic_write(path, b"new")
    atomic_write(path, b"newer")
    assert path.read_bytes() == b"newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_atomic_write_honours_mode(tmp_path: Path) -> None:
    path = tmp_path / "script.sbatch"
    atomic_write(path, b"#!/bin/bash\n", mode=0o700)
    assert mode_of(path) == 0o700


@pytest.mark.parametrize("dangling", [pytest.param(False, id="to-a-file"), pytest.param(True, id="dangling")])
def test_atomic_write_refuses_a_symlink(tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / "target"
    if not dangling:
        target.write_bytes(b"precious")
    link = tmp_path / "link"
    link.symlink_to(target)

    with pytest.raises(UnsafePathError, match="symbolic link"):
        atomic_write(link, b"evil")

    assert link.is_symlink()
    if dangling:
        assert not target.exists()
    else:
        assert target.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["link"] if dangling else ["link", "target"])


def test_atomic_write_into_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "nope" / "f", b"x")
    assert list(tmp_path.iterdir()) == []


# --- publish_once ---


def test_publish_once_creates_once_and_keeps_the_first_content(tmp_path: Path) -> None:
    path = tmp_path / "winner.json"

    assert publish_once(path, b"first") is True
    assert publish_once(path, b"second") is False

    assert path.read_bytes() == b"first"
    assert mode_of(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["winner.json"]


def test_publish_once_does_not_replace_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "winner.json"
    path.write_bytes(b"someone else")
    assert publish_once(path, b"mine") is False
    assert path.read_bytes() == b"someone else"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["winner.json"]


def test_open_append_creates_owner_only_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "busy.jsonl"
    for line in (b"one\n", b"two\n"):
        with open_append(path) as stream:
            stream.write(line)
    assert path.read_bytes() == b"one\ntwo\n" and mode_of(path) == 0o600


@pytest.mark.parametrize("dangling", [pytest.param(False, id="to-a-file"), pytest.param(True, id="dangling")])
def test_open_append_refuses_a_symlink(tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / "target"
    if not dangling:
        target.write_bytes(b"precious")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_append(link)
    assert link.is_symlink() and (target.read_bytes() == b"precious" if not dangling else not target.exists())


@pytest.mark.parametrize("dangling", [pytest.param(False, id="to-a-file"), pytest.param(True, id="dangling")])
def test_publish_once_never_replaces_or_follows_a_symlink(tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / "target"
    if not dangling:
        target.write_bytes(b"precious")
    link = tmp_path / "winner.json"
    link.symlink_to(target)

    assert publish_once(link, b"evil") is False

    assert link.is_symlink()
    assert link.readlink() == target
    if dangling:
        assert not target.exists()
    else:
        assert target.read_bytes() == b"precious"


def test_publish_once_racing_threads_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "winner.json"
    n = 16
    barrier = threading.Barrier(n)
    results: list[bool] = [False] * n

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = publish_once(path, f"writer-{i}".encode())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert results.count(True) == 1
    winner = results.index(True)
    assert path.read_bytes() == f"writer-{winner}".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["winner.json"]


def _publish_in_child(path: str, index: int, barrier: Any) -> None:
    barrier.wait()
    won = publish_once(Path(path), f"process-{index}".encode())
    sys.exit(0 if won else 3)


@pytest.mark.skipif(sys.platform != "linux", reason="uses the fork start method")
def test_publish_once_racing_processes_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "winner.json"
    n = 8
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_publish_in_child, args=(str(path), i, barrier)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)

    codes = [p.exitcode for p in procs]
    assert sorted(codes) == [0] + [3] * (n - 1), codes
    assert path.read_bytes() == f"process-{codes.index(0)}".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["winner.json"]


# --- make_private_dir ---


def test_make_private_dir_is_owner_only_and_creates_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "run"
    make_private_dir(path)
    assert path.is_dir()
    assert mode_of(path) == 0o700


def test_make_private_dir_refuses_an_existing_directory(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.mkdir()
    with pytest.raises(UnsafePathError, match="already exists"):
        make_private_dir(path)


def test_make_private_dir_exist_ok_accepts_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "run"
    make_private_dir(path)
    make_private_dir(path, exist_ok=True)
    assert path.is_dir()


@pytest.mark.parametrize("exist_ok", [False, True])
def test_make_private_dir_refuses_a_file_in_its_place(tmp_path: Path, exist_ok: bool) -> None:
    path = tmp_path / "run"
    path.write_bytes(b"x")
    with pytest.raises(UnsafePathError):
        make_private_dir(path, exist_ok=exist_ok)
    assert path.read_bytes() == b"x"


@pytest.mark.parametrize("exist_ok", [False, True])
def test_make_private_dir_refuses_a_symlink(tmp_path: Path, exist_ok: bool) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    link = tmp_path / "run"
    link.symlink_to(target)

    with pytest.raises(UnsafePathError, match="symbolic link"):
        make_private_dir(link, exist_ok=exist_ok)

    assert link.is_symlink()
    assert mode_of(target) == 0o755
    assert list(target.iterdir()) == []


# --- read_regular and hashing ---


def test_read_regular_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"\x00data\xff")
    assert read_regular(path) == b"\x00data\xff"


def test_read_regular_refuses_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"do not read")
    link = tmp_path / "f"
    link.symlink_to(target)
    with pytest.raises(OSError) as info:
        read_regular(link)
    assert info.value.errno == errno.ELOOP


def test_read_regular_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "absent")


@pytest.mark.parametrize(
    "data",
    [pytest.param(b"", id="empty"), pytest.param(b"abc", id="small"), pytest.param(b"x" * (3 << 20), id="3MiB")],
)
def test_sha256_file_and_bytes_agree_with_hashlib(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "f"
    path.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_file(path) == want
    assert sha256_bytes(data) == want


@pytest.mark.parametrize("umask", [0o000, 0o002, 0o022, 0o077])
def test_private_dirs_and_their_missing_parents_are_owner_only_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    """A workspace and its ``runs/`` made under umask 000 were 0777: another user renamed a queued run aside."""
    old = os.umask(umask)
    try:
        make_private_dir(tmp_path / "workspace" / "runs" / "run-1")
    finally:
        os.umask(old)
    for path in (tmp_path / "workspace", tmp_path / "workspace" / "runs", tmp_path / "workspace" / "runs" / "run-1"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    check_run_tree(tmp_path / "workspace" / "runs" / "run-1")


def test_a_run_tree_others_can_change_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "ws" / "runs" / "r"
    make_private_dir(run)
    check_run_tree(run)
    for path, mode, why in (
        (run, 0o750, "lets other users in"),
        (run.parent, 0o777, "rename or replace"),
        (run.parent.parent, 0o775, "rename or replace"),
    ):
        path.chmod(mode)
        with pytest.raises(UnsafePathError, match=why):
            check_run_tree(run)
        path.chmod(0o700)
    for path in (run.parent, run.parent.parent):  # sticky or not: others could still plant files of their own
        path.chmod(0o1777)
        with pytest.raises(UnsafePathError, match=r"mode 1777 lets other users write in it \(the sticky bit"):
            check_run_tree(run)
        path.chmod(0o700)
    with pytest.raises(UnsafePathError, match="belongs to uid"):
        check_run_tree(run, uid=os.getuid() + 4242)
    run.rename(tmp_path / "aside")
    run.symlink_to(tmp_path / "aside")
    with pytest.raises(UnsafePathError, match="not a directory"):
        check_run_tree(run)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another uid needs root")
def test_a_run_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "ws" / "runs" / "r"
    make_private_dir(run)
    os.chown(run, 4242, 4242)
    with pytest.raises(UnsafePathError, match="belongs to uid 4242"):
        check_run_tree(run)
    os.chown(run, 0, 0)
    os.chown(run.parent, 4242, 4242)
    with pytest.raises(UnsafePathError, match="belongs to uid 4242, who could replace"):
        check_run_tree(run)


def test_a_file_entry_holds_only_the_bytes_it_recorded() -> None:
    data = b"question\nwhat is 2 + 2?\n"
    entry = FileEntry(path="seed.csv", size=len(data), sha256=sha256_bytes(data))
    assert entry.holds(data)
    assert not entry.holds(data.replace(b"2 + 2", b"2 + 3"))  # same size, other bytes
    assert not FileEntry(path="seed.csv", size=len(data) + 1, sha256=entry.sha256).holds(data)
