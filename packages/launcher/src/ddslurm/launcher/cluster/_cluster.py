"""The cluster as ``ddslurm init`` and ``ddslurm doctor`` see it: its partitions, from one ``sinfo -h -N``.

Every node of every partition the user can see, with its CPUs, memory and GRES (:func:`parse_sinfo`), summarised
per partition (:func:`cluster_from_rows`: the smallest node is what any job may count on) and kept node by node
(:meth:`ClusterInfo.fitting`: the nodes of a partition one job's request fits on); :func:`read_cluster` asks the
scheduler (through :class:`~ddslurm.launcher.cluster._slurm.Slurm`: argument vector, injected runner, timeout).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import SlurmError
from ddslurm.planner import PlanError, parse_time_limit

SINFO_FORMAT = "%N|%P|%c|%m|%G|%a|%l"
"""Node, partition (``*`` marks the default), CPUs, memory (MB), GRES, availability, time limit."""
_GPU = re.compile(r"(?:^|,)\s*gpu(?::(?P<type>[^:(),\s]+))?:(?P<count>\d+)")
_LEADING_INT = re.compile(r"^\s*(\d+)")
_UNLIMITED = frozenset({"infinite", "unlimited", "n/a", "none", ""})


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One line of ``sinfo -h -N``: a node in one partition."""

    node: str
    partition: str
    default: bool
    cpus: int
    memory_mb: int
    gpus: int
    gpu_types: tuple[str, ...]
    available: str
    time_limit: str


@dataclass(frozen=True, slots=True)
class Partition:
    """A partition as ``init`` sees it: its nodes and the smallest of them (what any job may count on)."""

    name: str
    default: bool
    available: bool
    nodes: tuple[str, ...]
    cpus: int
    """CPUs of its smallest node."""
    memory_mb: int
    """Memory of its smallest node (MB)."""
    gpu_nodes: int
    """Nodes with at least one GPU."""
    gpus: int
    """GPUs of its GPU node with the fewest (0 without GPU nodes): what a job can count on getting on one node."""
    max_gpus: int
    gpu_types: tuple[str, ...]
    gpu_memory_mb: int
    """Memory of its smallest GPU node (MB); 0 without GPU nodes."""
    time_limit: str

    @property
    def cpu_only_nodes(self) -> int:
        return len(self.nodes) - self.gpu_nodes

    @property
    def time_limit_minutes(self) -> int | None:
        """The partition's time limit in minutes; None when it has none."""
        if self.time_limit.strip().lower() in _UNLIMITED:
            return None
        try:
            return parse_time_limit(self.time_limit.strip())
        except PlanError:
            return None


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    partitions: tuple[Partition, ...]
    name: str = ""
    """The cluster's name (``ClusterName``), "" when unknown."""
    nodes: tuple[NodeRow, ...] = ()
    """Every line sinfo printed: each node in each of its partitions."""

    @property
    def default_partition(self) -> Partition | None:
        return next((p for p in self.partitions if p.default), None)

    def partition(self, name: str) -> Partition | None:
        return next((p for p in self.partitions if p.name == name), None)

    def fitting(self, partition: str, *, cpus: int = 0, memory_mb: int = 0, gpus: int = 0) -> list[NodeRow]:
        """The nodes of ``partition`` that have at least ``cpus`` CPUs, ``memory_mb`` MB and ``gpus`` GPUs, all
        three on the same node (what one job of one node can be given)."""
        return [
            n
            for n in self.nodes
            if n.partition == partition and n.cpus >= cpus and n.memory_mb >= memory_mb and n.gpus >= gpus
        ]


def parse_gres(gres: str) -> tuple[int, tuple[str, ...]]:
    """GPUs in a node's GRES as sinfo prints it, and their types: ``gpu:4`` (4), ``gpu:a100:8(S:0-1)``
    (8, a100), ``gpu:a100:2,gpu:v100:2,shard:8`` (4, a100 and v100), ``(null)`` (0)."""
    count, types = 0, []
    for match in _GPU.finditer(gres.strip()):
        count += int(match.group("count"))
        if match.group("type") and match.group("type") not in types:
            types.append(match.group("type"))
    return count, tuple(types)


def _int(text: str) -> int:
    match = _LEADING_INT.match(text)
    return int(match.group(1)) if match else 0


def parse_sinfo(text: str) -> list[NodeRow]:
    """The lines of ``sinfo -h -N -o`` :data:`SINFO_FORMAT`; malformed lines are skipped."""
    rows: list[NodeRow] = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7 or not parts[0] or not parts[1]:
            continue
        node, partition, cpus, memory, gres, available, time_limit = (p.strip() for p in parts)
        gpus, types = parse_gres(gres)
        rows.append(
            NodeRow(
                node=node,
                partition=partition.rstrip("*"),
                default=partition.endswith("*"),
                cpus=_int(cpus),
                memory_mb=_int(memory),
                gpus=gpus,
                gpu_types=types,
                available=available.lower(),
                time_limit=time_limit,
            )
        )
    return rows


def cluster_from_rows(rows: Iterable[NodeRow], name: str = "") -> ClusterInfo:
    """Partitions in the order sinfo lists them, each summarised from its nodes."""
    rows = list(rows)
    by_partition: dict[str, list[NodeRow]] = {}
    for row in rows:
        by_partition.setdefault(row.partition, []).append(row)
    partitions = []
    for part, nodes in by_partition.items():
        gpu_nodes = [n for n in nodes if n.gpus > 0]
        types: list[str] = []
        for n in gpu_nodes:
            types += [t for t in n.gpu_types if t not in types]
        partitions.append(
            Partition(
                name=part,
                default=any(n.default for n in nodes),
                available=all(n.available == "up" for n in nodes),
                nodes=tuple(dict.fromkeys(n.node for n in nodes)),
                cpus=min(n.cpus for n in nodes),
                memory_mb=min(n.memory_mb for n in nodes),
                gpu_nodes=len({n.node for n in gpu_nodes}),
                gpus=min((n.gpus for n in gpu_nodes), default=0),
                max_gpus=max((n.gpus for n in gpu_nodes), default=0),
                gpu_types=tuple(types),
                gpu_memory_mb=min((n.memory_mb for n in gpu_nodes), default=0),
                time_limit=nodes[0].time_limit,
            )
        )
    return ClusterInfo(partitions=tuple(partitions), name=name, nodes=tuple(rows))


def read_cluster(slurm: Slurm) -> ClusterInfo:
    """The partitions this user can see, from one ``sinfo``, and the cluster's name when ``scontrol`` says it."""
    rows = parse_sinfo(slurm.sinfo_nodes(SINFO_FORMAT))
    name = ""
    with contextlib.suppress(SlurmError):
        name = slurm.config().cluster_name
    return cluster_from_rows(rows, name)
