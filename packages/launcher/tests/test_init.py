"""``ddslurm init``: a run file and a cluster profile from sinfo, for canned clusters (no GPUs, several GPU
partitions, typed GRES) and for the real local cluster; both files load as ddslurm loads them, and init never
overwrites without ``force`` or leaves anything behind when it fails."""

from __future__ import annotations

import contextlib
import os
import runpy
import shlex
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

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
from ddslurm.launcher.cluster._cluster import SINFO_FORMAT, cluster_from_rows, parse_gres
from ddslurm.launcher.init import _starter
from ddslurm.launcher.init._command import run_name
from ddslurm.launcher.init._example import Example
from ddslurm.launcher.init._render import render_init, yaml_str
from ddslurm.launcher.init._starter import on_embedded_cluster
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
    """Answers sinfo with ``sinfo`` text and scontrol with a cluster name (and ``slurm_conf`` as its SLURM_CONF);
    records the calls."""

    def __init__(self, sinfo: str, *, name: str = "canned", sinfo_rc: int = 0, slurm_conf: Path | None = None) -> None:
        self.sinfo, self.name, self.sinfo_rc, self.slurm_conf = sinfo, name, sinfo_rc, slurm_conf
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        self.calls.append(list(argv))
        if argv[0] == "sinfo":
            if self.sinfo_rc:
                return Completed(self.sinfo_rc, "", "sinfo: error: Unable to contact slurm controller")
            return Completed(0, self.sinfo, "")
        if argv[:3] == ["scontrol", "show", "config"]:
            conf = f"SLURM_CONF = {self.slurm_conf}\n" if self.slurm_conf is not None else ""
            return Completed(0, f"ClusterName = {self.name}\nMaxArraySize = 1001\n{conf}", "")
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
    assert result.lines()[0] == f"wrote {result.run_file} and {result.profile} (run name new)"
    assert run.name == "new"  # the directory's name
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
    assert load_run_file(target / "run.yaml").name == "new" and load_profile(target / "profile.yaml")


