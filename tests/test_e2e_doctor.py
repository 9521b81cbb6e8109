"""The profile's checks on the local Slurm cluster: each common profile mistake (a partition that does not exist,
more GPUs or memory than the nodes have, a vLLM executable that is not there, a ``python_env`` that is missing or
holds a Data Designer ddslurm does not support) is refused by ``submit --dry-run`` at the profile's line and
column, before anything is submitted; the example profile passes ``doctor`` and the dry run (with ``sbatch
--test-only`` of the first array).

The nodes' GPUs and memory are read here from ``scontrol show node``, not from ddslurm's own ``sinfo`` parsing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.e2e import FAKE_VLLM, REPO, run_cli, slurm

pytestmark = [pytest.mark.slurm]

MIXED = REPO / "examples" / "mixed" / "run.yaml"
"""A run with a local deployment (the vLLM stand-in on the fake GPUs) and a hosted judge."""
DD_HOME = REPO / "examples" / "hosted-only" / "dd-home"


def _gpu_nodes() -> tuple[int, int]:
    """The most GPUs and the most memory (MB) of a node of partition gpu, as ``scontrol show node`` says."""
    gpus, memory = 0, 0
    for line in slurm("scontrol", "show", "node", "-o", check=True).splitlines():
        if not re.search(r"\bPartitions=(\S*,)?gpu(,|\s)", line):
            continue
        found = re.search(r"\bGres=gpu:(?:[^:\s]+:)?(\d+)", line)
        gpus = max(gpus, int(found.group(1)) if found else 0)
        memory = max(memory, int(re.search(r"\bRealMemory=(\d+)", line).group(1)))  # type: ignore[union-attr]
    assert gpus and memory
    return gpus, memory


def _profile(tmp_path: Path, **fields: str) -> tuple[Path, str]:
    values = {
        "name": "local",
        "workspace": str(tmp_path / "work"),
        "python_env": str(REPO / ".venv"),
        "partition": "gpu",
        "cpu_partition": "cpu",
        "gpus_per_node": "4",
        "gpu_request": "gres",
        "vllm_executable": str(FAKE_VLLM),
        "memory_per_gpu": "2G",
        **fields,
    }
    text = "".join(f"{key}: {value}\n" for key, value in values.items())
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path, text


def _line(text: str, key: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(f"{key}:"))


def _env() -> dict[str, str]:
    return {**os.environ, "DATA_DESIGNER_HOME": str(DD_HOME), "DEMO_HOSTED_API_KEY": "demo-key-for-the-dry-run"}


def _other_data_designer(root: Path) -> Path:
    """A ``python_env`` (a virtual environment) whose installed Data Designer is 0.7.2 (older than ddslurm supports)
    as its package metadata records it (what pip and uv read): its own site-packages, searched first, holds that
    distribution's record, and a ``.pth`` file adds this environment's site-packages after it (their own ``.pth``
    files, the workspace's editable installs, included), so its ddslurm-runtime runs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site,) = (root / "lib").glob("python*/site-packages")
    record = site / "data_designer-0.7.2.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: data-designer\nVersion: 0.7.2\n")
    (site / "workspace.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    runtime = root / "bin" / "ddslurm-runtime"
    runtime.write_text(
        f"#!{root / 'bin' / 'python'}\nimport sys\nfrom ddslurm.runtime.cli import main\nsys.exit(main())\n"
    )
    runtime.chmod(0o755)
    return root


def _mistakes(tmp_path: Path) -> list[tuple[str, dict[str, str], str, str]]:
    """(id, profile fields, the field refused, what the refusal says) for each mistake."""
    gpus, memory = _gpu_nodes()
    per_gpu = memory // gpus + 1000  # MB: just over what a node with every GPU can give
    return [
        ("partition", {"partition": "gpux"}, "partition", "partition 'gpux' does not exist"),
        ("gpus", {"gpus_per_node": str(gpus * 2)}, "gpus_per_node",
         f"{gpus * 2} GPUs per node, but the nodes of partition gpu have at most {gpus}"),
        ("memory", {"memory_per_gpu": f"{per_gpu}M"}, "memory_per_gpu",
         f"{per_gpu}M x {gpus} GPUs = {per_gpu * gpus} MB, but the nodes of partition gpu with {gpus} GPUs have at "
         f"most {memory} MB"),
        ("vllm", {"vllm_executable": str(tmp_path / "no" / "vllm")}, "vllm_executable",
         f"{tmp_path / 'no' / 'vllm'} does not exist or is not executable on the submit host"),
        ("python-env-missing", {"python_env": str(tmp_path / "no-env")}, "python_env",
         f"{tmp_path / 'no-env' / 'bin' / 'ddslurm-runtime'} does not exist"),
        ("python-env-other-dd", {"python_env": str(tmp_path / "old-dd")}, "python_env",
         "has data-designer 0.7.2, which ddslurm does not support: install data-designer>=0.8.0,<1.1 there"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", ["partition", "gpus", "memory", "vllm", "python-env-missing", "python-env-other-dd"])
def test_each_profile_mistake_is_refused_by_the_dry_run_at_the_profiles_line_and_column(
    tmp_path: Path, case: str
) -> None:
    _other_data_designer(tmp_path / "old-dd")
    (fields, field, says) = next((f, k, s) for name, f, k, s in _mistakes(tmp_path) if name == case)
    profile, text = _profile(tmp_path, **fields)
    done = run_cli("submit", str(MIXED), "--profile", str(profile), "--dry-run", env=_env())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the profile does not fit this cluster (1 problem(s))" in done.stderr
    assert f"{profile}:{_line(text, field)}:1: {field}: " in done.stderr, done.stderr
    assert says in done.stderr, done.stderr
    assert not (tmp_path / "work").exists()

    report = json.loads(run_cli("doctor", "--profile", str(profile), "--json", env=_env()).stdout)
    (problem,) = [c for c in report["checks"] if c["status"] == "problem"]
    assert problem["where"] == f"{profile}:{_line(text, field)}:1" and says in problem["detail"]


def test_the_example_profile_passes_doctor_and_the_dry_run_asks_sbatch_test_only(tmp_path: Path) -> None:
    profile = REPO / "examples" / "local-profile.yaml"
    done = run_cli("doctor", "--profile", str(profile), str(MIXED), "--json", env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert {c["status"] for c in checks.values()} <= {"ok", "skipped"}
    assert checks["sbatch --test-only"]["status"] == "ok" and "to start at" in checks["sbatch --test-only"]["detail"]
    assert checks["generation job"]["status"] == "ok" and checks["python_env"]["status"] == "ok"
    dry = run_cli("submit", str(MIXED), "--profile", str(profile), "--dry-run", "--json", env=_env())
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["arrays"]
