"""What ``ddslurm init`` chooses from the cluster it read: the partition for model servers, the GPUs of one of its
nodes and the memory per GPU, the partition for CPU-only jobs and the time limit (:func:`choose`, pure)."""

from __future__ import annotations

from dataclasses import dataclass

from ddslurm.launcher.cluster._cluster import ClusterInfo, Partition

DEFAULT_TIME_LIMIT_MIN = 60


@dataclass(frozen=True, slots=True)
class InitChoices:
    """What ``init`` chose for the profile, and why."""

    gpu_partition: Partition | None
    cpu_partition: Partition | None
    gpus_per_node: int
    memory_per_gpu: str | None
    time_limit: str
    notes: tuple[str, ...] = ()


def _memory_text(mb: int) -> str:
    """A Slurm size no larger than ``mb``: whole gigabytes when that loses little, else megabytes."""
    return f"{mb // 1024}G" if mb % 1024 == 0 or mb >= 16 * 1024 else f"{mb}M"


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
