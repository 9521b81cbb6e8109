"""``ddslurm init``: a run file and a cluster profile filled in from the cluster itself, every field explained.

One ``sinfo -h -N`` (:func:`~ddslurm.launcher._cluster.read_cluster`) gives every node of every partition the
user can see, with its CPUs, memory and GRES. From that, a pure function (:func:`render_init`) picks the
partition for model servers (GPU nodes; the cluster's default partition first),
the GPUs of one of its nodes and the memory per GPU, and the partition for CPU-only jobs (the one with the most
nodes without GPUs), and writes the two YAML files as text with a comment on every field, so that a newcomer can
read them, edit them and submit. The run is named after the directory. With ``--example`` a starter recipe
(:mod:`~ddslurm.launcher._starter`) is written beside them, and the run file names it; on the embedded local
cluster the profile serves deployments with the vLLM stand-in. The directory must be the user's own, and nothing is
written through a symbolic link (:mod:`~ddslurm.launcher._init_dir`). Every text is loaded as ddslurm loads it before
anything is written; existing files are kept unless ``force``; and a failure writes nothing. The result lists the
commands to run next (:mod:`~ddslurm.launcher._init_steps`).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
from ddslurm.launcher._cluster import ClusterInfo, Partition, read_cluster
from ddslurm.launcher._example import Example
from ddslurm.launcher._init_dir import check_target, make_dir
from ddslurm.launcher._init_steps import Step, next_steps, shown, todo
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher._starter import (
    BUILD_SCRIPT,
    STARTER_FILES,
    Starter,
    hosted_provider,
    on_embedded_cluster,
    stand_in_executable,
)
from ddslurm.launcher.errors import InitError
from ddslurm.providers import ProvidersError, load_settings

RUN_FILE = "run.yaml"
PROFILE_FILE = "profile.yaml"
FILE_MODE = 0o644
DEFAULT_TIME_LIMIT_MIN = 60
DEFAULT_NAME = "my-run"
WORKSPACE = "ddslurm-work"
"""The profile's workspace, relative to the profile."""


@dataclass(frozen=True, slots=True)
class InitChoices:
    """What ``init`` chose for the profile, and why."""

    gpu_partition: Partition | None
    cpu_partition: Partition | None
    gpus_per_node: int
    memory_per_gpu: str | None
    time_limit: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InitFiles:
    run_yaml: str
    profile_yaml: str
    choices: InitChoices
    starter_files: dict[str, str] = field(default_factory=dict)
    """The starter's files: paths relative to the run file's directory, and their texts."""


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


def _memory_text(mb: int) -> str:
    """A Slurm size no larger than ``mb``: whole gigabytes when that loses little, else megabytes."""
    return f"{mb // 1024}G" if mb % 1024 == 0 or mb >= 16 * 1024 else f"{mb}M"


def _memory_shown(mb: int) -> str:
    return f"{mb / 1024:.1f}".rstrip("0").rstrip(".") + "G" if mb >= 1024 else f"{mb}M"


