"""``ddslurm submit --dry-run`` of replicas bigger than a node against the local cluster (n1 and n2: 4 GPUs each):
a two-node replica is planned on ``--nodes=2`` and Slurm's ``sbatch --test-only`` accepts it; shapes the cluster
or the threat model cannot take are refused with their numbers, at their field."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from ddslurm.launcher.cli import main

ROOT = Path(__file__).resolve().parents[1]
MIXED = ROOT / "examples" / "mixed"
PROFILE = ROOT / "examples" / "local-profile.yaml"

pytestmark = pytest.mark.slurm


def _env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "DATA_DESIGNER_HOME": str(ROOT / "examples" / "hosted-only" / "dd-home"),
        "DEMO_HOSTED_API_KEY": "a-demo-key-value",
        "PATH": "/usr/bin:/bin",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def _dry_run(run: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = _env(monkeypatch)
    code = main(["submit", str(run), "--profile", str(PROFILE), "--dry-run"], env=env, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _variant(tmp_path: Path, generator: str) -> Path:
    """The two-node example in ``tmp_path`` with the generator's shape lines replaced by ``generator``."""
    for name in ("recipe.yaml", "questions.csv"):
        shutil.copy(MIXED / name, tmp_path / name)
    text = (MIXED / "run-two-nodes.yaml").read_text()
    shape = "    tensor_parallel: 4"
    start = text.index(shape)
    end = text.index("    server:", start)
    run = tmp_path / "run.yaml"
    run.write_text(text[:start] + generator + text[end:])
    return run


def test_the_two_node_example_asks_for_two_nodes_and_slurm_accepts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = _dry_run(MIXED / "run-two-nodes.yaml", monkeypatch)
    assert code == 0, err
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in out and "#SBATCH --gres=gpu:4\n" in out
    servers = [line for line in out.splitlines() if "--job-name=server-generator-0" in line]
    assert [("--relative=0" in s, "--relative=1" in s) for s in servers] == [(True, False), (False, True)]
    assert "1 replica x (TP 4 x PP 2 = 8 GPUs over 2 nodes, 4 a node), vllm" in out
    assert "a-demo-key-value" not in out


def test_a_replica_of_three_nodes_is_refused_on_a_partition_of_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _variant(tmp_path, "    tensor_parallel: 4\n    pipeline_parallel: 3\n")
    code, _, err = _dry_run(run, monkeypatch)
    assert code != 0
    assert (
        f"{run}:10:1: deployments: one replica spans 3 nodes of 4 GPUs, but partition gpu has 2 node(s) with 4 "
        "GPUs or more (sinfo)"
    ) in err


def test_a_spanning_replica_with_replicas_2_is_refused_at_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _variant(tmp_path, "    tensor_parallel: 4\n    pipeline_parallel: 2\n    replicas: 2\n")
    code, _, err = _dry_run(run, monkeypatch)
    assert code != 0
    assert "deployments[0].replicas: a replica of 'generator' spans 2 nodes" in err
    assert "use allocations: K to run K such replicas" in err.replace("Use", "use")
