"""The texts ``ddslurm init`` writes (:func:`render_init`, pure): the cluster profile and the run file as YAML with a
comment on every field, the partitions sinfo showed as a table in the profile, and a starter's files."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ddslurm.launcher.cluster._cluster import ClusterInfo, Partition
from ddslurm.launcher.errors import InitError
from ddslurm.launcher.init._choices import InitChoices, choose
from ddslurm.launcher.init._starter import BUILD_SCRIPT, Starter

DEFAULT_NAME = "my-run"
WORKSPACE = "ddslurm-work"
"""The profile's workspace, relative to the profile."""


@dataclass(frozen=True, slots=True)
class InitFiles:
    run_yaml: str
    profile_yaml: str
    choices: InitChoices
    starter_files: dict[str, str] = field(default_factory=dict)
    """The starter's files: paths relative to the run file's directory, and their texts."""


def _memory_shown(mb: int) -> str:
    return f"{mb / 1024:.1f}".rstrip("0").rstrip(".") + "G" if mb >= 1024 else f"{mb}M"


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
