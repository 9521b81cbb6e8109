"""``ddslurm doctor`` and the profile's checks at ``submit --dry-run``, against canned ``sinfo``, ``scontrol`` and
``sacctmgr`` output: every problem is reported at once, each at the profile's (or run file's) line and column;
what cannot be asked is skipped with the reason; ``sbatch --test-only`` is the only sbatch a dry run runs."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from ddslurm.launcher import Slurm, SubmitError, doctor, dry_run
from ddslurm.launcher.cli import main
from ddslurm.launcher.cluster._slurm import Completed
from ddslurm.launcher.testing import (
    InProcessHost,
    accept_every_recipe,
    write_runtime_shim,
    write_unit_run,
)

pytestmark = pytest.mark.dd  # judged against the Data Designer installed here (make test-dd-range: each version)

HOST = InProcessHost()
"""Data Designer's answers in this process (the real host's process is the cluster tests')."""

SINFO = (
    "g1|gpu*|16|32000|gpu:4|up|infinite\ng2|gpu*|16|32000|gpu:4(S:0-1)|up|infinite\nc1|cpu|8|16000|(null)|up|infinite\n"
)
"""Two GPU nodes with 4 GPUs, 16 CPUs and 32000 MB each (default partition gpu), one CPU node of 8 CPUs."""


class Cluster:
    """A runner that answers as a cluster with :data:`SINFO`'s nodes: ``scontrol show config`` with ``select`` and
    ``enforce``, ``sacctmgr show assoc`` with ``accounts`` (rc 1 when None: no accounting), ``sbatch --test-only``
    with ``test_only`` (rc, text); any other sbatch fails the test."""

    def __init__(
        self,
        *,
        sinfo: str = SINFO,
        select: str = "select/cons_tres",
        enforce: str = "associations,limits",
        accounts: Sequence[tuple[str, str]] | None = (("research", "normal,high"),),
        test_only: tuple[int, str] = (0, "sbatch: Job 7 to start at 2026-01-01T00:00:00 using 2 processors"),
    ) -> None:
        self.sinfo, self.select, self.enforce = sinfo, select, enforce
        self.accounts, self.test_only = accounts, test_only
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        args = list(argv)
        self.calls.append(args)
        if args[0] == "sinfo":
            return Completed(0, self.sinfo, "")
        if args[:3] == ["scontrol", "show", "config"]:
            config = f"ClusterName = canned\nSelectType = {self.select}\nAccountingStorageEnforce = {self.enforce}\n"
            return Completed(0, config, "")
        if args[0] == "squeue":  # the queue, for the scheduler's limits
            return Completed(0, "", "")
        if args[0] == "sacctmgr" and args[3] != "assoc":  # the default account and the QOS, for the limits
            return Completed(0, "research\n" if args[3] == "user" else "", "")
        if args[0] == "sacctmgr":
            if self.accounts is None:
                return Completed(1, "", "sacctmgr: error: Problem talking to the database: Connection refused")
            rows = "".join(f"{a}|alice||||||{qos}|normal\n" for a, qos in self.accounts)
            return Completed(0, rows, "")
        if args[0] == "sbatch" and "--test-only" in args:
            rc, text = self.test_only
            return Completed(rc, "", text)
        raise AssertionError(f"unexpected command {args}")

    def commands(self, name: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == name]