def _disk_full_at(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """init's first write of a file called ``name`` fails as on a full disk."""
    import ddslurm.launcher.init._command as init_module

    real = init_module.publish_once

    def fails(path: Path, data: bytes, *, mode: int) -> bool:
        if path.name == name:
            raise OSError(28, "No space left on device")
        return real(path, data, mode=mode)

    monkeypatch.setattr(init_module, "publish_once", fails)


def test_a_failure_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "deep" / "new"
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        init_command(target, slurm=Slurm(CannedSlurm(LOCAL, sinfo_rc=1)), python_env=VENV)
    assert not (tmp_path / "deep").exists()
    with pytest.raises(InitError, match="sinfo lists no partition"):
        init_command(target, slurm=Slurm(CannedSlurm("")), python_env=VENV)
    assert not (tmp_path / "deep").exists()

    _disk_full_at("profile.yaml", monkeypatch)
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
    assert result.embedded and profile.vllm_executable == str(Path(profile.python_env, "bin", "fake-vllm"))

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

    out = io.StringIO()
    starter = tmp_path / "starter"
    code = main(["init", "--dir", str(starter), "--example", "mixed", "--json"], env={"UV": "/usr/bin/uv"},
                slurm=Slurm(CannedSlurm(LOCAL)), stdout=out, stderr=io.StringIO())  # fmt: skip
    shown = json.loads(out.getvalue())
    assert code == 0 and shown["example"] == "mixed" and shown["name"] == "starter"
    assert shown["files"] == [
        str(starter / f) for f in ("run.yaml", "profile.yaml", "build.py", "dd-home/model_providers.yaml")
    ]
    assert [s["command"].split()[:3] for s in shown["next"]][3] == ["uv", "run", "ddslurm"]  # as `uv run` ran it
    out = io.StringIO()
    code = main(["init", "--dir", str(tmp_path / "bare"), "--example", "hosted"], env={},
                slurm=Slurm(CannedSlurm(LOCAL)), stdout=out, stderr=io.StringIO())  # fmt: skip
    assert code == 0 and f"  ddslurm providers {tmp_path / 'bare' / 'run.yaml'}" in out.getvalue().splitlines()
    code = main(["init", "--dir", str(tmp_path / "bad"), "--example", "gpu"], env={}, slurm=Slurm(CannedSlurm(LOCAL)),
                stdout=io.StringIO(), stderr=(err := io.StringIO()))  # fmt: skip
    assert code == 2 and "'gpu' is not one of 'hosted', 'mixed'" in err.getvalue()


# --- the run's name, the embedded cluster, --example and the printed commands ---------------------------------------

THIS_ENV = Path(sys.executable).parent.parent
"""The environment the tests run in: it has the vLLM stand-in (bin/fake-vllm), as the embedded cluster's does."""


def _embedded_conf(tmp_path: Path) -> Path:
    """A slurm.conf as tools/local-slurm writes it: its first line is that tool's mark."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(render_slurm_conf(local_slurm.Layout(tmp_path / "state")))
    return conf


local_slurm = runpy.run_path(str(Path(__file__).resolve().parents[3] / "tools" / "local-slurm"), run_name="local_slurm")
render_slurm_conf = local_slurm["render_slurm_conf"]
local_slurm = SimpleNamespace(**local_slurm)


@pytest.mark.parametrize(
    ("directory", "name"),
    [
        ("my-run", "my-run"),
        ("My Data (2026)", "My-Data-2026"),
        ("_tmp.x", "tmp.x"),
        ("~~~", "my-run"),
        ("x" * 80, "x" * 64),
        ("ünïcode-run", "n-code-run"),
    ],
)
def test_the_run_is_named_after_its_directory(directory: str, name: str, tmp_path: Path) -> None:
    assert run_name(tmp_path / directory) == name
    run = RunFile(name=run_name(tmp_path / directory), recipe="r.yaml", num_records=1)  # a valid name
    assert run.name == name


def test_the_embedded_cluster_is_known_by_the_slurm_conf_local_slurm_writes(tmp_path: Path) -> None:
    assert on_embedded_cluster(Slurm(CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path))))
    other = tmp_path / "other.conf"
    other.write_text("ClusterName=local\n# Written by tools/local-slurm\n")  # the mark, not on the first line
    assert not on_embedded_cluster(Slurm(CannedSlurm(LOCAL, slurm_conf=other)))
    assert not on_embedded_cluster(Slurm(CannedSlurm(LOCAL, slurm_conf=tmp_path / "missing.conf")))
    assert not on_embedded_cluster(Slurm(CannedSlurm(LOCAL)))  # scontrol names no SLURM_CONF


def test_on_the_embedded_cluster_deployments_use_the_stand_in(tmp_path: Path) -> None:
    runner = CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path))
    result = init_command(tmp_path / "plain", slurm=Slurm(runner), python_env=THIS_ENV, now=NOW)
    assert result.embedded and result.as_dict()["embedded"] is True
    assert load_profile(result.profile).vllm_executable == str(THIS_ENV / "bin" / "fake-vllm")
    assert (THIS_ENV / "bin" / "fake-vllm").is_file()
    elsewhere = init_command(tmp_path / "real", slurm=Slurm(CannedSlurm(LOCAL)), python_env=THIS_ENV, now=NOW)
    assert not elsewhere.embedded and load_profile(elsewhere.profile).vllm_executable == "vllm"


def test_without_an_example_the_next_step_is_to_write_the_recipe(tmp_path: Path) -> None:
    result = init_command(
        tmp_path / "mine", slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV, now=NOW, cwd=tmp_path, program="ddslurm"
    )
    assert result.written == (result.run_file, result.profile)
    assert result.todo is not None and "write the recipe mine/recipe.yaml" in result.todo
    assert "ddslurm init --example hosted|mixed --dir mine --force" in result.todo
    commands = [step.command for step in result.steps]
    assert commands[:3] == [
        'export DDSLURM_PROFILE="$PWD"/mine/profile.yaml',
        "ddslurm providers mine/run.yaml",
        "ddslurm submit mine/run.yaml --profile mine/profile.yaml --dry-run",
    ]
    assert not any("DATA_DESIGNER_HOME" in c or "fake-vllm" in c for c in commands)
    text = "\n".join(result.lines())
    assert f"next: {result.todo}; then, in one shell:" in text


def test_example_hosted_elsewhere_asks_for_the_key_without_echo(tmp_path: Path) -> None:
    result = init_command(
        tmp_path / "h", slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV, now=NOW, example=Example.hosted,
        cwd=tmp_path, program="ddslurm",
    )  # fmt: skip
    run = load_run_file(result.run_file)
    assert run.recipe == "build.py" and run.deployments == () and (run.num_records, run.shards) == (20, 2)
    assert [p.name for p in result.written] == ["run.yaml", "profile.yaml", "build.py", "model_providers.yaml"]
    providers = YAML(typ="safe").load((tmp_path / "h" / "dd-home" / "model_providers.yaml").read_text())
    assert providers == {
        "providers": [
            {"name": "hosted", "endpoint": "https://integrate.api.nvidia.com/v1", "provider_type": "openai",
             "api_key": "NVIDIA_API_KEY"}
        ]
    }  # fmt: skip
    commands = [step.command for step in result.steps]
    assert commands[:2] == [
        'export DATA_DESIGNER_HOME="$PWD"/h/dd-home',
        "read -rsp 'NVIDIA_API_KEY: ' NVIDIA_API_KEY && export NVIDIA_API_KEY",
    ]
    assert not any("fake-vllm" in c for c in commands) and result.as_dict()["hosted"]["port"] is None


@contextlib.contextmanager
def _held_port() -> Iterator[int]:
    """A loopback port bound (``SO_REUSEADDR``, not listening) while the block runs: no other process is given it,
    and a server that reuses addresses, as the stand-in does, can still listen on it (init's check binds it so)."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def test_example_mixed_on_the_embedded_cluster_starts_the_stand_in_on_the_chosen_port(tmp_path: Path) -> None:
    runner = CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path))
    with _held_port() as port:
        result = init_command(
            tmp_path / "first(hour)", slurm=Slurm(runner), python_env=THIS_ENV, now=NOW, example=Example.mixed,
            port=port, cwd=tmp_path, program="uv run ddslurm",
        )  # fmt: skip
    run, profile = load_run_file(result.run_file), load_profile(result.profile)
    assert run.name == "first-hour" and run.recipe == "build.py"
    [dep] = run.deployments
    assert (dep.model_alias, dep.served_model_name, dep.replicas, dep.tensor_parallel) == (
        "generator",
        "qwen3-8b",
        1,
        1,
    )
    assert profile.vllm_executable == str(THIS_ENV / "bin" / "fake-vllm")
    providers = (tmp_path / "first(hour)" / "dd-home" / "model_providers.yaml").read_text()
    assert f"endpoint: http://127.0.0.1:{port}/v1" in providers and "api_key: STAND_IN_API_KEY" in providers

    commands = [step.command for step in result.steps]
    assert commands[0] == "export DATA_DESIGNER_HOME=\"$PWD\"/'first(hour)/dd-home'"
    assert commands[1] == "export STAND_IN_API_KEY=\"$(python3 -c 'import secrets; print(secrets.token_hex(16))')\""
    stand_in = shlex.split(commands[2])
    assert stand_in[0] == "VLLM_API_KEY=$STAND_IN_API_KEY" and stand_in[1:5] == ["uv", "run", "fake-vllm", "serve"]
    assert stand_in[stand_in.index("--port") + 1] == str(port) and stand_in[-1] == "&"
    assert "--api-key" not in stand_in  # the key is in the stand-in's environment, never on its command line
    assert commands[3:5] == [
        "export DDSLURM_PROFILE=\"$PWD\"/'first(hour)/profile.yaml'",
        "uv run ddslurm providers 'first(hour)/run.yaml'",
    ]  # providers runs build.py in the profile's python_env
    assert commands[-3:] == ['uv run ddslurm wait "$RUN_DIR"', 'uv run ddslurm collect "$RUN_DIR"',
                             'uv run ddslurm report "$RUN_DIR"']  # fmt: skip
    shown = result.as_dict()
    assert shown["next"] == [{"command": s.command, "comment": s.comment} for s in result.steps]
    assert shown["hosted"] == {
        "endpoint": f"http://127.0.0.1:{port}/v1",
        "api_key_env": "STAND_IN_API_KEY",
        "port": port,
    }
    assert (shown["name"], shown["example"], shown["todo"]) == ("first-hour", "mixed", None)
    lines = result.lines()
    assert all(f"  {c}" in lines for c in commands)