def choose(cluster: ClusterInfo) -> InitChoices:
    """The profile's partitions: for model servers, a partition with GPU nodes (the default partition first, then
    partitions of GPU nodes only, more GPUs per node, more GPU nodes); for CPU-only jobs, the partition with nodes
    without GPUs (partitions of CPU-only nodes first, then the default, then more such nodes)."""
    usable = [p for p in cluster.partitions if p.available] or list(cluster.partitions)
    notes: list[str] = []
    gpu_candidates = [p for p in usable if p.gpu_nodes > 0]
    gpu = min(
        gpu_candidates,
        key=lambda p: (not p.default, p.cpu_only_nodes > 0, -p.gpus, -p.gpu_nodes, p.name),
        default=None,
    )
    cpu_candidates = [p for p in usable if p.cpu_only_nodes > 0]
    cpu = min(
        cpu_candidates,
        key=lambda p: (p.gpu_nodes > 0, not p.default, -p.cpu_only_nodes, p.name),
        default=None,
    )
    if gpu is None and cpu is None and usable:  # cannot happen with nodes at all; keep a partition anyway
        cpu = cluster.default_partition or usable[0]
    if gpu is not None and gpu.max_gpus != gpu.gpus:
        notes.append(
            f"the GPU nodes of partition {gpu.name} have {gpu.gpus} to {gpu.max_gpus} GPUs; gpus_per_node is "
            f"{gpu.gpus}, what every one of them has"
        )
    others = [p.name for p in gpu_candidates if p is not gpu]
    if gpu is not None and others:
        notes.append(f"other partitions with GPUs: {', '.join(others)} (profile: partition, gpus_per_node)")
    if gpu is not None and cpu is None:
        notes.append(f"no partition has nodes without GPUs: CPU-only jobs run on partition {gpu.name}")
    memory_per_gpu = None
    if gpu is not None and gpu.gpus > 0 and gpu.gpu_memory_mb > 0:
        memory_per_gpu = _memory_text(gpu.gpu_memory_mb // gpu.gpus)
    unavailable = [p.name for p in cluster.partitions if not p.available]
    if unavailable:
        notes.append(f"not used, not up now: {', '.join(unavailable)}")
    limits = [m for m in ((gpu.time_limit_minutes if gpu else None), (cpu.time_limit_minutes if cpu else None)) if m]
    minutes = min([DEFAULT_TIME_LIMIT_MIN, *limits])
    time_limit = f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    return InitChoices(
        gpu_partition=gpu,
        cpu_partition=cpu,
        gpus_per_node=gpu.gpus if gpu is not None else 0,
        memory_per_gpu=memory_per_gpu,
        time_limit=time_limit,
        notes=tuple(notes),
    )


_PLAIN = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./-]*$")
_YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "y", "n"})


def yaml_str(value: str) -> str:
    """``value`` as a YAML scalar that reads back as exactly this string (plain when that is safe)."""
    if _PLAIN.match(value) and value.lower() not in _YAML_WORDS and not re.fullmatch(r"[-+.\d_eE:]+", value):
        return value
    return json.dumps(value)


def _gpu_text(p: Partition) -> str:
    if p.gpu_nodes == 0:
        return "0"
    count = str(p.gpus) if p.gpus == p.max_gpus else f"{p.gpus}-{p.max_gpus}"
    kind = f" {'/'.join(p.gpu_types)}" if p.gpu_types else ""
    part = "" if p.cpu_only_nodes == 0 else f" on {p.gpu_nodes} of {len(p.nodes)} nodes"
    return f"{count}{kind}{part}"


def _partition_table(cluster: ClusterInfo) -> list[str]:
    head = ("partition", "nodes", "CPUs/node", "memory/node", "GPUs/node", "time limit", "state")
    rows = [
        (
            p.name + ("*" if p.default else ""),
            str(len(p.nodes)),
            str(p.cpus),
            _memory_shown(p.memory_mb),
            _gpu_text(p),
            p.time_limit or "-",
            "up" if p.available else "not up",
        )
        for p in cluster.partitions
    ]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    return ["#   " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (head, *rows)]


