"""A full disk (or quota) ends ``submit`` and ``collect --local`` in a clear error, JSON under ``--json``, with
nothing half-written: no run directory (nor a hidden one) after a submit that wrote part of it, no dataset (nor a
staging directory) after a collection that wrote part of it, an existing dataset untouched.

The real thing where this process may mount a small tmpfs (root), else skipped; the same failures injected at
every write of ``submit`` run everywhere."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ddslurm.collector.testing import make_published_run
from ddslurm.launcher import Slurm
from ddslurm.launcher.cli import main
from ddslurm.launcher.submission import _arrays as arrays_module
from ddslurm.launcher.submission import _run_dir as run_dir_module
from ddslurm.launcher.submission import _submit as submit_module
from ddslurm.launcher.testing import FakeSlurm, accept_every_recipe, write_unit_run

KEY = "sk-disk-full-test-value-123456"


class Disk:
    """A tmpfs of 1 MiB and 200 inodes at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / ".filler"

    def clear(self) -> None:
        for entry in self.root.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                subprocess.run(["rm", "-rf", str(entry)], check=True)
            else:
                entry.unlink()

    def leave(self, *, pages: int | None = None, inodes: int | None = None) -> None:
        """Fill the file system's space but ``pages`` pages of 4 KiB, or its inodes but ``inodes``."""
        self.filler.mkdir(exist_ok=True)
        if inodes is not None:
            made = 0
            with contextlib.suppress(OSError):
                while True:
                    (self.filler / f"{made}").touch()
                    made += 1
            for n in range(min(inodes, made)):
                (self.filler / f"{n}").unlink()
        if pages is not None:
            with contextlib.suppress(OSError), (self.filler / "space").open("wb", buffering=0) as fh:
                while True:
                    fh.write(b"\0" * 4096)
            size = (self.filler / "space").stat().st_size
            os.truncate(self.filler / "space", max(0, size - pages * 4096))


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    root = tmp_path / "disk"
    root.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=200,mode=0700", "tmpfs", str(root)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True, check=False).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield Disk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def _cli(argv: list[str], env: dict[str, str], runner: FakeSlurm) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--json"], env=env, slurm=Slurm(runner, env=env), stdout=out, stderr=err, sleep=lambda _: None)
    return code, json.loads(out.getvalue()), err.getvalue()


@pytest.fixture
def _no_recipe_check(monkeypatch: pytest.MonkeyPatch) -> None:
    accept_every_recipe(monkeypatch)


def _unit_run(root: Path, workspace: Path) -> tuple[Path, Path, dict[str, str]]:
    root.mkdir()
    run, profile, env = write_unit_run(root, KEY, num_records=30, shards=3)
    profile.write_text(profile.read_text().replace("workspace: work", f"workspace: {workspace}"))
    return run, profile, env


def _left(workspace: Path) -> list[str]:
    """What a submission left in the workspace's runs/ (hidden entries included)."""
    runs = workspace / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def _submit_until_it_fits(
    run: Path, profile: Path, env: dict[str, str], workspace: Path, make_room: Callable[[int], None]
) -> list[str]:
    """``submit`` with ever more room (``make_room(n)``, n = 0, 1, ...) until it succeeds; every submission that
    failed before its first sbatch must be a clean write_failed. The messages of those."""
    refused: list[str] = []
    for room in range(200):
        make_room(room)
        runner = FakeSlurm()
        code, document, err = _cli(["submit", str(run), "--profile", str(profile)], env, runner)
        if code == 0:
            return refused
        error = document["error"]
        if runner.commands("sbatch"):  # the array reached Slurm, its record could not be written: the run stays
            assert error["code"] == "submission_incomplete", error
            continue
        assert (code, error["code"], error["exit_code"]) == (2, "write_failed", 2), error
        assert err.startswith("error: ") and "Traceback" not in err
        assert _left(workspace) == [], (room, error["message"])
        refused.append(error["message"])
    raise AssertionError("submit never fitted")


@pytest.mark.usefixtures("_no_recipe_check")
@pytest.mark.parametrize("exhausted", ["space", "inodes"])
def test_submit_on_a_full_disk_leaves_no_run_directory(tmp_path: Path, disk: Disk, exhausted: str) -> None:
    workspace = disk.root / "work"
    run, profile, env = _unit_run(tmp_path / "inputs", workspace)

    def make_room(room: int) -> None:
        disk.clear()
        if exhausted == "space":
            disk.leave(pages=room)
        else:
            disk.leave(inodes=room)

    refused = _submit_until_it_fits(run, profile, env, workspace, make_room)
    assert len(refused) >= 3, refused  # it failed at several points of writing the run directory
    assert all("No space left on device" in m and "the file system or your quota is full" in m for m in refused)
    assert all("nothing was submitted" in m for m in refused)