def test_init_port_is_the_port_every_written_file_and_step_uses(tmp_path: Path) -> None:
    """``init --example hosted --port N`` (a host that allows only some ports): the Data Designer home's endpoint
    and the printed stand-in command use N, and say it was chosen by --port."""
    import io
    import json

    from ddslurm.launcher.cli import main

    runner = CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path))
    target, out = tmp_path / "ported", io.StringIO()
    with _held_port() as port:
        code = main(["init", "--dir", str(target), "--example", "hosted", "--port", str(port), "--json"],
                    env={}, slurm=Slurm(runner), stdout=out, stderr=io.StringIO())  # fmt: skip
    shown = json.loads(out.getvalue())
    assert code == 0 and shown["hosted"] == {
        "endpoint": f"http://127.0.0.1:{port}/v1",
        "api_key_env": "STAND_IN_API_KEY",
        "port": port,
    }
    providers = YAML(typ="safe").load((target / "dd-home" / "model_providers.yaml").read_text())
    assert [p["endpoint"] for p in providers["providers"]] == [f"http://127.0.0.1:{port}/v1"]
    [stand_in] = [step for step in shown["next"] if "fake-vllm" in step["command"]]
    argv = shlex.split(stand_in["command"])
    assert argv[argv.index("--port") + 1] == str(port)
    assert stand_in["comment"].startswith(f"the hosted provider: the vLLM stand-in on port {port} (--port),")


