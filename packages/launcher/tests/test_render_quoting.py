"""The batch script cannot be made to run anything but the runtime: the renderer refuses what a #SBATCH line cannot
hold and quotes every value of its shell lines; submit refuses a profile sbatch cannot take before writing."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import Resources, RunLayout, digest
from ddslurm.config.testing import make_plan
from ddslurm.launcher import Slurm, SubmitError, render_collection, render_generation, submit
from ddslurm.launcher.testing import FakeSlurm, InProcessHost, write_unit_run

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

INJECTED = [
    pytest.param("gpu\ntouch /tmp/pwned", id="newline"),
    pytest.param("gpu\r", id="carriage-return"),
    pytest.param("gpu --hold", id="space"),
    pytest.param("gpu\t--hold", id="tab"),
    pytest.param("gpu\x00", id="nul"),
    pytest.param("gpu\x1b[2J", id="escape"),
    pytest.param("gpu#x", id="comment"),
    pytest.param("'gpu'", id="quotes"),
]


@pytest.mark.parametrize("value", INJECTED)
@pytest.mark.parametrize("field", ["partition", "account", "qos", "memory", "constraint", "reservation"])
def test_a_directive_that_is_not_one_sbatch_value_is_refused(tmp_path: Path, field: str, value: str) -> None:
    resources = Resources(time_minutes=10, **{field: value})
    plan = make_plan(generation=resources, collection=resources)
    layout = RunLayout(tmp_path / "runs" / "run-1")
    with pytest.raises(SubmitError, match="#SBATCH"):
        render_generation(plan, layout, [0])
    with pytest.raises(SubmitError, match="#SBATCH"):
        render_collection(plan, layout, overwrite=False)


@pytest.mark.parametrize("value", INJECTED)
def test_an_extra_sbatch_line_that_is_not_one_option_is_refused(tmp_path: Path, value: str) -> None:
    resources = Resources(time_minutes=10, extra_sbatch=("--exclusive", f"--comment={value}"))
    plan = make_plan(generation=resources)
    with pytest.raises(SubmitError, match="#SBATCH"):
        render_generation(plan, RunLayout(tmp_path / "runs" / "run-1"), [0])


@pytest.mark.parametrize("name", ["inj\n", "a b", "a#b"])
def test_a_run_name_that_is_not_one_job_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(SubmitError, match="#SBATCH"):
        render_generation(make_plan(run_name=name), RunLayout(tmp_path / "runs" / "run-1"), [0])


@pytest.mark.parametrize("root", ["my ws", "ws%j", "ws\nid", "ws'x", "ws#1"])
def test_a_run_directory_sbatch_cannot_take_is_refused(tmp_path: Path, root: str) -> None:
    layout = RunLayout(tmp_path / root / "runs" / "run-1")
    with pytest.raises(SubmitError, match="#SBATCH"):
        render_generation(make_plan(), layout, [0])
    with pytest.raises(SubmitError, match="#SBATCH"):
        render_collection(make_plan(), layout, overwrite=False)


def _stub_tool(env_dir: Path, name: str) -> None:
    tool = env_dir / "bin" / name
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGV_OUT"\n', encoding="utf-8")
    tool.chmod(0o755)


def _run_script(script: str, cwd: Path, **env: str) -> list[str]:
    """Run the batch script the way the node does (bash), with the shell lines only; its #SBATCH lines are
    comments there. Returns the argv the stub tool received."""
    out = cwd / "argv.txt"
    path = cwd / "job.sh"
    path.write_text(script, encoding="utf-8")
    done = subprocess.run(
        ["bash", str(path)],
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ARGV_OUT": str(out), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return out.read_text(encoding="utf-8").splitlines()


HOSTILE_ENV = "env $(touch pwned-dollar) `touch pwned-backquote`; touch pwned-semicolon 'q' \"dq\""


@pytest.mark.parametrize(
    ("shards", "tasks", "stage", "want"),
    [
        pytest.param([0], None, None, ["--shard", "0"], id="one-task"),
        pytest.param([2, 5], None, None, ["--shard", "2"], id="shard-table"),
        pytest.param([3, 4, 5, 7], 2, 1, ["--pool", "3-5,7", "--stage", "1"], id="pool-cpu-stage"),
    ],
)
def test_shell_lines_quote_every_value(
    tmp_path: Path, shards: list[int], tasks: int | None, stage: int | None, want: list[str]
) -> None:
    env_dir = tmp_path / HOSTILE_ENV
    _stub_tool(env_dir, "ddslurm-runtime")
    layout = RunLayout(tmp_path / "ws" / "runs" / "run-1")
    layout.root.mkdir(parents=True)
    plan = make_plan(python_env=str(env_dir), shard_rows=(1,) * 8)
    script = render_generation(plan, layout, shards, tasks=tasks, stage=stage)
    argv = _run_script(script, tmp_path, SLURM_ARRAY_TASK_ID="0")
    assert argv == ["generate", "--run-dir", str(layout.root), "--plan-sha256", digest(plan), *want]
    assert not list(tmp_path.glob("pwned*"))


def test_the_collection_script_quotes_every_value(tmp_path: Path) -> None:
    env_dir = tmp_path / HOSTILE_ENV
    _stub_tool(env_dir, "ddslurm-collect")
    layout = RunLayout(tmp_path / "ws" / "runs" / "run-1")
    layout.root.mkdir(parents=True)
    script = render_collection(make_plan(python_env=str(env_dir)), layout, overwrite=True)
    assert _run_script(script, tmp_path) == [str(layout.root), "--json", "--overwrite"]
    assert not list(tmp_path.glob("pwned*"))


def test_ordinary_values_render_as_they_are(tmp_path: Path) -> None:
    resources = Resources(
        time_minutes=10,
        partition="gpu,gpu2",
        constraint="[rack1|rack2]&intel*2",
        memory="16G",
        extra_sbatch=("--exclusive", "--begin=now+1hour", "--nodelist=node[1-3]"),
    )
    script = render_generation(make_plan(generation=resources), RunLayout(tmp_path / "runs" / "run-1"), [0])
    for line in (
        "#SBATCH --partition=gpu,gpu2",
        "#SBATCH --constraint=[rack1|rack2]&intel*2",
        "#SBATCH --mem=16G",
        "#SBATCH --exclusive",
        "#SBATCH --begin=now+1hour",
        "#SBATCH --nodelist=node[1-3]",
        f"#SBATCH --output={tmp_path}/runs/run-1/logs/slurm-%A_%a.out",
    ):
        assert line in script.splitlines()


# --- submit: a profile sbatch cannot take is refused before anything is written ----------------------------------


@pytest.mark.parametrize("workspace", ["my work", "work%j", "work'x"])
def test_submit_refuses_a_workspace_sbatch_cannot_take_and_creates_nothing(tmp_path: Path, workspace: str) -> None:
    run, profile, env = write_unit_run(tmp_path, "sk-render-quoting-test-1234")
    text = profile.read_text(encoding="utf-8").replace(
        "workspace: work", f"workspace: {msgspec.json.encode(workspace).decode()}"
    )
    profile.write_text(text, encoding="utf-8")
    slurm = FakeSlurm()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SubmitError) as info:
        submit(run, profile, slurm=Slurm(slurm), host=HOST, env=env, clock=lambda: datetime(2026, 1, 2, tzinfo=UTC))
    assert str(info.value).startswith(f"{profile}:1:1: workspace: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert slurm.commands("sbatch") == []


def test_submit_refuses_a_partition_with_a_newline_and_creates_nothing(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(
        tmp_path, "sk-render-quoting-test-1234", run_extra='submission:\n  partition: "cpu\\nid"\n'
    )
    slurm = FakeSlurm()
    with pytest.raises(SubmitError) as info:
        submit(run, profile, slurm=Slurm(slurm), host=HOST, env=env)
    assert str(info.value).startswith(f"{run}:6:3: submission.partition: ")
    assert not (tmp_path / "work").exists()
    assert slurm.commands("sbatch") == []
