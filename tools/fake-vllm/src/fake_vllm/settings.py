"""The immutable settings of one fake-vllm server, built by the command line (see ``cli.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fake_vllm.flags import SGLANG_VERSION, VLLM_VERSION
from fake_vllm.version import version

Engine = Literal["vllm", "sglang"]
GroupForm = Literal["nodes", "data-parallel"]


ACT_AS_ENV: dict[Engine, str] = {"vllm": "FAKE_VLLM_AS_VLLM", "sglang": "FAKE_VLLM_AS_SGLANG"}
"""The variable that makes the stand-in act as another release of the engine (``0.10.1``, ``0.4.6.post1``): it says
that version (``fake-vllm --version``, ``sglang.__version__``) and refuses every flag newer than it as that release's
argparse does (``fake_vllm.flags.INTRODUCED``). Unset: the release its flag lists are, which has every flag."""


def engine_version(engine: Engine, environ: Mapping[str, str]) -> str:
    """The release of ``engine`` the stand-in acts as: ``FAKE_VLLM_AS_VLLM``/``FAKE_VLLM_AS_SGLANG``, else the
    release of its flag lists marked as the stand-in's (``0.11.1+fakevllm.<its version>``)."""
    acted = environ.get(ACT_AS_ENV[engine], "").strip()
    return acted or f"{VLLM_VERSION if engine == 'vllm' else SGLANG_VERSION}+fakevllm.{version()}"


@dataclass(frozen=True, kw_only=True)
class Group:
    """The replica spans nodes, and this process is one node's rank of it.

    ``form`` ``"nodes"``: tensor x pipeline parallel over ``nodes`` nodes (vLLM ``--nnodes/--node-rank
    --master-addr/--master-port``, SGLang ``--nnodes/--node-rank --dist-init-addr``); ``"data-parallel"``: vLLM's
    data-parallel ranks spread over nodes (``--data-parallel-size-local``, ``--data-parallel-start-rank``,
    ``--data-parallel-address``, ``--data-parallel-rpc-port``), ``rank`` being the node's index (start rank /
    local size). Rank 0 leads: it binds ``address:port`` and serves the API; the others join it."""

    form: GroupForm
    nodes: int
    rank: int
    address: str
    port: int

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def rendezvous(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the server needs; the app and the fault model read nothing else.

    The vLLM-compatible part mirrors ``vllm serve``; the ``fake_*`` part controls the stand-in behaviours.
    """

    model: str
    served_model_names: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    uds: Path | None = None
    """vLLM's ``--uds``: serve on this Unix-domain socket instead (``host`` and ``port`` are then ignored)."""
    api_keys: tuple[str, ...] = ()
    engine: Engine = "vllm"
    """Whose command line, API-key rules and metrics the stand-in speaks: vLLM's or SGLang's."""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    """The replica's data-parallel ranks (all nodes): capacity is per rank, so the replica runs this many times it."""
    expert_parallel: bool = False
    expert_parallel_size: int = 1
    """vLLM ``--enable-expert-parallel`` (TP x DP), SGLang ``--ep-size``: accepted and logged, not modelled."""
    group: Group | None = None
    headless: bool = False
    gpus_per_node: int = 1
    """GPUs this node's ranks need (checked against ``CUDA_VISIBLE_DEVICES`` when it is set)."""
    enable_metrics: bool = True
    health_generates: bool = False
    """SGLang's ``/health`` runs a one-token generation (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``, true by
    default in SGLang): :mod:`fake_vllm.sglang_health`. vLLM's never does."""
    health_check_timeout: float = 20.0
    """SGLang's ``SGLANG_HEALTH_CHECK_TIMEOUT``: seconds a generating /health waits for output before its 503."""
    """vLLM always serves ``/metrics``; SGLang only with ``--enable-metrics``."""
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    """vLLM's ``--max-num-seqs`` / SGLang's ``--max-running-requests`` (per data-parallel rank): times
    ``data_parallel_size``, the capacity when ``--fake-capacity`` is not given."""
    ignored_args: tuple[str, ...] = ()

    startup_delay: float = 0.0
    latency: float = 0.0
    capacity: int = 0
    crash_after: int | None = None
    error_rate: float = 0.0
    rate_429: float = 0.0
    no_choices_rate: float = 0.0
    seed: int = 0
    never_healthy: bool = False
    fail_start: bool = False
    request_log: Path | None = None
    log_match: str | None = None
    gate: Path | None = None
    """``--fake-gate``: the file that says how many chat requests may be answered (``gate.py``)."""
    gate_model: str | None = None
    """``--fake-gate-model``: only this model's chat requests wait at the gate."""
    outage: Path | None = None
    """``--fake-outage``: the file that says whether the provider is down (``500``) or rate limited (``429``)."""
    join_timeout: float = 120.0
    engine_process: bool = False
    """``--fake-engine-process``: the engine as a child process whose death the server notices
    (``engine_process.py``)."""
    metrics_auth: bool = False
    """``--fake-metrics-auth``: /metrics behind the API key (a proposed vLLM change; today neither engine does)."""
    compile_cache: str = "off"
    """``--fake-compile-cache``: ``off``, ``old`` or ``fixed`` (``compile_cache.py``)."""
    follower_health: bool = False
    """``--fake-follower-health``: an SGLang follower serves a dummy ``/health`` on ``host:port`` once it joined, as
    SGLang's followers do on their own node (off: the local test cluster's nodes share one host, where it would be
    the leader's port)."""
    rate_limit_rpm: int | None = None
    """``--fake-rate-limit-rpm``: the key's requests a minute (``ratelimit.py``); None: no limit."""
    rate_limit_tpm: int | None = None
    rate_limit_in_flight: int | None = None
    rate_headers: str = "openai"
    """``openai``, ``anthropic`` or ``none``: the rate-limit headers of every answer of a limited key."""

    @property
    def rate_limited(self) -> bool:
        return any(v is not None for v in (self.rate_limit_rpm, self.rate_limit_tpm, self.rate_limit_in_flight))

    @property
    def primary_name(self) -> str:
        """The name vLLM reports in metrics labels and ``/v1/models`` first: the first served name."""
        return self.served_model_names[0]

    @property
    def requires_key(self) -> bool:
        return bool(self.api_keys)

    @property
    def listen_address(self) -> str:
        """Where the server listens, as vLLM logs it: ``unix:PATH`` or ``http://HOST:PORT``."""
        if self.uds is not None:
            return f"unix:{self.uds}"
        host = f"[{self.host}]" if ":" in self.host else self.host or "0.0.0.0"
        return f"http://{host}:{self.port}"