@pytest.mark.parametrize(
    ("port", "example", "embedded", "said"),
    [
        (0, "hosted", True, "--port 0: 0 is not a TCP port (1 to 65535); choose another, or leave --port out"),
        (65536, "hosted", True, "--port 65536: 65536 is not a TCP port (1 to 65535)"),
        ("taken", "hosted", True, "--port {port}: port {port} of 127.0.0.1 is taken (something listens on it)"),
        ("held", None, True, "--port {port} is the port of the starter's stand-in: give --example too"),
        ("held", "mixed", False, "--port {port}: this is not the embedded cluster (tools/local-slurm), where init "
                                 "starts no stand-in"),
    ],
)  # fmt: skip
def test_a_port_init_cannot_use_is_refused_and_nothing_is_written(
    tmp_path: Path, port: int | str, example: str | None, embedded: bool, said: str
) -> None:
    import io

    from ddslurm.launcher.cli import main

    runner = CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path) if embedded else None)
    with contextlib.ExitStack() as stack:
        if port == "taken":  # something listens there
            listening = stack.enter_context(socket.socket())
            listening.bind(("127.0.0.1", 0))
            listening.listen()
            port = listening.getsockname()[1]
        elif port == "held":
            port = stack.enter_context(_held_port())
        argv = ["init", "--dir", str(tmp_path / "x"), "--port", str(port), *(["--example", example] if example else [])]
        err = io.StringIO()
        code = main(argv, env={}, slurm=Slurm(runner), stdout=io.StringIO(), stderr=err)
    assert code == 1 and f"error: {said.format(port=port)}" in err.getvalue()
    assert not (tmp_path / "x").exists()
    if embedded:  # refused before the cluster was asked anything
        assert runner.calls == []


def test_a_directory_sbatch_cannot_take_is_refused_before_anything(tmp_path: Path) -> None:
    runner = CannedSlurm(LOCAL)
    with pytest.raises(InitError, match=r"--dir .*my run: the profile's workspace would be .*has whitespace"):
        init_command(tmp_path / "my run", slurm=Slurm(runner), python_env=VENV)
    assert runner.calls == [] and list(tmp_path.iterdir()) == []


def test_a_free_port_is_chosen_when_none_is_given(tmp_path: Path) -> None:
    runner = CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path))
    result = init_command(tmp_path / "x", slurm=Slurm(runner), python_env=THIS_ENV, example=Example.hosted)
    port = result.as_dict()["hosted"]["port"]
    assert isinstance(port, int) and port > 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # nothing listens there
    # Not where the kernel takes outgoing connections' source ports from (a bind to port 0's choice), which one of
    # them could hold by the time the user starts the stand-in there.
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert not low <= port <= high, (port, low, high)


def test_no_free_port_for_the_stand_in_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setattr(_starter, "listening_ports", lambda: range(port, port + 1))  # its one port taken
        runner = CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path))
        with pytest.raises(InitError, match=rf"every port of 127.0.0.1 from {port} to {port} .* give one with --port"):
            init_command(tmp_path / "x", slurm=Slurm(runner), python_env=THIS_ENV, example=Example.hosted)
    assert not (tmp_path / "x").exists()


