"""Issue 18: scheduler commands (so the jobs) run under umask 077, and every command refuses a run directory that
another user could have changed (its mode lets others in, or ``runs/`` / the workspace lets them rename it aside
and put another in its place) before it reads the plan."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ddslurm.config import UnsafePathError
from ddslurm.launcher import find_run, prepare, write_run_dir
from ddslurm.launcher.cli import main
from ddslurm.launcher.cluster._slurm import SubprocessRunner
from ddslurm.launcher.testing import accept_recipe, write_unit_run

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies


def _run_dir(tmp_path: Path) -> Path:
    run, profile, env = write_unit_run(tmp_path, "sk-run-tree-test-0123456789")
    prepared = prepare(run, profile, env, datetime.now(UTC), check_recipe=accept_recipe)
    write_run_dir(prepared)
    return prepared.layout.root


def test_a_run_directory_others_can_change_is_refused_by_every_lookup(tmp_path: Path) -> None:
    root = _run_dir(tmp_path)
    assert find_run(str(root), None).root == root  # as submit made it: 0700, in a private runs/ and workspace
    for path, mode in ((root, 0o755), (root.parent, 0o777), (root.parent.parent, 0o770)):
        path.chmod(mode)
        with pytest.raises(UnsafePathError):
            find_run(str(root), None)
        with pytest.raises(UnsafePathError):
            find_run(root.name, root.parent.parent)
        path.chmod(0o700)
    for path in (root.parent, root.parent.parent):  # the sticky bit does not stop others planting files there
        path.chmod(0o1777)
        with pytest.raises(UnsafePathError, match="lets other users write in it"):
            find_run(root.name, root.parent.parent)
        path.chmod(0o700)
    assert find_run(root.name, root.parent.parent).root == root


@pytest.mark.parametrize("command", [["status"], ["wait", "--timeout", "1"], ["retry"], ["cancel"], ["logs"]])
def test_commands_refuse_it_with_a_json_error_before_touching_the_scheduler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    root = _run_dir(tmp_path)
    root.chmod(0o750)
    code = main([command[0], str(root), *command[1:], "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code != 0 and "lets other users in" in out["error"]["message"] and str(root) in out["error"]["message"]
    assert not any((root / "submissions").iterdir())  # nothing submitted, nothing recorded


def test_scheduler_commands_run_owner_only_so_the_jobs_and_the_logs_slurm_writes_are(tmp_path: Path) -> None:
    """sbatch hands its umask to the job (SLURM_UMASK): at a submitting umask of 000 the jobs' Slurm logs were
    0666. Every scheduler command now runs under umask 077 whatever the caller's."""
    old = os.umask(0)
    try:
        done = SubprocessRunner(timeout_s=10)(["sh", "-c", f"umask; touch {tmp_path / 'log'}"])
    finally:
        os.umask(old)
    assert done.stdout.strip() == "0077"
    assert stat.S_IMODE((tmp_path / "log").stat().st_mode) == 0o600
