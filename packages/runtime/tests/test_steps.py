"""srun steps: TERM reaches exactly the step a Step object started, also when its name starts again."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ddslurm.runtime._steps import SrunLauncher, StepSpec


class FakeSlurm:
    """squeue lists the steps that Slurm still knows (``listing``); scancel is recorded (and ends the stand-ins, as
    TERM ends a step's task); each step's process is a stand-in that sleeps, started for the srun command line."""

    def __init__(self) -> None:
        self.listing = ""
        self.scancels: list[list[str]] = []
        self.srun_argvs: list[list[str]] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def run(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        if argv[0] == "scancel":
            self.scancels.append(argv)
            for proc in self.procs:
                proc.kill()
            return subprocess.CompletedProcess(argv, 0, "", "")
        assert argv[0] == "squeue"
        return subprocess.CompletedProcess(argv, 0, self.listing, "")

    def popen(self, argv: Sequence[str], spec: StepSpec) -> subprocess.Popen[bytes]:
        self.srun_argvs.append(list(argv))
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        self.procs.append(proc)
        return proc


def test_stopping_a_rerun_signals_the_rerun_not_the_earlier_step_of_the_same_name(tmp_path: Path) -> None:
    """After an in-allocation rerun squeue can still list the first run's step (completing) under the same name,
    and first: TERM went to that one, the rerun was never told to stop and was killed at the grace period."""
    slurm = FakeSlurm()
    launcher = SrunLauncher("281", array_job_id="280", array_task_id="0", run=slurm.run, popen=slurm.popen)
    spec = StepSpec(name="client-3", argv=("client",), env={}, log=tmp_path / "client.out")
    first = launcher.start(spec)
    first.proc.kill()
    first.proc.wait()
    rerun = launcher.start(spec)
    # Both steps listed, the earlier one first (as squeue orders by step id); and a sibling task's namesake.
    slurm.listing = "280_1.4|client-3.2\n280_0.4|client-3\n280_0.7|client-3.2\n280_0.batch|batch\n"
    assert rerun.stop(30.0) < 0  # ended by the TERM, not after the grace period
    assert slurm.scancels == [["scancel", "--signal=TERM", "280_0.7"]]
    names = [next(a for a in argv if a.startswith("--job-name=")) for argv in slurm.srun_argvs]
    assert names == ["--job-name=client-3", "--job-name=client-3.2"]
    assert (first.name, rerun.name) == ("client-3", "client-3")  # the controller's own name is kept


def test_each_start_of_a_name_gets_its_own_slurm_name_and_the_first_keeps_the_plain_one(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    launcher = SrunLauncher("290", run=slurm.run, popen=slurm.popen)
    steps = []
    for name in ("server-gen-0", "proxy-gen", "proxy-gen", "client", "proxy-gen"):
        steps.append(launcher.start(StepSpec(name=name, argv=("x",), env={}, log=tmp_path / f"{name}.out")))
    assert [s.job_name for s in steps] == ["server-gen-0", "proxy-gen", "proxy-gen.2", "client", "proxy-gen.3"]
    slurm.listing = "290.1|proxy-gen\n290.2|proxy-gen.2\n290.4|proxy-gen.3\n"
    for step in (*steps[:2], *steps[3:]):
        step.proc.kill()
        step.proc.wait()
    steps[2].stop(30.0)
    assert slurm.scancels == [["scancel", "--signal=TERM", "290.2"]]