def test_example_mixed_needs_gpus_and_writes_nothing_without_them(tmp_path: Path) -> None:
    with pytest.raises(InitError, match=r"--example mixed serves a model on the job's GPUs.*--example hosted"):
        init_command(tmp_path / "x", slurm=Slurm(CannedSlurm(NO_GPUS)), python_env=VENV, example=Example.mixed)
    assert not (tmp_path / "x").exists()


def test_an_existing_starter_file_is_kept_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "build.py").write_text("mine\n")
    runner = CannedSlurm(LOCAL)
    with pytest.raises(InitError, match=r"build.py already exist"):
        init_command(tmp_path / "x", slurm=Slurm(runner), python_env=VENV, example=Example.hosted)
    assert runner.calls == [] and sorted(p.name for p in (tmp_path / "x").iterdir()) == ["build.py"]
    init_command(tmp_path / "x", slurm=Slurm(runner), python_env=VENV, example=Example.hosted, force=True)
    assert (tmp_path / "x" / "build.py").read_text() != "mine\n"


def test_a_failed_write_of_a_starter_removes_the_directories_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _disk_full_at("model_providers.yaml", monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        init_command(tmp_path / "a" / "b", slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV, example=Example.mixed)
    assert list(tmp_path.iterdir()) == []  # a/b/dd-home, a/b and a are gone


@pytest.mark.dd
@pytest.mark.parametrize("example", list(Example))
def test_the_starter_prepares_as_a_submission(example: Example, tmp_path: Path) -> None:
    """The starter's build.py runs (Data Designer's builder, as submit runs it), its aliases resolve through the
    dd-home init wrote (the hosted one with its key set), and the plan serves the mixed example's generator on
    one GPU of the GPU partition."""
    runner = CannedSlurm(LOCAL, slurm_conf=_embedded_conf(tmp_path))
    result = init_command(tmp_path / "s", slurm=Slurm(runner), python_env=THIS_ENV, example=example, port=45679)
    env = {"DATA_DESIGNER_HOME": str(tmp_path / "s" / "dd-home"), "STAND_IN_API_KEY": "k" * 32, "PATH": "/usr/bin"}
    prepared = prepare(result.run_file, result.profile, env, NOW, check_recipe=accept_recipe)
    rows = {(r.alias, r.kind, r.provider, r.endpoint, r.model, r.key_env, r.key_set) for r in prepared.aliases}
    hosted = ("hosted", "http://127.0.0.1:45679/v1", "nvidia/nemotron-3-nano-30b-a3b", "STAND_IN_API_KEY", True)
    generation = prepared.plan.generation
    if example is Example.mixed:
        local = ("generator", "local", "ddslurm-local-generator", "(started in the job)", "qwen3-8b", None, None)
        assert rows == {local, ("judge", "hosted", *hosted)}
        assert (generation.partition, generation.gres) == ("gpu", "gpu:1")
    else:
        assert rows == {("writer", "hosted", *hosted)}
        assert (generation.partition, generation.gres) == ("cpu", "none")
    assert prepared.plan.num_records == 20 and len(prepared.plan.shards) == 2
    assert prepared.recipe_source == (tmp_path / "s" / "build.py").read_bytes()


NOBODY = 65534
"""Another user's uid (``nobody``): a directory or link of theirs is what init must refuse."""
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def _nothing_written(target: Path, before: set[Path]) -> None:
    assert set(target.rglob("*")) == before, "init wrote something"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777, 0o757])
def test_a_dir_others_can_write_is_refused_before_anything(tmp_path: Path, mode: int) -> None:
    """Another user who can write ``--dir`` (world- or group-writable, sticky or not) could plant a link where init
    writes, or replace build.py later: refused before the cluster is asked, nothing written."""
    target = tmp_path / "shared"
    target.mkdir()
    target.chmod(mode)
    runner = CannedSlurm(LOCAL)
    with pytest.raises(InitError) as refused:
        init_command(target, slurm=Slurm(runner), python_env=VENV, example=Example.hosted)
    assert str(refused.value).startswith(f"{target}: ") and f"(mode {mode:04o}) can write in this directory" in str(
        refused.value
    )
    assert "nothing was written. Give --dir a directory of your own" in str(refused.value)
    assert list(target.iterdir()) == [] and runner.calls == []


