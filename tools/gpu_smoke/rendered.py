"""The command lines ddslurm renders for ``vllm serve``, over deployments that between them use every form it
knows (:data:`SHAPES`), rendered by ddslurm's own :func:`~ddslurm.runtime._server_command.vllm_serve_args`: the
flag check compares what ddslurm would really send, never a list kept here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ddslurm.config import DeploymentPlan, ReplicaPlan
from ddslurm.runtime._listeners import unix_url
from ddslurm.runtime._server_command import RankPlace, vllm_serve_args

SOCKET = unix_url(Path("/tmp/ddslurm-smoke/generator-0.sock"))
TCP = "http://127.0.0.1:8100"


def deployment(model: str = "smoke/model", **kw: object) -> DeploymentPlan:
    """A vLLM deployment of one replica (``kw``: the parallel sizes, ``extra_args``...)."""
    fields: dict[str, object] = {
        "alias": "generator",
        "model": model,
        "served_model_name": "smoke",
        "tensor_parallel": 1,
        "replicas": (ReplicaPlan(index=0, gpus=1, cpus=1),),
        "startup_timeout": 600,
        "proxy": True,
        "listen": "unix",
    }
    return DeploymentPlan(**{**fields, **kw})  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Shape:
    """One form of ``vllm serve`` ddslurm renders: a deployment, where it listens, and its node rank's place."""

    name: str
    dep: DeploymentPlan
    listen: str
    place: RankPlace | None = None


_LEADER = RankPlace(node_rank=0, nodes=2, address="10.0.0.1", port="29500")
_FOLLOWER = RankPlace(node_rank=1, nodes=2, address="10.0.0.1", port="29500")

SHAPES: tuple[Shape, ...] = (
    Shape("one node, --uds", deployment(), SOCKET),
    Shape("one node, loopback TCP (server.port)", deployment(listen="tcp"), TCP),
    Shape("tensor parallel", deployment(tensor_parallel=4), SOCKET),
    Shape("pipeline parallel", deployment(tensor_parallel=2, pipeline_parallel=2), SOCKET),
    Shape("data parallel", deployment(data_parallel=2), SOCKET),
    Shape("expert parallel", deployment(tensor_parallel=2, data_parallel=2, expert_parallel=True), SOCKET),
    Shape("TP x PP over nodes, leader", deployment(tensor_parallel=8, pipeline_parallel=2), SOCKET, _LEADER),
    Shape("TP x PP over nodes, follower", deployment(tensor_parallel=8, pipeline_parallel=2), SOCKET, _FOLLOWER),
    Shape("data parallel over nodes, leader", deployment(tensor_parallel=8, data_parallel=2), SOCKET, _LEADER),
    Shape("data parallel over nodes, follower", deployment(tensor_parallel=8, data_parallel=2), SOCKET, _FOLLOWER),
)
"""Every form :func:`vllm_serve_args` has: one node on a socket or a port, TP, PP, DP, expert parallel, and a
replica over nodes (pipeline or data parallel), its leader and a follower."""


def rendered(shapes: tuple[Shape, ...] = SHAPES) -> Iterator[tuple[Shape, list[str]]]:
    """Each shape and the arguments ddslurm gives ``vllm`` for it (``serve MODEL ...``)."""
    for shape in shapes:
        yield shape, vllm_serve_args(shape.dep, shape.listen, shape.place)
