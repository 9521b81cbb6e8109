"""The cluster profile: what belongs to the cluster rather than to one run."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._convert import refuse_all
from ddslurm.config._sbatch_values import extra_sbatch_refusals, path_problem, scheduler_refusals

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class ClusterProfile(Frozen, frozen=True, kw_only=True):
    """Top level of a profile file. Relative paths are relative to the profile file's directory."""

    name: str = "default"
    """The cluster's name, for people (``ddslurm init`` writes Slurm's ``ClusterName``)."""
    workspace: str
    """Runs live in ``<workspace>/runs/<run_id>/``: a directory on a filesystem every node mounts. It goes into
    ``#SBATCH`` lines, so a path with whitespace, control characters, quotes, backslashes, ``#``, ``%``, ``$`` or a
    backquote is refused. ``doctor`` and ``submit`` refuse a workspace (or its ``runs/``) another user can write,
    sticky bit or not: in a shared project directory make one of your own (``mkdir -m 700 /shared/project/$USER``)
    and point ``workspace`` at it."""
    python_env: str
    """The virtual environment the compute nodes run (``<python_env>/bin/ddslurm-runtime``), at the same path on
    every node. The characters ``workspace`` may not hold are refused here too. ``doctor`` and ``submit`` refuse
    an environment a user other than you and root can write (its directory, ``bin/``, ``site-packages``)."""
    account: str | None = None
    """Default ``--account`` of every job: a Slurm name (letters, digits, ``.``, ``_``, ``+``, ``-``)."""
    partition: str | None = None
    """Partition of generation jobs with deployments (GPU nodes): a Slurm name, or several separated by commas."""
    cpu_partition: str | None = None
    """Partition of hosted-only generation jobs and of collection jobs (as ``partition``)."""
    gpus_per_node: NonNegativeInt = 0
    """GPUs on one node of ``partition``: replicas that fit on a node share one node; a replica bigger than a node
    spans whole nodes."""
    gpu_request: Literal["gres", "gpus"] = "gres"
    """How jobs ask for GPUs: ``--gres=gpu:N`` (``gres``) or ``--gpus=N`` (``gpus``)."""
    memory_per_gpu: str | None = None
    """Host memory asked per GPU (``--mem`` = GPUs x this) when the run file sets no ``submission.memory``."""
    container_runtime: Literal["none", "pyxis", "apptainer"] = "none"
    """How vLLM is started: a bare executable (``none``), in a Pyxis container or with ``apptainer exec --nv``."""
    container_mounts: tuple[str, ...] = ()
    """Mounts for the container runtime (``SRC:DST``)."""
    vllm_executable: str = "vllm"
    """The ``vllm`` command (a path or a name on ``PATH``) when no container is used."""
    vllm_image: str | None = None
    """The vLLM image for Pyxis or Apptainer."""
    sglang_executable: str = "python3"
    """The Python with SGLang installed (``<it> -m sglang.launch_server``; a path or a name on ``PATH``), for
    deployments with ``engine: sglang`` when no container is used."""
    sglang_image: str | None = None
    """The SGLang image for Pyxis or Apptainer (its ``python3`` runs the server)."""
    engine_cache: str | None = None
    """The directory, at the same path on every node, where the model servers download models and keep their
    caches (``HF_HOME``, ``VLLM_CACHE_ROOT``, ``XDG_CACHE_HOME``, Triton's, torch inductor's, FlashInfer's and
    CUDA's): each variable the job's environment does not set already points into it, and Pyxis and Apptainer
    mount it at the same path (a container without the home directory would write them to its own root
    filesystem). Default (null): for servers in containers, ``ddslurm-engine-cache-<uid>`` in the node's temporary
    directory (``TMPDIR``, else ``/tmp``), node-local scratch that outlives the job, so a later allocation on the
    node reuses what an earlier one downloaded and compiled; bare executables keep the engines' own caches in the
    home directory. A directory on a shared filesystem shares them between nodes. An
    absolute path, without whitespace, ``,`` or ``:`` (container mount lists split on them). The runtime creates
    it owner-only and refuses one that is not this user's own (a link, another user's, writable by others):
    compiled kernels from there run in the servers."""
    extra_sbatch: tuple[str, ...] = ()
    """``#SBATCH`` lines added to every job of this cluster, one long option each (as the run file's
    ``submission.extra_sbatch``, with the same options refused)."""

    def __post_init__(self) -> None:
        # Every value that reaches an #SBATCH line, checked as the value it is (ddslurm.config._sbatch_values); every
        # field refused at once (_convert.Refusals), each at its line and column.
        refusals = [
            (field, problem)
            for field, value in (("workspace", self.workspace), ("python_env", self.python_env))
            if (problem := path_problem(value)) is not None
        ]
        refusals += scheduler_refusals(
            (
                ("account", self.account, "name"),
                ("partition", self.partition, "names"),
                ("cpu_partition", self.cpu_partition, "names"),
                ("memory_per_gpu", self.memory_per_gpu, "memory"),
            )
        )
        refusals += extra_sbatch_refusals("extra_sbatch", self.extra_sbatch)
        if self.engine_cache is not None and (problem := engine_cache_problem(self.engine_cache)) is not None:
            refusals.append(("engine_cache", problem))
        refuse_all(refusals)


def engine_cache_problem(path: str) -> str | None:
    """Why ``path`` cannot be the profile's ``engine_cache`` (None: it can): a node's absolute path that a
    container mount list (``SRC:DST,...``) and an environment variable carry as it is."""
    if not path.startswith("/"):
        return f"engine_cache must be an absolute path on the nodes, got {path!r}"
    if any(c in path for c in ",:") or any(c.isspace() or not c.isprintable() for c in path):
        return f"engine_cache {path!r} holds whitespace, ',' or ':' (container mount lists split on them)"
    return None