def run_name(directory: Path) -> str:
    """A valid run name from a directory's name: other characters become ``-``; ``my-run`` when none is left."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", directory.absolute().name)
    text = re.sub(r"^[^A-Za-z0-9]+", "", text)[:64].rstrip("-.")
    return text or DEFAULT_NAME


def render_init(
    cluster: ClusterInfo,
    *,
    python_env: str,
    workspace: str = WORKSPACE,
    now: datetime | None = None,
    name: str = DEFAULT_NAME,
    starter: Starter | None = None,
    stand_in: str | None = None,
) -> InitFiles:
    """The run file and the cluster profile for ``cluster`` (pure): YAML text with a comment on every field; with
    ``starter``, its files too. ``stand_in``: the vLLM stand-in that serves deployments (the embedded cluster)."""
    if not cluster.partitions:
        raise InitError("sinfo lists no partition this user can use; nothing to write a profile for")
    choices = choose(cluster)
    if starter is not None and starter.deploys and choices.gpu_partition is None:
        raise InitError(
            f"--example {starter.example} serves a model on the job's GPUs, but sinfo shows no partition with GPUs; "
            "--example hosted runs on CPUs only. Nothing was written"
        )
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    return InitFiles(
        run_yaml=_run_yaml(choices, stamp, name, starter),
        profile_yaml=_profile_yaml(cluster, choices, python_env, workspace, stamp, stand_in),
        choices=choices,
        starter_files=starter.files() if starter is not None else {},
    )


def _vllm_lines(stand_in: str | None) -> list[str]:
    if stand_in is None:
        return [
            "# The vLLM command on the nodes (a path, or a name on the nodes' PATH).",
            "vllm_executable: vllm",
        ]
    return [
        "# The vLLM command on the nodes. This is the embedded local cluster (tools/local-slurm), whose fake GPUs",
        "# are served by the vLLM stand-in (same command line as `vllm serve`). On a real cluster: vllm, or a path.",
        f"vllm_executable: {yaml_str(stand_in)}",
    ]


def _profile_yaml(
    cluster: ClusterInfo, c: InitChoices, python_env: str, workspace: str, stamp: str, stand_in: str | None
) -> str:
    gpu, cpu = c.gpu_partition, c.cpu_partition
    name = cluster.name if cluster.name and re.fullmatch(r"[A-Za-z0-9._-]+", cluster.name) else "default"
    lines = [
        "# ddslurm cluster profile: what belongs to this cluster rather than to one run. Relative paths are relative",
        '# to this file. Every field: docs/run-files.md ("The cluster profile").',
        "# Check it with every default shown: ddslurm-config check profile.yaml --kind profile",
        f"# Written by `ddslurm init` on {stamp} from the partitions sinfo showed (* = the default partition):",
        *_partition_table(cluster),
        "",
        "# A name for this cluster.",
        f"name: {yaml_str(name)}",
        "",
        "# Where runs live (<workspace>/runs/<run_id>/). Must be a filesystem that every compute node mounts at the",
        "# same path as this machine (a home or project directory; not /tmp).",
        f"workspace: {yaml_str(workspace)}",
        "",
        "# The Python virtual environment the compute nodes run (<python_env>/bin/ddslurm-runtime), at the same path",
        "# on every node: the environment this `ddslurm init` ran in.",
        f"python_env: {yaml_str(python_env)}",
        "",
        "# The default --account of every job. Unset: your default account.",
        "# account: my-account",
        "",
    ]
    if gpu is not None:
        kinds = f" ({'/'.join(gpu.gpu_types)})" if gpu.gpu_types else ""
        lines += [
            "# Partition of runs that start model servers (deployments): its nodes have GPUs.",
            f"partition: {yaml_str(gpu.name)}",
            "",
            f"# GPUs on one node of `partition` (sinfo GRES: {gpu.gpus} x gpu{kinds}). Replicas that fit on a node",
            "# share one node (each takes tensor_parallel x pipeline_parallel x data_parallel GPUs); a replica",
            "# bigger than a node spans whole nodes, alone in its allocation.",
            f"gpus_per_node: {c.gpus_per_node}",
        ]
    else:
        lines += [
            "# Partition of runs that start model servers (deployments) on GPUs. sinfo shows no GPUs on this cluster,",
            "# so runs use hosted models only (no deployments); set both when GPU nodes are added.",
            "# partition: gpu",
            "# GPUs on one node of `partition`.",
            "gpus_per_node: 0",
        ]
    lines += [
        "",
        "# How jobs ask for GPUs: gres (--gres=gpu:N) or gpus (--gpus=N).",
        "gpu_request: gres",
        "",
    ]
    if c.memory_per_gpu is not None and gpu is not None:
        lines += [
            "# Host memory per GPU: a job with deployments asks --mem = its GPUs x this, unless the run file sets",
            f"# submission.memory (here: {gpu.gpu_memory_mb} MB per node / {gpu.gpus} GPUs).",
            f"memory_per_gpu: {yaml_str(c.memory_per_gpu)}",
        ]
    else:
        lines += [
            "# Host memory per GPU (--mem = GPUs x this when the run file sets no submission.memory).",
            "# memory_per_gpu: 64G",
        ]
    lines.append("")
    if cpu is not None:
        has = "has" if cpu.cpu_only_nodes == 1 else "have"
        only = (
            "its nodes have no GPU"
            if cpu.gpu_nodes == 0
            else f"{cpu.cpu_only_nodes} of its {len(cpu.nodes)} nodes {has} no GPU"
        )
        lines += [
            f"# Partition of hosted-only runs (CPUs only, --gres=none) and of collection jobs ({only}).",
            f"cpu_partition: {yaml_str(cpu.name)}",
        ]
    else:
        lines += [
            "# Partition of hosted-only runs (CPUs only, --gres=none) and of collection jobs. No partition has nodes",
            "# without GPUs, so these jobs use `partition`.",
            "# cpu_partition: cpu",
        ]
    lines += [
        "",
        "# How vLLM is started for deployments: none (vllm_executable, found on the nodes), pyxis or apptainer",
        "# (vllm_image).",
        "container_runtime: none",
        *_vllm_lines(stand_in),
        "# The vLLM image for pyxis or apptainer, and what to mount into it.",
        "# vllm_image: vllm/vllm-openai:latest",
        "container_mounts: []",
        "",
        '# #SBATCH lines added to every job on this cluster, verbatim (e.g. "--exclude=node13").',
        "extra_sbatch: []",
        "",
    ]
    return "\n".join(lines)


def _run_yaml(c: InitChoices, stamp: str, name: str, starter: Starter | None) -> str:
    gpu = c.gpu_partition
    if starter is not None:
        deployments = starter.deployment_lines(c.gpus_per_node)
    elif gpu is not None:
        fit = f"replicas x tensor_parallel <= {c.gpus_per_node} (gpus_per_node) on one node"
        deployments = [
            "# vLLM servers started inside each job, one entry per model alias of the recipe to serve on the job's",
            "# GPUs (aliases not listed here resolve to hosted providers; a run without deployments asks for CPUs",
            "# only).",
            "deployments: []",
            "# deployments:",
            "#   - model_alias: generator           # an alias the recipe's columns use",
            "#     model: Qwen/Qwen2.5-7B-Instruct   # what vLLM loads: a hub id, or a path the nodes can read",
            "#     replicas: 1                      # server processes behind the alias's one endpoint",
            f"#     tensor_parallel: 1               # GPUs per replica; {fit}",
            "#     # pipeline_parallel: 2           # more GPUs per replica (x tensor_parallel), across whole nodes",
            "#     # engine: sglang                 # vllm (the default) or sglang",
            "#     server:",
            "#       env_from: [HF_TOKEN]           # variables of your shell the servers get, by name (gated models)",
        ]
    else:
        deployments = [
            "# vLLM servers started inside each job, one entry per model alias to serve on GPUs. This cluster shows no",
            "# GPUs (see the profile), so every alias of the recipe resolves to a hosted provider.",
            "deployments: []",
        ]
    main = gpu if gpu is not None else c.cpu_partition
    partition = main.name if main is not None else "the profile's"
    used = [p for p in (gpu, c.cpu_partition) if p is not None]
    limits = ", ".join(f"{p.name} {p.time_limit or '?'}" for p in dict.fromkeys(used)) or "unknown"
    cpu = c.cpu_partition.name if c.cpu_partition is not None else partition
    lines = [
        "# ddslurm run file: what one run generates and how its jobs are sized. It names no providers and no API keys:",
        "# hosted models resolve through Data Designer's own settings (model_providers.yaml in $DATA_DESIGNER_HOME,",
        "# else ~/.data-designer). Every field: docs/run-files.md. Check it: ddslurm-config check run.yaml --kind run",
        f"# Written by `ddslurm init` on {stamp}.",
        "",
        "# Letters, digits, '.', '_', '-': prefixes the run id (<name>-<date>-<time>-<random>).",
        f"name: {yaml_str(name)}",
        "",
        "# The Data Designer config to generate, relative to this file: a YAML or JSON file as",
        "# DataDesignerConfigBuilder.write_config writes it; or a builder script, build.py, whose",
        "# load_config_builder() returns the builder (as for `data-designer create build.py`); or build.py:FUNCTION",
        "# or package.module:FUNCTION.",
        f"recipe: {BUILD_SCRIPT if starter is not None else 'recipe.yaml'}",
        "",
        "# Records in the final dataset, and the contiguous ranges they are split into: one Slurm array task each.",
        f"num_records: {20 if starter is not None else 100}",
        f"shards: {2 if starter is not None else 1}",
        "",
        "# At most this many shards run at once (the array's %N); null: as many as Slurm starts.",
        "max_concurrent: null",
        "",
        "# Records per Data Designer batch (one Parquet file each); a rerun resumes from finished batches, so a",
        "# cancel or a time limit loses at most the batch in progress. null: the planner chooses (each shard saves",
        "# its work at least 5 times and at least every 5 minutes of its predicted generation).",
        "buffer_size: null",
        "# How a new attempt of a shard reuses an earlier attempt's batches: never, always or if_possible.",
        "resume: if_possible",
        "",
        "# Retry arrays submitted with the run for shards that failed (0-10), and reruns of a failed generation step",
        "# inside its allocation, servers kept (0-10).",
        "retries: 0",
        "client_retries: 1",
        "",
        "# Empty or null answers each LLM column of a shard may hold before the shard fails (null: not checked).",
        "max_empty_outputs: 0",
        "",
        *deployments,
        "",
        "# Scheduler settings of the generation jobs. Unset fields come from the profile.",
        "submission:",
        "  # --time of each array task (HH:MM:SS, D-HH:MM:SS or minutes). sinfo's limits: " + limits + ".",
        f"  time_limit: {json.dumps(c.time_limit)}",
        "  # CPUs of the Data Designer client; the servers' and proxies' CPUs are added for runs with deployments.",
        "  cpus: 2",
        "  # --mem per node. Unset: the profile's memory_per_gpu x GPUs for runs with deployments, else the site's",
        "  # default.",
        "  # memory: 8G",
        f"  # partition: {partition}       # unset: the profile's partition; hosted-only runs: its cpu_partition",
        "  # account: my-account",
        "  # qos: normal",
        "  # constraint: a100",
        "  # reservation: my-reservation",
        "  extra_sbatch: []                  # #SBATCH lines added verbatim",
        "",
        "# The job that merges the shards' results into one Parquet dataset (CPUs only).",
        "collection:",
        f"  # partition: {cpu}       # unset: the profile's cpu_partition",
        '  time_limit: "00:30:00"',
        "  cpus: 1",
        "  # memory: 4G",
        "",
    ]
    return "\n".join(lines)


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
    (:func:`~ddslurm.launcher._init_dir.check_target`: the user's own, nothing written through a link), existing
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
    where a file goes), the cluster cannot be read, a file exists (without ``force``) or the texts would not load.
    ``program`` and ``cwd``: how the printed commands run ddslurm, and where they are run from."""
    target = target_dir.absolute()
    here = (cwd if cwd is not None else Path.cwd()).absolute()
    env_dir = (python_env if python_env is not None else Path(sys.prefix)).absolute()
    problem = path_problem(str(target / WORKSPACE))
    if problem is not None:
        raise InitError(f"--dir {target}: the profile's workspace would be {target / WORKSPACE}: {problem}")
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
