"""Where the model servers download models and keep their caches: the profile's ``engine_cache``; for servers in
Pyxis and Apptainer containers node-local scratch by default, mounted at the same path inside them.

An engine writes to its user's home by default: the Hugging Face hub (``~/.cache/huggingface``, ``HF_HOME``),
vLLM's compile cache (``~/.cache/vllm``, ``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``), Triton's kernels
(``~/.triton/cache``, ``TRITON_CACHE_DIR``), torch inductor's (``/tmp/torchinductor_<user>``,
``TORCHINDUCTOR_CACHE_DIR``), FlashInfer's JIT modules (``~/.cache/flashinfer``, under
``FLASHINFER_WORKSPACE_BASE``), CUDA's (``~/.nv/ComputeCache``, ``CUDA_CACHE_PATH``) and what else follows
``XDG_CACHE_HOME``. Pyxis runs with ``--no-container-mount-home``: in a container all of that, a model of a hundred
gigabytes included, lands on the container's root filesystem, read-only or in memory on many sites. So each server
step gets every one of these variables that its environment does not set already (a variable the job or the
deployment's ``server.env`` sets is the user's choice and kept), each pointing into one directory, and a
container gets that directory mounted at the same path. A bare executable sees its user's home: unless the
profile names an ``engine_cache``, it keeps the engines' own places there (models a user downloaded to a shared
home, the token ``huggingface-cli login`` saved), where a node-local default would download a model again on
every node.

Compiled kernels from that directory run inside the servers, on the GPUs: the directory must be the user's own.
The controller creates it owner-only on its node and refuses one that is a link, another user's, or writable by
others (another user who made ``/tmp/ddslurm-engine-cache-<uid>`` first could hand the servers their code).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ddslurm.config import ServingPlan
from ddslurm.runtime.errors import EngineCacheError

CACHE_VARIABLES: tuple[tuple[str, str], ...] = (
    ("XDG_CACHE_HOME", ""),
    ("HF_HOME", "huggingface"),
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("CUDA_CACHE_PATH", "nv-compute-cache"),
)
"""Each variable an engine (or a library it runs) reads its cache's place from, and its directory inside the
engine cache ("": the directory itself). ``XDG_CACHE_HOME`` makes the rest of ``~/.cache`` follow."""


def engine_cache_dir(serving: ServingPlan, env: Mapping[str, str], uid: int | None = None) -> Path | None:
    """The profile's ``engine_cache``; else, for servers in containers, ``ddslurm-engine-cache-<uid>`` in the
    node's temporary directory (``TMPDIR`` of the job's environment when it is a directory, else ``/tmp``); else
    None: bare executables keep the engines' own caches in the user's home."""
    if serving.engine_cache:
        return Path(serving.engine_cache)
    if serving.container_runtime == "none":
        return None
    tmp = env.get("TMPDIR", "")
    base = Path(tmp) if tmp.startswith("/") and Path(tmp).is_dir() else Path("/tmp")
    return base / f"ddslurm-engine-cache-{os.getuid() if uid is None else uid}"


def cache_environment(directory: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The cache variables (:data:`CACHE_VARIABLES`) that ``env`` does not set, each pointing into ``directory``."""
    return {name: str(directory / sub) if sub else str(directory) for name, sub in CACHE_VARIABLES if not env.get(name)}


def ensure_engine_cache(directory: Path) -> None:
    """Create ``directory`` owner-only (its parents as ``mkdir -p`` would), or check that the one there is this
    user's own directory that no one else can write. Raises :class:`EngineCacheError`."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(directory)
    except OSError as exc:
        raise EngineCacheError(f"the engine cache {directory} cannot be created: {exc}") from exc
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        problem = "is a symbolic link" if stat.S_ISLNK(info.st_mode) else "is not a directory"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to this user ({os.getuid()})"
    elif info.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    else:
        return
    raise EngineCacheError(
        f"the engine cache {directory} {problem}: the servers would load models and run compiled kernels from "
        "it. Remove it (or make it yours, chmod go-w), or set the profile's engine_cache to a directory of your own"
    )
