"""``ddslurm init``: a run file and a cluster profile filled in from the cluster itself, every field explained.

One ``sinfo -h -N`` (:func:`~ddslurm.launcher.cluster._cluster.read_cluster`) gives every node of every partition the
user can see, with its CPUs, memory and GRES. From that, a pure function
(:func:`~ddslurm.launcher.init._render.render_init`) picks the partition for model servers (GPU nodes; the cluster's
default partition first), the GPUs of one of its nodes and the memory per GPU, and the partition for CPU-only jobs (the
one with the most nodes without GPUs) (:mod:`~ddslurm.launcher.init._choices`), and writes the two YAML files as text
with a comment on every field, so that a newcomer can read them, edit them and submit. The run is named after the
directory. With ``--example`` a starter recipe (:mod:`~ddslurm.launcher.init._starter`) is written beside them, and the
run file names it; on the embedded local cluster the profile serves deployments with the vLLM stand-in. The directory
must be the user's own, and nothing is written through a symbolic link (:mod:`~ddslurm.launcher.init._dir`). Every text
is loaded as ddslurm loads it before anything is written; existing files are kept unless ``force``; and a failure
writes nothing. The result lists the commands to run next (:mod:`~ddslurm.launcher.init._steps`).
"""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ddslurm.config import (
    ConfigError,
    atomic_write,
    load_profile,
    load_run_file,
    path_problem,
    publish_once,
    read_regular,
)
from ddslurm.launcher.cluster._cluster import ClusterInfo, read_cluster
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import InitError
from ddslurm.launcher.init._choices import InitChoices
from ddslurm.launcher.init._dir import check_target, make_dir
from ddslurm.launcher.init._example import Example
from ddslurm.launcher.init._render import DEFAULT_NAME, WORKSPACE, InitFiles, render_init
from ddslurm.launcher.init._starter import (
    STARTER_FILES,
    Starter,
    hosted_provider,
    on_embedded_cluster,
    port_problem,
    stand_in_executable,
)
from ddslurm.launcher.init._steps import Step, next_steps, shown, todo
from ddslurm.providers import ProvidersError, load_settings

RUN_FILE = "run.yaml"
PROFILE_FILE = "profile.yaml"
FILE_MODE = 0o644


