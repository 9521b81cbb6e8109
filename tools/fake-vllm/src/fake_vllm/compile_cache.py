"""vLLM's ``torch.compile`` cache, as far as where it is, what names it and what it keeps go (opt-in:
``--fake-compile-cache``).

Real vLLM (``vllm/compilation/backends.py``, ``vllm/envs.py compile_factors``) names each compiled model's cache
directory ``<VLLM_CACHE_ROOT>/torch_compile_cache/<hash>/rank_<r>_<dp>/backbone`` from a hash of its factors:
every vLLM environment variable but those on ``compile_factors``'s ignored list, the configuration and the code.
Before vllm-project/vllm#52523 ``VLLM_API_KEY`` was not on that list: the key is one of the factors, written in
clear to the directory's ``cache_key_factors.json``, and a server started with another key (ddslurm's token
changes with every allocation) hashes to a new directory and compiles again. ``VLLM_CACHE_ROOT`` defaults to
``$XDG_CACHE_HOME/vllm``, itself ``~/.cache/vllm``.

Modes: ``off`` (default: the stand-in writes nothing, as before; every stand-in process of the suite would
otherwise write to the user's home), ``old`` (a vLLM before #52523: the key among the factors) and ``fixed``.
A cache hit or miss is logged in vLLM's words, so a test reads it from the server log.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from fake_vllm.log import log
from fake_vllm.settings import Settings

MODES = ("off", "old", "fixed")
IGNORED = frozenset(
    {
        "VLLM_RPC_BASE_PATH",
        "VLLM_PORT",
        "VLLM_CACHE_ROOT",
        "VLLM_HOST_IP",
        "VLLM_DP_MASTER_IP",
        "VLLM_DP_MASTER_PORT",
        "VLLM_LOGGING_LEVEL",
        "VLLM_LOGGING_PREFIX",
        "VLLM_LOGGING_STREAM",
        "VLLM_LOGGING_CONFIG_PATH",
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
    }
)
"""Variables ``compile_factors`` ignores (a part of vLLM's list: the ones a server's environment is likely to
hold). ``FAKE_VLLM_*`` are the stand-in's own and never a factor."""
MARKER = "vllm_compile_cache.py"


def cache_root(environ: Mapping[str, str]) -> Path:
    """``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm`` (``vllm/envs.py``)."""
    if environ.get("VLLM_CACHE_ROOT"):
        return Path(environ["VLLM_CACHE_ROOT"])
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "vllm"
    home = environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir  # what ~ expands to
    return Path(home) / ".cache" / "vllm"


def env_factors(environ: Mapping[str, str], mode: str) -> dict[str, str]:
    """The environment's compile factors: every ``VLLM_*`` variable not ignored (``VLLM_API_KEY`` ignored only
    with ``fixed``)."""
    ignored = IGNORED | ({"VLLM_API_KEY"} if mode == "fixed" else set())
    return {k: v for k, v in sorted(environ.items()) if k.startswith("VLLM_") and k not in ignored}


def compile_model(settings: Settings, environ: Mapping[str, str]) -> Path | None:
    """Find or fill this rank's compile cache (``settings.compile_cache`` not ``off``); its directory. Logs
    ``Using cache directory: DIR for vLLM's torch.compile``, then a hit (``Directly load the compiled graph(s) ...
    from the cache``) or a miss (``Compiling a graph ...``)."""
    if settings.compile_cache == "off":
        return None
    factors = {
        "env": env_factors(environ, settings.compile_cache),
        "config": {
            "model": settings.model,
            "tensor_parallel_size": settings.tensor_parallel_size,
            "pipeline_parallel_size": settings.pipeline_parallel_size,
            "max_model_len": settings.max_model_len,
        },
    }
    key = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:10]
    top = cache_root(environ) / "torch_compile_cache" / key
    rank = 0 if settings.group is None else settings.group.rank
    local = top / f"rank_{rank}_0" / "backbone"
    log(f"Using cache directory: {local} for vLLM's torch.compile")
    if (local / MARKER).is_file():
        log(f"Directly load the compiled graph(s) for dynamic shape from the cache, key {key}")
        return local
    local.mkdir(parents=True, exist_ok=True)
    (top / "cache_key_factors.json").write_text(json.dumps(factors, indent=2, sort_keys=True) + "\n")
    (local / MARKER).write_text("# compiled graphs (stand-in)\n")
    log(f"Compiling a graph for dynamic shape takes 0.00 s (stand-in), cache key {key}")
    return local
