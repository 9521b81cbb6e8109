"""``ddslurm init``: a run file and a cluster profile from sinfo, for canned clusters (no GPUs, several GPU
partitions, typed GRES) and for the real local cluster; both files load as ddslurm loads them, and init never
overwrites without ``force`` or leaves anything behind when it fails."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from ddslurm.config import ClusterProfile, RunFile, load_profile, load_run_file
from ddslurm.launcher import (
    Completed,
    InitError,
    InitResult,
    Slurm,
    SlurmError,
    init_command,
    parse_sinfo,
    prepare,
)
from ddslurm.launcher._cluster import SINFO_FORMAT, cluster_from_rows, parse_gres
from ddslurm.launcher._init import render_init, yaml_str
from ddslurm.launcher.testing import accept_recipe

VENV = Path("/opt/envs/ddslurm")
NOW = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)

LOCAL = """\
n1|gpu*|16|32000|gpu:4|up|infinite
n1|cpu|16|32000|gpu:4|up|infinite
n2|gpu*|16|32000|gpu:4|up|infinite
n2|cpu|16|32000|gpu:4|up|infinite
n3|cpu|16|32000|(null)|up|infinite
"""
NO_GPUS = """\
c1|batch*|64|256000|(null)|up|2-00:00:00
c2|batch*|64|256000|(null)|up|2-00:00:00
c3|long|32|128000|(null)|up|7-00:00:00
c9|old|8|16000|(null)|down|infinite
"""
SEVERAL_GPU_PARTITIONS = """\
c1|cpu*|64|256000|(null)|up|1-00:00:00
c2|cpu*|64|256000|(null)|up|1-00:00:00
g1|v100|40|384000|gpu:4|up|12:00:00
g2|v100|40|384000|gpu:4|up|12:00:00
h1|h100|96|2048000|gpu:8|up|2-00:00:00
h2|h100|96|2048000|gpu:8|up|2-00:00:00
h1|debug|96|2048000|gpu:8|up|30:00
c1|debug|64|256000|(null)|up|30:00
"""
TYPED = """\
a1|gpu*|128|1031000|gpu:a100:8(S:0-1)|up|4:00:00
a2|gpu*|128|1031000|gpu:a100:8(S:0-1)|up|4:00:00
a3|gpu*|128|515000|gpu:a100:4(S:0),shard:a100:16|up|4:00:00
s1|cpu|32|64000|(null)|up|4:00:00
"""


class CannedSlurm:
    """Answers sinfo with ``sinfo`` text and scontrol with a cluster name; records the calls."""

    def __init__(self, sinfo: str, *, name: str = "canned", sinfo_rc: int = 0) -> None:
        self.sinfo, self.name, self.sinfo_rc = sinfo, name, sinfo_rc
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        self.calls.append(list(argv))
        if argv[0] == "sinfo":
            if self.sinfo_rc:
                return Completed(self.sinfo_rc, "", "sinfo: error: Unable to contact slurm controller")
            return Completed(0, self.sinfo, "")
        if argv[:3] == ["scontrol", "show", "config"]:
            return Completed(0, f"ClusterName = {self.name}\nMaxArraySize = 1001\n", "")
        return Completed(1, "", f"unexpected {argv}")


def _init(tmp_path: Path, sinfo: str) -> tuple[InitResult, RunFile, ClusterProfile, CannedSlurm]:
    runner = CannedSlurm(sinfo)
    result = init_command(tmp_path / "new", slurm=Slurm(runner), python_env=VENV, now=NOW)
    return result, load_run_file(result.run_file), load_profile(result.profile), runner


@pytest.mark.parametrize(
    ("gres", "count", "types"),
    [
        ("(null)", 0, ()),
        ("gpu:4", 4, ()),
        ("gpu:a100:8", 8, ("a100",)),
        ("gpu:a100:8(S:0-1)", 8, ("a100",)),
        ("gpu:a100:2(S:0,1),gpu:v100:2(S:1)", 4, ("a100", "v100")),
        ("gpu:4,shard:16", 4, ()),
        ("shard:gpu:8,mps:100", 0, ()),
        ("mygpu:2", 0, ()),
    ],
)
def test_gpus_are_counted_from_gres_as_sinfo_prints_it(gres: str, count: int, types: tuple[str, ...]) -> None:
    assert parse_gres(gres) == (count, types)


def test_the_local_cluster_shape(tmp_path: Path) -> None:
    result, run, profile, runner = _init(tmp_path, LOCAL)
    assert runner.calls[0] == ["sinfo", "-h", "-N", "-o", SINFO_FORMAT]
    assert (profile.partition, profile.cpu_partition, profile.gpus_per_node) == ("gpu", "cpu", 4)
    assert profile.memory_per_gpu == "8000M"  # 32000 MB per node / 4 GPUs
    assert profile.name == "canned" and profile.python_env == str(VENV) and profile.gpu_request == "gres"
    assert profile.workspace == str(tmp_path / "new" / "ddslurm-work")  # relative to the profile
    assert run.deployments == () and run.recipe == "recipe.yaml" and run.submission.time_limit == "01:00:00"
    text = result.profile.read_text()
    assert "#   gpu*       2      16         31.2G        4" in text
    assert "4 on 2 of 3 nodes" in text
    assert "(1 of its 3 nodes has no GPU)" in text
    assert result.as_dict()["partition"] == "gpu" and result.as_dict()["cpu_partition"] == "cpu"
    assert result.lines()[0] == f"wrote {result.run_file} and {result.profile}"
    assert (result.run_file.stat().st_mode & 0o777) == 0o644


def test_a_cluster_without_gpus_gets_a_hosted_only_profile(tmp_path: Path) -> None:
    result, run, profile, _ = _init(tmp_path, NO_GPUS)
    assert profile.partition is None and profile.gpus_per_node == 0 and profile.memory_per_gpu is None
    assert profile.cpu_partition == "batch"  # the default partition among those without GPUs
    assert run.deployments == ()
    assert "sinfo shows no GPUs on this cluster" in result.profile.read_text()
    assert "  no GPU partition: runs use hosted models only (no deployments)" in result.lines()
    assert any("old" in note and "not up" in note for note in result.choices.notes)


def test_several_gpu_partitions_pick_the_one_with_the_most_gpus_per_node(tmp_path: Path) -> None:
    result, run, profile, _ = _init(tmp_path, SEVERAL_GPU_PARTITIONS)
    assert (profile.partition, profile.gpus_per_node, profile.cpu_partition) == ("h100", 8, "cpu")
    assert profile.memory_per_gpu == "250G"  # 2048000 MB / 8, whole gigabytes
    assert run.submission.time_limit == "01:00:00"
    assert any(note.startswith("other partitions with GPUs: v100, debug") for note in result.choices.notes)
    assert "tensor_parallel <= 8 (gpus_per_node)" in result.run_file.read_text()


def test_typed_gres_and_nodes_with_fewer_gpus(tmp_path: Path) -> None:
    result, run, profile, _ = _init(tmp_path, TYPED)
    assert (profile.partition, profile.gpus_per_node, profile.cpu_partition) == ("gpu", 4, "cpu")
    assert profile.memory_per_gpu == "125G"  # the smallest GPU node: 515000 MB / 4 GPUs
    assert run.submission.time_limit == "01:00:00"
    text = result.profile.read_text()
    assert "(sinfo GRES: 4 x gpu (a100))" in text and "4-8 a100" in text
    assert any("have 4 to 8 GPUs" in note for note in result.choices.notes)


def test_a_short_partition_time_limit_caps_the_runs_time_limit(tmp_path: Path) -> None:
    sinfo = "g1|short*|8|64000|gpu:2|up|30:00\nc1|cpus|8|64000|(null)|up|20:00\n"
    _, run, profile, _ = _init(tmp_path, sinfo)
    assert run.submission.time_limit == "00:20:00" and profile.partition == "short"


@pytest.mark.parametrize("value", ["gpu", "gpu-a100", "yes", "on", "null", "123", "1:30", "a b", "#x", "x: y", "-p"])
def test_yaml_scalars_read_back_as_the_same_string(value: str) -> None:
    assert YAML(typ="safe").load(f"k: {yaml_str(value)}\n") == {"k": value}
    assert YAML(typ="rt").load(f"k: {yaml_str(value)}\n")["k"] == value


def test_odd_partition_names_still_load(tmp_path: Path) -> None:
    _, _, profile, _ = _init(tmp_path, "n1|on*|4|8000|gpu:1|up|infinite\nn2|1234|4|8000|(null)|up|infinite\n")
    assert (profile.partition, profile.cpu_partition) == ("on", "1234")


def test_existing_files_are_kept_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "new"
    target.mkdir()
    (target / "run.yaml").write_text("mine\n")
    runner = CannedSlurm(LOCAL)
    with pytest.raises(InitError, match=r"run.yaml already exist\(s\); nothing was written \(--force replaces them\)"):
        init_command(target, slurm=Slurm(runner), python_env=VENV)
    assert (target / "run.yaml").read_text() == "mine\n" and not (target / "profile.yaml").exists()
    assert runner.calls == []  # refused before asking the cluster anything

    result = init_command(target, slurm=Slurm(runner), python_env=VENV, force=True)
    assert result.overwritten == (target / "run.yaml",)
    assert load_run_file(target / "run.yaml").name == "my-run" and load_profile(target / "profile.yaml")


def test_a_failure_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "deep" / "new"
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        init_command(target, slurm=Slurm(CannedSlurm(LOCAL, sinfo_rc=1)), python_env=VENV)
    assert not (tmp_path / "deep").exists()
    with pytest.raises(InitError, match="sinfo lists no partition"):
        init_command(target, slurm=Slurm(CannedSlurm("")), python_env=VENV)
    assert not (tmp_path / "deep").exists()

    import ddslurm.launcher._init as init_module

    real = init_module.publish_once

    def second_fails(path: Path, data: bytes, *, mode: int) -> bool:
        if path.name == "profile.yaml":
            raise OSError(28, "No space left on device")
        return real(path, data, mode=mode)

    monkeypatch.setattr(init_module, "publish_once", second_fails)
    with pytest.raises(OSError, match="No space left"):
        init_command(target, slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV)
    assert not target.exists()  # the run file it had written is gone, and the directory it made


def test_render_is_pure_and_refuses_an_empty_cluster() -> None:
    cluster = cluster_from_rows(parse_sinfo(LOCAL), "local")
    first = render_init(cluster, python_env=str(VENV), now=NOW)
    assert first == render_init(cluster, python_env=str(VENV), now=NOW)
    assert "Written by `ddslurm init` on 2026-01-02 03:04 UTC" in first.profile_yaml
    with pytest.raises(InitError):
        render_init(cluster_from_rows([]), python_env=str(VENV))


@pytest.mark.slurm
def test_init_on_the_local_cluster_gives_files_a_run_submits_with(tmp_path: Path) -> None:
    """The real sinfo of the local cluster: GPU partition gpu (4 fake GPUs per node), CPU partition cpu; the run
    file init writes, with a recipe beside it, prepares as a submission (this environment as python_env)."""
    from ddslurm.launcher.testing import UNIT_RECIPE

    result = init_command(tmp_path, slurm=Slurm())
    profile = load_profile(result.profile)
    assert (profile.partition, profile.cpu_partition, profile.gpus_per_node) == ("gpu", "cpu", 4)
    assert profile.name == "local" and profile.memory_per_gpu == "8000M"
    assert Path(profile.python_env, "bin", "ddslurm-runtime").exists()

    (tmp_path / "recipe.yaml").write_text(UNIT_RECIPE)
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "model_providers.yaml").write_text(
        "providers:\n- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HOSTED_KEY}\n"
    )
    env = {"DATA_DESIGNER_HOME": str(tmp_path / "dd"), "HOSTED_KEY": "sk-init-test-0123456789", "PATH": "/usr/bin"}
    prepared = prepare(result.run_file, result.profile, env, NOW, check_recipe=accept_recipe)
    generation = prepared.plan.generation
    assert (generation.partition, generation.gres, generation.time_minutes) == ("cpu", "none", 60)
    assert prepared.plan.collection.partition == "cpu" and prepared.plan.num_records == 100


def test_the_init_command_of_the_cli(tmp_path: Path) -> None:
    """``ddslurm init --dir D [--json] [--force]``: the Typer command writes both files, says what it chose, and
    refuses (exit 1, nothing written) to replace them without --force."""
    import io
    import json

    from ddslurm.launcher.cli import main

    target = tmp_path / "my-run"
    out, err = io.StringIO(), io.StringIO()
    assert main(["init", "--dir", str(target)], env={}, slurm=Slurm(CannedSlurm(LOCAL)), stdout=out, stderr=err) == 0
    assert load_run_file(target / "run.yaml") and load_profile(target / "profile.yaml")
    assert f"wrote {target / 'run.yaml'}" in out.getvalue() and "ddslurm submit" in out.getvalue()

    out = io.StringIO()
    code = main(["init", "--dir", str(target), "--json"], env={}, slurm=Slurm(CannedSlurm(LOCAL)), stdout=out,
                stderr=io.StringIO())  # fmt: skip
    assert code == 1 and json.loads(out.getvalue())["error"]["code"] == "failed"

    out = io.StringIO()
    code = main(["init", "--dir", str(target), "--force", "--json"], env={}, slurm=Slurm(CannedSlurm(LOCAL)),
                stdout=out, stderr=io.StringIO())  # fmt: skip
    assert code == 0 and json.loads(out.getvalue())["overwritten"] == [
        str(target / "run.yaml"),
        str(target / "profile.yaml"),
    ]
