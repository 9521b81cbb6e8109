"""The immutable settings of one fake-vllm server, built by the command line (see ``cli.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
    tensor_parallel_size: int = 1
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    """vLLM's ``--max-num-seqs`` (sequences run at once): the capacity when ``--fake-capacity`` is not given."""
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
