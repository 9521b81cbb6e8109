"""``ddslurm-runtime``'s errors become its exit code in one place (``ddslurm.runtime.cli.failed``): a step whose
inputs cannot be used ends with one line, ``ddslurm-runtime: REASON: MESSAGE``, and exit 1, before it has an
attempt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddslurm.config import ConfigFileError, read_plan
from ddslurm.runtime.cli import failed
from ddslurm.runtime.errors import InputsError
from ddslurm.runtime.testing import write_run

RUNTIME = Path(sys.executable).parent / "ddslurm-runtime"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["generate", "--shard", "0", "--job-id", "7", "--launcher", "local"], id="generate"),
        pytest.param(["client", "--shard", "0", "--attempt", "attempt-7"], id="client"),
    ],
)
def test_a_step_whose_inputs_were_modified_ends_with_one_line_and_exit_1(tmp_path: Path, argv: list[str]) -> None:
    layout = write_run(tmp_path / "run-1")
    recipe = Path(read_plan(layout.plan).recipe_file)
    recipe.write_bytes(recipe.read_bytes() + b"\n# changed\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(scratch), "HOME": str(tmp_path)}

    done = subprocess.run(
        [str(RUNTIME), *argv, "--run-dir", str(layout.root)], capture_output=True, text=True, env=env, timeout=120
    )

    modified = f"{recipe}: sha256 differs from the plan; the run's inputs were modified"
    expected = f"ddslurm-runtime: inputs_invalid: {modified}"
    assert (done.returncode, done.stderr.splitlines()[-1:]) == (1, [expected]), done.stderr
    assert "Traceback" not in done.stderr
    assert not layout.shard(0).attempts.exists()  # no attempt began


def test_failed_names_a_runtime_failure_s_reason_and_any_other_ddslurm_error_as_it_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert failed(InputsError("plan.json: unreadable")) == 1
    assert failed(ConfigFileError("plan.json", "expected int, got str", line=3, col=1, field="shards")) == 1
    assert capsys.readouterr().err.splitlines() == [
        "ddslurm-runtime: inputs_invalid: plan.json: unreadable",
        "ddslurm-runtime: plan.json:3:1: shards: expected int, got str",
    ]