@pytest.mark.usefixtures("_no_recipe_check")
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_submit_that_fails_at_any_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Every write ``submit`` makes (each file of the run directory, the submission plan, the batch scripts), made
    to fail in turn: the file half-written, then the error."""
    workspace = tmp_path / "work"
    run, profile, env = _unit_run(tmp_path / "inputs", workspace)
    calls = {"n": 0, "fail_at": 0}

    def failing(real: Callable[..., Any]) -> Callable[..., Any]:
        def write(path: Path, data: bytes, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == calls["fail_at"]:
                real(path, data[: len(data) // 2], **kwargs)
                raise OSError(code, os.strerror(code))
            return real(path, data, **kwargs)

        return write

    for module, name in (
        (run_dir_module, "atomic_write"),
        (arrays_module, "atomic_write"),
        (arrays_module, "publish_once"),
        (submit_module, "publish_once"),
    ):
        monkeypatch.setattr(module, name, failing(getattr(module, name)))

    def make_room(room: int) -> None:
        calls["n"], calls["fail_at"] = 0, room + 1

    refused = _submit_until_it_fits(run, profile, env, workspace, make_room)
    assert len(refused) >= 6, refused  # run.yaml, recipe, snapshot, plan, submission plan, batch scripts
    assert all(os.strerror(code) in m and "nothing was submitted" in m for m in refused)
    assert all(("quota is full" in m) == (code != errno.EIO) for m in refused)


def _published(root: Path) -> Path:
    """A run of 3 shards, 3 batches each of ~40 KB of random bytes (Parquet cannot compress them)."""
    batches = [[pa.table({"blob": [os.urandom(40_000)]}) for _ in range(3)] for _ in range(3)]
    layout = make_published_run(root, batches)
    layout.root.chmod(0o700)  # a run directory only its owner can change (the commands check it)
    return layout.root


def test_collect_local_on_a_full_disk_publishes_nothing_and_says_why(tmp_path: Path, disk: Disk) -> None:
    run_dir = _published(disk.root)
    env = {"PATH": "/usr/bin:/bin"}
    code, document, _ = _cli(["collect", str(run_dir), "--local"], env, FakeSlurm())
    assert code == 0 and document["rows"] == 9
    part = -(-(run_dir / "dataset" / "part-00000.parquet").stat().st_size // 4096)  # pages the dataset's file takes
    subprocess.run(["rm", "-rf", str(run_dir / "dataset")], check=True)
    messages = []
    for pages in (0, 10, part // 2, part):  # full at the start of the file, half-way, at the manifest after it
        disk.leave(pages=pages)
        code, document, err = _cli(["collect", str(run_dir), "--local"], env, FakeSlurm())
        assert (code, document["error"]["code"]) == (1, "collect_failed"), (pages, document)
        assert "Traceback" not in err
        assert not (run_dir / "dataset").exists()
        assert not list(run_dir.glob(".dataset.*")), list(run_dir.iterdir())
        messages.append(document["error"]["message"])
        subprocess.run(["rm", "-rf", str(disk.filler)], check=True)
    assert all("No space left on device" in m and "nothing was published" in m for m in messages), messages
    assert "part-00000.parquet" in messages[0] and "the dataset of run run-1" in messages[-1], messages  # the manifest
    code, document, _ = _cli(["collect", str(run_dir), "--local"], env, FakeSlurm())
    assert code == 0 and document["rows"] == 9


def test_collect_local_overwrite_on_a_full_disk_keeps_the_dataset_there_was(tmp_path: Path, disk: Disk) -> None:
    run_dir = _published(disk.root)
    env = {"PATH": "/usr/bin:/bin"}
    code, document, _ = _cli(["collect", str(run_dir), "--local"], env, FakeSlurm())
    assert code == 0, document
    before = {p.name: p.read_bytes() for p in (run_dir / "dataset").iterdir()}
    disk.leave(pages=20)
    code, document, err = _cli(["collect", str(run_dir), "--local", "--overwrite"], env, FakeSlurm())
    assert (code, document["error"]["code"]) == (1, "collect_failed"), document
    assert "No space left on device" in document["error"]["message"] and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (run_dir / "dataset").iterdir()} == before
    assert not list(run_dir.glob(".dataset.*"))