def _line(text: str, key: str) -> int:
    """The line (1-based) of the top-level ``key:`` in ``text``, found by reading the text itself."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(f"{key}:"))


def _profile(tmp_path: Path, body: str) -> tuple[Path, str]:
    write_runtime_shim(tmp_path / "venv")
    text = f"name: canned\nworkspace: work\npython_env: venv\n{body}"
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path, text


def _checks(profile: Path, cluster: Cluster, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    report = doctor(profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env or {"PATH": "/usr/bin:/bin"})
    return {c.name: c for c in report.checks}


def test_every_problem_of_the_profile_is_reported_at_once_each_at_its_line_and_column(tmp_path: Path) -> None:
    profile, text = _profile(
        tmp_path,
        "partition: gpu\ncpu_partition: cpux\ngpus_per_node: 8\naccount: nosuch\nvllm_executable: /nonexistent/vllm\n",
    )
    cluster = Cluster()
    checks = _checks(profile, cluster)
    problems = {name for name, c in checks.items() if c.status == "problem"}
    assert problems == {"cpu_partition", "gpus_per_node", "account", "vllm"}
    for name, key in (("cpu_partition", "cpu_partition"), ("gpus_per_node", "gpus_per_node"), ("account", "account"),
                      ("vllm", "vllm_executable")):  # fmt: skip
        assert checks[name].where == f"{profile}:{_line(text, key)}:1", name
        assert checks[name].field == key
    assert (
        "partition 'cpux' does not exist (sinfo shows gpu, cpu); did you mean 'cpu'?" in checks["cpu_partition"].detail
    )
    assert "8 GPUs per node, but the nodes of partition gpu have at most 4" in checks["gpus_per_node"].detail
    assert "'nosuch' is not one of your accounts (sacctmgr: research)" in checks["account"].detail
    assert "/nonexistent/vllm does not exist or is not executable on the submit host" in checks["vllm"].detail
    assert checks["partition"].status == "ok" and checks["python_env"].status == "ok"
    assert len(cluster.commands("sinfo")) == 1  # one sinfo for every check
    assert cluster.commands("sbatch") == []

    out = io.StringIO()
    code = main(["doctor", "--profile", str(profile), "--json"], env={"PATH": "/usr/bin:/bin"},
                slurm=Slurm(Cluster(), user="alice"), stdout=out, stderr=io.StringIO())  # fmt: skip
    document = json.loads(out.getvalue())
    assert code == 1 and document["ok"] is False and document["problems"] == 4
    assert {c["name"] for c in document["checks"] if c["status"] == "problem"} == problems
    text_out = io.StringIO()
    assert main(["doctor", "--profile", str(profile)], env={"PATH": "/usr/bin:/bin"},
                slurm=Slurm(Cluster(), user="alice"), stdout=text_out, stderr=io.StringIO()) == 1  # fmt: skip
    shown = text_out.getvalue()
    assert f"{profile}:{_line(text, 'gpus_per_node')}:1: gpus_per_node: 8 GPUs per node" in shown
    assert "4 problem(s): submit would refuse them" in shown


def test_memory_and_the_gpu_request_are_checked_against_the_nodes_with_those_gpus(tmp_path: Path) -> None:
    profile, text = _profile(
        tmp_path, "partition: gpu\ngpus_per_node: 4\nmemory_per_gpu: 16G\ngpu_request: gpus\nvllm_executable: /bin/sh\n"
    )
    checks = _checks(profile, Cluster(select="select/linear"))
    assert checks["memory_per_gpu"].status == "problem"
    assert checks["memory_per_gpu"].where == f"{profile}:{_line(text, 'memory_per_gpu')}:1"
    assert "16G x 4 GPUs = 65536 MB, but the nodes of partition gpu with 4 GPUs have at most 32000 MB" in (
        checks["memory_per_gpu"].detail
    )
    assert checks["gpu_request"].status == "problem"
    assert "needs SelectType select/cons_tres, this cluster has select/linear" in checks["gpu_request"].detail
    assert checks["gpus_per_node"].status == "ok" and checks["vllm"].status == "ok"

    profile.write_text(text.replace("memory_per_gpu: 16G", "memory_per_gpu: 8000M"))  # 32000 MB: exactly a node
    checks = _checks(profile, Cluster())
    assert [c.status for c in checks.values()].count("problem") == 0
    assert checks["memory_per_gpu"].status == "ok" and checks["gpu_request"].status == "ok"


def test_the_account_without_accounting_or_enforcement_is_skipped_with_the_reason(tmp_path: Path) -> None:
    profile, _ = _profile(tmp_path, "partition: gpu\naccount: nosuch\n")
    account = _checks(profile, Cluster(accounts=None))["account"]
    assert account.status == "skipped" and "sacctmgr could not be asked" in account.detail
    account = _checks(profile, Cluster(enforce="none"))["account"]
    assert account.status == "skipped" and "this cluster does not enforce associations" in account.detail
    assert _checks(profile, Cluster(accounts=(("nosuch", "normal"),)))["account"].status == "ok"


def test_a_python_env_without_ddslurm_runtime_is_a_problem_at_its_line(tmp_path: Path) -> None:
    profile, text = _profile(tmp_path, "partition: gpu\n")
    profile.write_text(text.replace("python_env: venv", "python_env: no-such-venv"))
    check = _checks(profile, Cluster())["python_env"]
    assert check.status == "problem" and check.where == f"{profile}:{_line(text, 'python_env')}:1"
    assert (
        check.detail
        == f"{tmp_path / 'no-such-venv' / 'bin' / 'ddslurm-runtime'} does not exist (the compute nodes run it)"
    )


@pytest.mark.parametrize(
    ("theirs", "status", "said"),
    [
        pytest.param(
            {"data-designer": "1.0.0rc1"},
            "ok",
            "data-designer 1.0.0rc1 {side} (ddslurm supports "
            "data-designer>=0.8.0,<1.1; each run records the nodes' version)",
            id="newer-supported",
        ),
        pytest.param({"data-designer": "0.8.0"}, "ok", "data-designer 0.8.0 {side}", id="oldest"),
        pytest.param(
            {"data-designer": "0.7.2"},
            "problem",
            "venv has data-designer 0.7.2, which ddslurm does not support: install data-designer>=0.8.0,<1.1 there",
            id="too-old",
        ),
        pytest.param(
            {"data-designer": "1.1.0"},
            "problem",
            "has data-designer 1.1.0, which ddslurm does not support",
            id="too-new",
        ),
        pytest.param({"data-designer": None}, "problem", "venv has no data-designer (the nodes run it)", id="none"),
        pytest.param(
            {"ddslurm-config": "0.0.9"},
            "problem",
            "venv has ddslurm-config 0.0.9 where the submit host has {config}",
            id="other-ddslurm",
        ),
    ],
)
def test_python_env_may_hold_any_supported_data_designer_but_ddslurm_at_the_submit_hosts_versions(
    tmp_path: Path, theirs: dict[str, str | None], status: str, said: str
) -> None:
    """Compatibility, not equality: the nodes' Data Designer is judged against the versions ddslurm supports, and
    both sides' versions are said; ddslurm's own packages, which write and read the plan, must be the same."""
    from importlib.metadata import version

    from ddslurm.launcher.testing import OtherPythonEnv

    profile, text = _profile(tmp_path, "partition: gpu\n")
    report = doctor(profile, slurm=Slurm(Cluster(), user="alice"), host=OtherPythonEnv(theirs), env={"PATH": "/bin"})
    check = next(c for c in report.checks if c.name == "python_env")
    assert check.status == status, check.detail
    ours, nodes = version("data-designer"), theirs.get("data-designer")
    side = "on the nodes and the submit host" if nodes == ours else f"on the nodes, {ours} on the submit host"
    assert said.format(side=side, config=version("ddslurm-config")) in check.detail
    if status == "problem":
        assert check.where == f"{profile}:{_line(text, 'python_env')}:1"


def test_python_env_must_read_the_plan_format_the_submit_host_writes() -> None:
    """(A runtime from before it said its plan format answers in no inspect protocol version: ``doctor`` says so,
    ``test_engine_host.py``.)"""
    import msgspec

    from ddslurm.config import LAYOUT_VERSION, PLAN_VERSION, PlanFormat, VersionsAnswer, VersionsRequest
    from ddslurm.launcher.cluster._doctor_versions import judge_versions
    from ddslurm.runtime import NODE_DISTRIBUTIONS, answer_inspect, installed_versions

    ours = installed_versions(NODE_DISTRIBUTIONS)
    answer = answer_inspect(VersionsRequest())
    assert isinstance(answer, VersionsAnswer) and judge_versions(answer, ours, "/venv")[0]
    other = msgspec.structs.replace(answer, plan=PlanFormat(version=PLAN_VERSION - 1, layout=LAYOUT_VERSION))
    ok, detail = judge_versions(other, ours, "/venv")
    expected = f"reads plan {PLAN_VERSION - 1}, layout {LAYOUT_VERSION}; the submit host writes plan {PLAN_VERSION}"
    assert not ok and expected in detail


def test_the_vllm_command_is_looked_up_on_path_and_a_default_one_missing_is_only_noted(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\n")
    (bin_dir / "vllm").chmod(0o755)
    profile, _ = _profile(tmp_path, "partition: gpu\n")  # vllm_executable not set: its default, vllm
    found = _checks(profile, Cluster(), env={"PATH": f"{bin_dir}:/usr/bin"})["vllm"]
    assert (
        found.status == "ok" and str(bin_dir / "vllm") in found.detail and "checked on the submit host" in found.detail
    )
    missing = _checks(profile, Cluster(), env={"PATH": "/usr/bin:/bin"})["vllm"]
    assert missing.status == "skipped" and "runs with deployments need it" in missing.detail


def test_without_nodes_from_sinfo_the_cluster_checks_are_skipped_and_nothing_is_submitted(tmp_path: Path) -> None:
    profile, _ = _profile(tmp_path, "partition: gpu\ngpus_per_node: 4\nvllm_executable: /bin/sh\n")
    cluster = Cluster(sinfo="")
    checks = _checks(profile, cluster)
    for name in ("partition", "gpus_per_node", "gpu_request", "memory_per_gpu"):
        assert checks[name].status == "skipped", name
    assert checks["partition"].detail == "sinfo shows no node"


@pytest.fixture
def _no_data_designer_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data Designer's own validation of the recipe (a subprocess of seconds) is tested elsewhere."""
    accept_every_recipe(monkeypatch)


