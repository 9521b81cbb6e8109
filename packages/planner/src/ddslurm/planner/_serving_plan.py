"""The plan's serving: each deployment's replicas placed on the allocation's nodes (on one node, or one replica
across whole nodes), their capacity from the engine's flags, or a PlanError saying which numbers disagree."""

from __future__ import annotations

from collections.abc import Sequence

from ddslurm.config import ClusterProfile, Deployment, DeploymentPlan, Engine, ReplicaPlan, RunFile, ServingPlan
from ddslurm.planner.errors import PlanError

VLLM_DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's ``max_num_seqs`` when ``--max-num-seqs`` is not given: what one replica runs at once (the rest queue).

Source: ``EngineArgs._set_default_args`` in ``vllm/engine/arg_utils.py`` of vllm-project/vllm (the 0.11 series,
commit 99d7eb5d6a51): for ``UsageContext.OPENAI_API_SERVER`` (``vllm serve``) ``default_max_num_seqs`` is 256 on
GPUs, raised to 1024 on GPUs with at least 70 GiB that are not A100s ("For GPUs like H100 and MI300x"), and
128 x world size on CPUs; ``SchedulerConfig``'s own fallback (128) applies only outside these usage contexts.

The submit host cannot tell which GPUs a node has, so the planner takes the general GPU value, 256. On a larger
GPU the client then keeps 256 requests per replica in flight where the server would run 1024 (set
``--max-num-seqs`` in ``server.extra_args`` to use them); it never sends more than the server runs, so no request
waits in vLLM's queue while Data Designer's per-request timeout runs."""


CAPACITY_FLAGS: dict[Engine, str] = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}
"""The flag that sets the sequences one engine rank runs at once. SGLang sizes its own from the GPUs' memory when
the flag is not given; the submit host cannot know it, so ddslurm assumes :data:`VLLM_DEFAULT_MAX_NUM_SEQS` for
both engines unless the flag is in ``server.extra_args``."""


def server_capacity(extra_args: tuple[str, ...], field: str = "server.extra_args", engine: Engine = "vllm") -> int:
    """Sequences one engine rank runs at once: the last ``--max-num-seqs N`` or ``--max-num-seqs=N`` (vLLM; its
    parser also takes ``--max_num_seqs``), or ``--max-running-requests`` (SGLang), in ``extra_args`` (the last one
    wins, as in argparse), else :data:`VLLM_DEFAULT_MAX_NUM_SEQS`. ``field`` names the setting in error
    messages."""
    flag = CAPACITY_FLAGS[engine]
    capacity = VLLM_DEFAULT_MAX_NUM_SEQS
    for index, token in enumerate(extra_args):
        name, inline, value = token.partition("=")
        if (name.replace("_", "-") if engine == "vllm" else name) != flag:
            continue
        if not inline:
            value = extra_args[index + 1] if index + 1 < len(extra_args) else ""
        try:
            capacity = int(value)
        except ValueError:
            capacity = 0
        if capacity < 1:
            raise PlanError(f"{field}: {name} needs a whole number of at least 1, got {value!r}")
    return capacity


def _shape(dep: Deployment) -> str:
    """``tensor_parallel 4 x pipeline_parallel 2 = 8 GPUs`` (the factors that are not 1, tensor parallel always)."""
    factors = [f"tensor_parallel {dep.tensor_parallel}"]
    factors += [f"pipeline_parallel {dep.pipeline_parallel}"] * (dep.pipeline_parallel > 1)
    factors += [f"data_parallel {dep.data_parallel}"] * (dep.data_parallel > 1)
    gpus = dep.tensor_parallel * dep.pipeline_parallel * dep.data_parallel
    return f"{' x '.join(factors)} = {gpus} GPU{'s' if gpus > 1 else ''}"


def _replica_nodes(run: RunFile, index: int, per_node: int) -> int:
    """The nodes one replica of ``run.deployments[index]`` spans (1: it fits on a node), or PlanError with the
    numbers when its shape cannot be placed on whole nodes."""
    dep = run.deployments[index]
    tp, pp, dp = dep.tensor_parallel, dep.pipeline_parallel, dep.data_parallel
    where, alias = f"deployments[{index}]", f"(model alias {dep.model_alias!r})"
    if tp > per_node:
        raise PlanError(
            f"{where}.tensor_parallel: {tp} is more than the {per_node} GPUs of one node {alias}; tensor parallel "
            "never crosses a node: use pipeline_parallel or data_parallel for a replica bigger than a node"
        )
    if per_node % tp:
        raise PlanError(f"{where}.tensor_parallel: {tp} does not divide the {per_node} GPUs of a node {alias}")
    gpus = tp * pp * dp
    if dep.expert_parallel and gpus == 1:
        raise PlanError(
            f"{where}.expert_parallel: true, but one replica has 1 GPU ({_shape(dep)}) {alias}; expert parallel "
            "shards the experts over a replica's GPUs: set tensor_parallel or data_parallel above 1, or remove it"
        )
    if gpus <= per_node:
        return 1
    if gpus % per_node:
        raise PlanError(
            f"{where}: one replica needs {_shape(dep)}, more than the {per_node} GPUs of a node and not a whole "
            f"number of nodes ({gpus} / {per_node} = {gpus / per_node:.2f}) {alias}; a replica bigger than a node "
            f"spans whole nodes: make its GPUs a multiple of {per_node}"
        )
    nodes = gpus // per_node
    if dp > 1 and pp > 1:
        raise PlanError(
            f"{where}.data_parallel: {dp} with pipeline_parallel {pp} in a replica that spans {nodes} nodes "
            f"({_shape(dep)}, {per_node} a node) {alias}; a replica across nodes is either pipeline parallel or "
            "data parallel: set one of them to 1"
        )
    if dp > 1 and dep.engine == "sglang":
        raise PlanError(
            f"{where}.data_parallel: {dp} in an SGLang replica that spans {nodes} nodes ({_shape(dep)}, {per_node} "
            f"a node) {alias}; SGLang runs data parallel across nodes only with DP attention (--enable-dp-attention), "
            "where its ranks split one tensor-parallel group instead of each holding tensor_parallel GPUs. Use "
            "pipeline_parallel to span nodes, data_parallel within one node, or engine: vllm"
        )
    # Each node runs data_parallel / nodes ranks of tensor_parallel GPUs, a whole number: tensor_parallel divides
    # the node's GPUs, so data_parallel = (gpus_per_node / tensor_parallel) x nodes.
    if declared_replicas(dep) > 1:
        field, alone = f"{where}.replicas", f"it has replicas: {dep.replicas}"
    elif len(run.deployments) > 1:
        others = ", ".join(repr(d.model_alias) for i, d in enumerate(run.deployments) if i != index)
        field, alone = "deployments", f"the run also deploys {others}"
    else:
        return nodes
    raise PlanError(
        f"{field}: a replica of {dep.model_alias!r} spans "
        f"{nodes} nodes ({_shape(dep)}, {per_node} a node), so it must be the allocation's only replica, but "
        f"{alone}. Every endpoint and every replica's API is served from the allocation's first node, on "
        "sockets and loopback ports no other user can reach; a replica whose API ran on another node would "
        "need a listener other users could reach first. Use allocations: K to run K such replicas (one an "
        "allocation, each pulling shards), or data_parallel to run several engine ranks behind one API, and "
        "serve the other models in their own run"
    )


def declared_replicas(dep: Deployment) -> int:
    """The replicas per allocation a deployment asks for: its number, or 1 for ``replicas: auto``."""
    return 1 if dep.replicas == "auto" else dep.replicas


def plan_serving(
    run: RunFile, profile: ClusterProfile, partition: str | None, counts: Sequence[int] | None = None
) -> ServingPlan:
    """Place the replicas on the allocation's nodes, or say which numbers disagree. ``counts``: each
    deployment's replicas per allocation as the layout chose them (None: as declared, ``auto`` 1).

    A replica of ``tensor_parallel x pipeline_parallel x data_parallel`` GPUs that fits on a node gets one step of
    that many GPUs, and all such replicas of the run share the allocation's one node. A bigger replica spans
    ``GPUs / gpus_per_node`` whole nodes, one step of all the node's GPUs on each, and is the allocation's only
    replica (its API, like every endpoint, on the first node)."""
    per_node = profile.gpus_per_node
    if per_node == 0:
        raise PlanError(
            "profile.gpus_per_node: 0, but the run deploys models (deployments); set the GPUs of a node of the "
            "profile's partition"
        )
    if partition is not None and partition == profile.cpu_partition and partition != profile.partition:
        raise PlanError(
            f"submission.partition: {partition!r} is the profile's CPU-only partition, but the run deploys models "
            "that need GPUs; use a GPU partition"
        )
    deployments: list[DeploymentPlan] = []
    total, nodes = 0, 1
    for index, dep in enumerate(run.deployments):
        where, alias = f"deployments[{index}]", f"(model alias {dep.model_alias!r})"
        spans = _replica_nodes(run, index, per_node)
        count = declared_replicas(dep) if counts is None else counts[index]
        if dep.server.port is not None and dep.server.port + count - 1 > 65535:
            raise PlanError(f"{where}.server.port: {dep.server.port} + {count} replicas exceeds 65535 {alias}")
        gpus = dep.tensor_parallel * dep.pipeline_parallel * dep.data_parallel
        step_gpus = gpus if spans == 1 else per_node
        replicas = tuple(
            ReplicaPlan(
                index=r,
                gpus=step_gpus,
                cpus=dep.server.cpus,
                port=None if dep.server.port is None else dep.server.port + r,
                nodes=spans,
            )
            for r in range(count)
        )
        total += step_gpus * count
        nodes = max(nodes, spans)
        capacity = dep.data_parallel * server_capacity(dep.server.extra_args, f"{where}.server.extra_args", dep.engine)
        deployments.append(
            DeploymentPlan(
                alias=dep.model_alias,
                model=dep.model,
                served_model_name=dep.served_name,
                tensor_parallel=dep.tensor_parallel,
                replicas=replicas,
                startup_timeout=dep.server.startup_timeout,
                restarts=dep.server.restarts,
                extra_args=dep.server.extra_args,
                env=dict(dep.server.env),
                proxy=True,
                # SGLang has no Unix-domain socket option: a loopback port, planned per job unless server.port.
                listen="tcp" if dep.server.port is not None or dep.engine == "sglang" else "unix",
                env_from=dep.server.env_from,
                capacity=capacity,
                max_parallel_requests=count * capacity,
                engine=dep.engine,
                pipeline_parallel=dep.pipeline_parallel,
                data_parallel=dep.data_parallel,
                expert_parallel=dep.expert_parallel,
            )
        )
    if total > per_node:
        detail = " + ".join(f"{d.alias}: {len(d.replicas)} x {d.replica_gpus}" for d in deployments)
        raise PlanError(
            f"deployments: the deployments need {total} GPUs ({detail}) but a node has {per_node} (replicas x "
            "GPUs of a replica; replicas that fit on a node share the allocation's one node): use fewer replicas "
            "or smaller ones, or more allocations (allocations: K, each with its own replicas)"
        )
    return ServingPlan(
        deployments=tuple(deployments),
        gpus=total,
        gpu_request=profile.gpu_request,
        container_runtime=profile.container_runtime,
        vllm_executable=profile.vllm_executable,
        vllm_image=profile.vllm_image,
        container_mounts=profile.container_mounts,
        nodes=nodes,
        sglang_executable=profile.sglang_executable,
        sglang_image=profile.sglang_image,
        engine_cache=profile.engine_cache,
    )
