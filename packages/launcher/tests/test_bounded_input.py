"""The command line against input meant to exhaust the machine: an alias bomb in a run file or profile is refused
by ``submit --dry-run`` at once, and ``--shards`` past the run's shards is a usage error naming what the run has,
before anything is expanded."""

from __future__ import annotations

import contextlib
import io
import json
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ddslurm.launcher import Slurm, prepare, submit_shards, write_run_dir
from ddslurm.launcher.cli import main
from ddslurm.launcher.testing import FakeSlurm, accept_recipe, write_unit_run

KEY = "sk-bounded-test-value-123456"
BOMB = 'lol0: &a0 "lol"\n' + "".join(f"lol{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))


def _cli(argv: list[str], env: dict[str, str], runner: FakeSlurm) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--json"], env=env, slurm=Slurm(runner, env=env), stdout=out, stderr=err, sleep=lambda _: None)
    return code, json.loads(out.getvalue()), err.getvalue()


@pytest.mark.parametrize("where", ["run file", "profile"])
def test_submit_dry_run_refuses_an_alias_bomb_at_once(tmp_path: Path, where: str) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY)
    target = run if where == "run file" else profile
    lines = len(target.read_text().splitlines())
    target.write_text(target.read_text() + BOMB)
    with _peak_memory() as peak:
        code, document, err = _cli(["submit", str(run), "--profile", str(profile), "--dry-run"], env, FakeSlurm())
    assert peak[0] < 64 * 2**20, peak  # refused before the aliases were expanded (memory, not a clock, says so)
    assert code == 2 and document["error"]["code"] == "submit_refused", document
    message = document["error"]["message"]
    assert message.startswith(f"{target}:{lines + 1}:7: anchor &a0: anchors and aliases"), message
    assert err.startswith("error: ")


@contextlib.contextmanager
def _peak_memory() -> Iterator[list[int]]:
    """The most memory Python held while the block ran (``[bytes]``, set when it ends)."""
    peak = [0]
    tracemalloc.start()
    try:
        yield peak
        peak[0] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _submitted(root: Path, shards: int = 3) -> tuple[str, dict[str, str]]:
    run, profile, env = write_unit_run(root, KEY, num_records=10 * shards, shards=shards)
    now = datetime.now(UTC)
    prepared = prepare(run, profile, env, now, check_recipe=accept_recipe)
    write_run_dir(prepared)
    submit_shards(prepared.layout, prepared.plan, list(range(shards)), Slurm(FakeSlurm()), env, now)
    return str(prepared.layout.root), env


@pytest.mark.parametrize("command", ["cancel", "retry", "accept-partial"])
@pytest.mark.parametrize(
    ("shards", "words"),
    [
        ("0-999999999", "--shards '0-999999999': no shard 999999999: the run has shards 0-2 (3 shards)"),
        ("1,3", "--shards '1,3': no shard 3: the run has shards 0-2 (3 shards)"),
        ("0-2,0-2", "--shards '0-2,0-2': lists more shards than the 3 there are (it repeats some)"),
    ],
)
def test_shards_past_the_run_are_refused_before_they_are_expanded(
    tmp_path: Path, command: str, shards: str, words: str
) -> None:
    root, env = _submitted(tmp_path)
    runner = FakeSlurm()
    with _peak_memory() as peak:
        code, document, _ = _cli([command, root, "--shards", shards], env, runner)
    assert peak[0] < 64 * 2**20, peak  # no billion shard numbers were made (memory, not a clock, says so)
    assert (code, document["error"]["code"]) == (2, "usage"), document
    assert document["error"]["message"] == words
    assert not runner.commands("scancel") and not runner.commands("sbatch")