@dataclass(frozen=True, slots=True)
class InitResult:
    """What ``ddslurm init`` wrote, and a summary for the terminal (``lines``) or ``--json`` (``as_dict``)."""

    run_file: Path
    profile: Path
    cluster: ClusterInfo
    choices: InitChoices
    overwritten: tuple[Path, ...] = field(default=())
    name: str = DEFAULT_NAME
    starter: Starter | None = None
    embedded: bool = False
    """The cluster is the embedded local one (``tools/local-slurm``): deployments use the vLLM stand-in."""
    written: tuple[Path, ...] = ()
    """Every file written (the run file, the profile, the starter's files)."""
    steps: tuple[Step, ...] = ()
    todo: str | None = None
    """What to do by hand before the steps (write the recipe), None when nothing."""
    cwd: Path = field(default_factory=Path.cwd)

    def as_dict(self) -> dict[str, Any]:
        gpu, cpu = self.choices.gpu_partition, self.choices.cpu_partition
        hosted = self.starter.hosted if self.starter is not None else None
        return {
            "run_file": str(self.run_file),
            "profile": str(self.profile),
            "name": self.name,
            "example": self.starter.example if self.starter is not None else None,
            "embedded": self.embedded,
            "files": [str(p) for p in self.written],
            "overwritten": [str(p) for p in self.overwritten],
            "hosted": None
            if hosted is None
            else {"endpoint": hosted.endpoint, "api_key_env": hosted.api_key_env, "port": hosted.port},
            "cluster": self.cluster.name or None,
            "partition": gpu.name if gpu else None,
            "cpu_partition": cpu.name if cpu else None,
            "gpus_per_node": self.choices.gpus_per_node,
            "memory_per_gpu": self.choices.memory_per_gpu,
            "partitions": [
                {
                    "name": p.name,
                    "default": p.default,
                    "available": p.available,
                    "nodes": len(p.nodes),
                    "gpu_nodes": p.gpu_nodes,
                    "gpus_per_node": p.gpus,
                    "gpu_types": list(p.gpu_types),
                    "cpus_per_node": p.cpus,
                    "memory_per_node_mb": p.memory_mb,
                    "time_limit": p.time_limit,
                }
                for p in self.cluster.partitions
            ],
            "notes": list(self.choices.notes),
            "todo": self.todo,
            "next": [step.as_dict() for step in self.steps],
        }

    def lines(self) -> list[str]:
        gpu, cpu = self.choices.gpu_partition, self.choices.cpu_partition
        files = [shown(p, self.cwd) for p in self.written]
        out = [f"wrote {', '.join(files[:-1])} and {files[-1]} (run name {self.name})"]
        if gpu is not None:
            out.append(
                f"  model servers (deployments): partition {gpu.name}, {self.choices.gpus_per_node} GPU(s) per node"
                + (f", memory_per_gpu {self.choices.memory_per_gpu}" if self.choices.memory_per_gpu else "")
            )
        else:
            out.append("  no GPU partition: runs use hosted models only (no deployments)")
        if cpu is not None:
            out.append(f"  hosted-only and collection jobs: partition {cpu.name}")
        if self.embedded:
            out.append("  the embedded local cluster (tools/local-slurm): deployments are served by the vLLM stand-in")
        out += [f"  note: {note}" for note in self.choices.notes]
        if self.todo is not None:
            out.append(f"next: {self.todo}; then, in one shell:")
        else:
            out.append("next, in one shell:")
        for step in self.steps:
            out += [f"  # {step.comment}", f"  {step.command}"]
        return out


def run_name(directory: Path) -> str:
    """A valid run name from a directory's name: other characters become ``-``; ``my-run`` when none is left."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", directory.absolute().name)
    text = re.sub(r"^[^A-Za-z0-9]+", "", text)[:64].rstrip("-.")
    return text or DEFAULT_NAME


def _check_loads(files: InitFiles) -> None:
    """Every text loads as ddslurm loads it (the starter's script compiles), before anything is written."""
    with tempfile.TemporaryDirectory(prefix="ddslurm-init-") as scratch:
        root = Path(scratch)
        texts = {RUN_FILE: files.run_yaml, PROFILE_FILE: files.profile_yaml, **files.starter_files}
        for relative, text in texts.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text, encoding="utf-8")
        try:
            load_run_file(root / RUN_FILE)
            load_profile(root / PROFILE_FILE)
            for relative in files.starter_files:
                if relative.endswith(".py"):
                    compile(files.starter_files[relative], relative, "exec")
                else:
                    load_settings((root / relative).parent)
        except (ConfigError, ProvidersError, SyntaxError) as exc:
            raise InitError(f"the files init wrote do not load (a bug in ddslurm init): {exc}") from exc


def write_files(target: Path, files: dict[str, bytes], *, force: bool) -> tuple[Path, ...]:
    """Write every file (names relative to ``target``, the ``--dir``), or none: the directory is judged first
    (:func:`~ddslurm.launcher.init._dir.check_target`: the user's own, nothing written through a link), existing
    files are refused unless ``force`` (which replaces them), missing directories are made owner-only, and a
    failure part-way removes (or restores) what this call wrote. Returns the files that were replaced."""
    checked = check_target(target, list(files))
    if checked.existing and not force:
        names = ", ".join(str(target / p) for p in checked.existing)
        raise InitError(f"{names} already exist(s); nothing was written (--force replaces them)")
    created: list[Path] = []
    done: list[tuple[Path, bytes | None]] = []
    try:
        for directory in checked.create:
            make_dir(directory)
            created.append(directory)
        for relative, data in files.items():
            path = checked.real / relative
            old = read_regular(path) if relative in checked.existing else None
            if old is not None:
                atomic_write(path, data, mode=FILE_MODE)
            elif not publish_once(path, data, mode=FILE_MODE):
                raise InitError(f"{target / relative} appeared while init was writing; nothing was written")
            done.append((path, old))
    except BaseException:
        for path, old in reversed(done):
            with contextlib.suppress(OSError):
                if old is None:
                    path.unlink()
                else:
                    atomic_write(path, old, mode=FILE_MODE)
        for d in reversed(created):  # a directory after those inside it
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    return tuple(target / p for p in checked.existing)