@as_root
def test_a_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "theirs"
    target.mkdir(mode=0o755)
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(InitError, match=rf"^{target}: its owner nobody \(uid {NOBODY}\) can write in this directory"):
        init_command(target, slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV)
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("sticky", [False, True])
def test_a_new_dir_is_made_owner_only_under_a_parent_only_root_or_you_can_change(tmp_path: Path, sticky: bool) -> None:
    """A parent writable by others lets them rename a new ``--dir`` aside and put theirs in its place: refused,
    unless its sticky bit keeps them from renaming what is not theirs (``/tmp``). What init makes is 0700."""
    parent = tmp_path / "project"
    parent.mkdir()
    parent.chmod(0o1777 if sticky else 0o777)
    target = parent / "a" / "run"
    if not sticky:
        with pytest.raises(InitError, match=rf"^{target}: cannot be trusted: {parent}: every user \(mode 0777\) can "):
            init_command(target, slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV, example=Example.hosted)
        assert list(parent.iterdir()) == []
        return
    init_command(target, slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV, example=Example.hosted)
    for made in (parent / "a", target, target / "dd-home"):
        assert made.stat().st_mode & 0o7777 == 0o700, made


@pytest.mark.parametrize("where", ["run.yaml", "build.py", "dd-home/model_providers.yaml", "dd-home"])
@pytest.mark.parametrize("force", [False, True])
def test_a_link_where_init_writes_is_refused_and_never_followed(tmp_path: Path, where: str, force: bool) -> None:
    """A symbolic link in ``--dir`` where init writes a file (or the ``dd-home`` it writes into) is refused by name,
    ``--force`` or not; nothing is written and what the link leads to is untouched."""
    target, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    target.mkdir()
    elsewhere.mkdir()
    (elsewhere / "model_providers.yaml").write_text("mine\n")
    if "/" in where:
        (target / "dd-home").mkdir()
    leads = elsewhere if where == "dd-home" else elsewhere / "model_providers.yaml"
    (target / where).symlink_to(leads)
    before = set(target.rglob("*"))
    with pytest.raises(InitError) as refused:
        init_command(target, slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV, example=Example.hosted, force=force)
    assert str(refused.value).startswith(
        f"{target / where}: is a symbolic link (to {leads}): init never writes through one; nothing was written."
    )
    _nothing_written(target, before)
    assert [p.name for p in elsewhere.iterdir()] == ["model_providers.yaml"]
    assert (elsewhere / "model_providers.yaml").read_text() == "mine\n"


@as_root
def test_a_file_of_another_user_where_init_writes_is_refused_even_with_force(tmp_path: Path) -> None:
    target = tmp_path / "run"
    target.mkdir()
    (target / "build.py").write_text("theirs\n")
    os.chown(target / "build.py", NOBODY, NOBODY)
    with pytest.raises(InitError, match=rf"^{target / 'build.py'}: belongs to nobody \(uid {NOBODY}\), not to you"):
        init_command(target, slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV, example=Example.hosted, force=True)
    assert (target / "build.py").read_text() == "theirs\n" and not (target / "run.yaml").exists()


@as_root
def test_a_link_of_another_user_on_the_way_is_refused(tmp_path: Path) -> None:
    """In a sticky directory a link's owner can point it elsewhere at any time: one on the way to ``--dir`` that is
    not the user's (or root's) is refused; the same link made by the user is followed."""
    sticky, mine = tmp_path / "tmp", tmp_path / "mine"
    sticky.mkdir(mode=0o755)
    sticky.chmod(0o1777)
    mine.mkdir()
    (sticky / "link").symlink_to(mine)
    os.lchown(sticky / "link", NOBODY, NOBODY)
    with pytest.raises(InitError, match=rf"{sticky / 'link'}: a symbolic link owned by nobody \(uid {NOBODY}\)"):
        init_command(sticky / "link" / "run", slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV)
    assert list(mine.iterdir()) == []
    os.lchown(sticky / "link", 0, 0)
    result = init_command(sticky / "link" / "run", slurm=Slurm(CannedSlurm(LOCAL)), python_env=VENV)
    assert result.run_file == sticky / "link" / "run" / "run.yaml" and (mine / "run" / "run.yaml").is_file()
