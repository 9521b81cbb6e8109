"""Issue 18: where a secret travels beyond the job. A cluster whose slurmdbd keeps every batch job's environment
(``AccountingStoreFlags=job_env``) keeps the run's API keys with its job records: submit says so, by name."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ddslurm.launcher import Slurm, submit
from ddslurm.launcher.cli import main
from ddslurm.launcher.cluster._slurm import Completed
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, write_unit_run

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

KEY = "sk-exposure-test-value-0123456789"


class _Config(FakeSlurm):
    def __init__(self, store_flags: str) -> None:
        super().__init__()
        self.store_flags = store_flags

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        if list(argv[:3]) == ["scontrol", "show", "config"]:
            self.calls.append(list(argv))
            return Completed(
                0, f"ClusterName = c\nMaxArraySize = 1001\nAccountingStoreFlags = {self.store_flags}\n", ""
            )
        return super().__call__(argv, env=env)


@pytest.mark.parametrize(("flags", "warned"), [("job_comment,job_env", True), ("job_comment", False), ("", False)])
def test_submit_warns_by_name_when_the_cluster_stores_job_environments(
    tmp_path: Path, flags: str, warned: bool
) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY)
    done = submit(run, profile, slurm=Slurm(_Config(flags)), host=HOST, env=env)
    assert bool(done.warnings) == warned
    if warned:
        assert "HOSTED_KEY" in done.warnings[0] and "job_env" in done.warnings[0]
    assert not any(KEY in w for w in done.warnings)


def test_the_dry_run_shows_the_warning_in_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, profile, env = write_unit_run(tmp_path, KEY)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("ddslurm.launcher.cli.Slurm", lambda *a, **k: Slurm(_Config("job_env")))
    code = main(["submit", str(run), "--profile", str(profile), "--dry-run", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    (warning,) = json.loads(out)["warnings"]
    assert "HOSTED_KEY" in warning and KEY not in out
