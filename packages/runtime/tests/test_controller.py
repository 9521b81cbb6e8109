"""The controller's decisions with stand-in steps: reruns of the generation step inside the allocation."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ddslurm.config import AttemptRecord, ProviderSnapshot, RunLayout, atomic_write, encode, read_json
from ddslurm.config.testing import make_plan
from ddslurm.runtime import AttemptRunner, Inputs
from ddslurm.runtime._controller import Controller, StopSignal
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._steps import Step, StepSpec

CLIENT = """
import sys, msgspec
from pathlib import Path
from ddslurm.config import AttemptRecord, atomic_write, encode, read_json
record_path = Path(sys.argv[1]); outcome = sys.argv[2]
record = read_json(record_path, AttemptRecord)
if outcome == "crash":
    sys.exit(3)
state = {"fail": "failed", "ok": "succeeded"}[outcome]
atomic_write(record_path, encode(msgspec.structs.replace(
    record, state=state, reason=None if state == "succeeded" else "generation_failed",
    retryable=state == "failed", client_runs=record.client_runs + 1)))
"""


class ScriptedLauncher:
    """Runs each client step as a tiny script whose outcome is scripted per run (first run, second run, ...)."""

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.client_argv: list[tuple[str, ...]] = []

    def start(self, spec: StepSpec) -> Step:
        assert spec.name == "client"
        self.client_argv.append(spec.argv)
        run_dir = Path(spec.argv[spec.argv.index("--run-dir") + 1])
        shard = int(spec.argv[spec.argv.index("--shard") + 1])
        attempt = spec.argv[spec.argv.index("--attempt") + 1]
        record = RunLayout(run_dir).shard(shard).attempt(attempt).record
        outcome = self.outcomes[len(self.client_argv) - 1]
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(record), outcome], start_new_session=True)
        return Step(spec, proc)


def _controller(tmp_path: Path, launcher: ScriptedLauncher, client_retries: int) -> tuple[Controller, Inputs]:
    layout = RunLayout(tmp_path / "run-1")
    layout.root.mkdir()
    plan = make_plan("run-1", (4,), client_retries=client_retries)
    atomic_write(layout.plan, encode(plan))
    inputs = Inputs(plan=plan, plan_sha256="-", recipe={}, snapshot=ProviderSnapshot())
    runner = AttemptRunner(
        layout,
        engine=lambda r: pytest.fail("no engine here"),
        env={},
        scratch_home=tmp_path,
        make_logger=lambda s: new_logger(s, io.BytesIO()),
    )
    controller = Controller(
        runner,
        launcher=launcher,
        env={},
        runtime_exe=Path("/x/ddslurm-runtime"),
        run_dir=layout.root,
        logger=new_logger(io.BytesIO()),
        http=httpx.Client(),
        stop=StopSignal(),
        poll=0.05,
    )
    return controller, inputs


@pytest.mark.parametrize(
    ("outcomes", "retries", "code", "state", "runs"),
    [
        pytest.param(["fail", "ok"], 1, 0, "succeeded", 2, id="retryable-failure-then-success"),
        pytest.param(["crash", "ok"], 1, 0, "succeeded", 2, id="client-died-then-success"),
        pytest.param(["fail", "fail"], 1, 1, "failed", 2, id="retries-used-up"),
        pytest.param(["fail"], 0, 1, "failed", 1, id="no-retries"),
        pytest.param(["ok"], 1, 0, "succeeded", 1, id="first-run-succeeds"),
    ],
)
def test_generation_step_is_rerun_inside_the_allocation(
    tmp_path: Path, outcomes: list[str], retries: int, code: int, state: str, runs: int
) -> None:
    launcher = ScriptedLauncher(outcomes)
    controller, inputs = _controller(tmp_path, launcher, retries)
    assert controller.run(inputs, 0, "9", "n1") == code
    record = read_json(RunLayout(tmp_path / "run-1").shard(0).attempt("attempt-9").record, AttemptRecord)
    assert record.state == state
    assert len(launcher.client_argv) == runs
    assert "--resume" not in launcher.client_argv[0]
    assert all("--resume" in argv for argv in launcher.client_argv[1:])