def init_command(
    target_dir: Path,
    *,
    slurm: Slurm,
    force: bool = False,
    python_env: Path | None = None,
    now: datetime | None = None,
    example: Example | None = None,
    port: int | None = None,
    program: str = "ddslurm",
    cwd: Path | None = None,
) -> InitResult:
    """``ddslurm init [--dir D] [--example hosted|mixed] [--force]``: read the cluster (one ``sinfo``, and
    ``scontrol show config`` for its name and whether it is the embedded one), write ``D/run.yaml`` and
    ``D/profile.yaml`` (``python_env``: the environment running this, by default), and with ``example`` the
    starter's files (its stand-in, on the embedded cluster, on ``port``: a free one by default). Nothing is written
    when ``D`` is not the user's own (another user can change it or a directory on the way to it, or a link stands
    where a file goes), the cluster cannot be read, a file exists (without ``force``) or the texts would not load;
    nor when ``port`` is given without ``example``, is not one the stand-in could listen on now (out of range,
    taken, privileged: :func:`port_problem`) or the cluster is not the embedded one (no stand-in to place).
    ``program`` and ``cwd``: how the printed commands run ddslurm, and where they are run from."""
    target = target_dir.absolute()
    here = (cwd if cwd is not None else Path.cwd()).absolute()
    env_dir = (python_env if python_env is not None else Path(sys.prefix)).absolute()
    problem = path_problem(str(target / WORKSPACE))
    if problem is not None:
        raise InitError(f"--dir {target}: the profile's workspace would be {target / WORKSPACE}: {problem}")
    if port is not None and example is None:
        raise InitError(f"--port {port} is the port of the starter's stand-in: give --example too")
    problem = port_problem(port) if port is not None else None  # before the cluster is asked anything
    if problem is not None:
        raise InitError(f"--port {port}: {problem}; choose another, or leave --port out for a free one")
    run_path, profile_path = target / RUN_FILE, target / PROFILE_FILE
    extra = list(STARTER_FILES) if example is not None else []
    checked = check_target(target, [RUN_FILE, PROFILE_FILE, *extra])  # before asking the cluster anything
    if checked.existing and not force:
        names = ", ".join(str(target / p) for p in checked.existing)
        raise InitError(f"{names} already exist(s); nothing was written (--force replaces them)")
    cluster = read_cluster(slurm)
    embedded = on_embedded_cluster(slurm)
    stand_in = stand_in_executable(env_dir) if embedded else None
    starter = Starter(example, hosted_provider(embedded, port)) if example is not None else None
    name = run_name(target)
    files = render_init(
        cluster, python_env=str(env_dir), now=now, name=name, starter=starter,
        stand_in=str(stand_in) if stand_in is not None else None,
    )  # fmt: skip
    _check_loads(files)
    texts = {RUN_FILE: files.run_yaml, PROFILE_FILE: files.profile_yaml, **files.starter_files}
    replaced = write_files(target, {relative: text.encode() for relative, text in texts.items()}, force=force)
    return InitResult(
        run_path,
        profile_path,
        cluster,
        files.choices,
        replaced,
        name=name,
        starter=starter,
        embedded=embedded,
        written=tuple(target / relative for relative in texts),
        steps=tuple(next_steps(run_path, profile_path, starter, program=program, cwd=here)),
        todo=todo(run_path, starter, program=program, cwd=here),
        cwd=here,
    )