@pytest.mark.usefixtures("_no_data_designer_subprocess")
def test_the_dry_run_refuses_a_job_no_node_can_take_at_the_run_files_field(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, "k" * 24, run_extra="submission:\n  cpus: 12\n")
    cluster = Cluster()
    with pytest.raises(SubmitError) as refused:
        dry_run(run, profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env)
    assert str(refused.value).startswith("the run's jobs do not fit this cluster (1 problem(s)):\n")
    lines = run.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.strip().startswith("cpus:"))
    assert (
        f"{run}:{line}:3: submission.cpus: the job asks for 12 CPUs on one node; no node of partition cpu has them "
        "(largest: 8 CPUs, 16000 MB, 0 GPUs)"
    ) in str(refused.value)
    assert cluster.commands("sbatch") == []  # the jobs do not fit: nothing asked of sbatch


@pytest.mark.usefixtures("_no_data_designer_subprocess")
def test_sbatch_test_only_of_the_first_array_is_asked_and_its_refusal_refuses_the_dry_run(tmp_path: Path) -> None:
    run, profile, env = write_unit_run(tmp_path, "k" * 24)
    cluster = Cluster()
    done = dry_run(run, profile, slurm=Slurm(cluster, user="alice"), host=HOST, env=env)
    (test_only,) = cluster.commands("sbatch")
    assert test_only[:3] == ["sbatch", "--test-only", "--export=ALL"]
    assert not Path(test_only[-1]).exists()  # a temporary copy of the first array's script, removed again
    assert done.planned.arrays and not (tmp_path / "work").exists()

    refusing = Cluster(test_only=(1, "allocation failure: Requested node configuration is not available"))
    with pytest.raises(SubmitError, match="Slurm refuses the first array: allocation failure: Requested node"):
        dry_run(run, profile, slurm=Slurm(refusing, user="alice"), host=HOST, env=env)
    assert "k" * 24 not in json.dumps(refusing.calls)  # the key travels in sbatch's environment only
