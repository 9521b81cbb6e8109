"""Errors of the runtime.

RuntimeFailure           root (a DdslurmError): the attempt failed; ``reason`` is a stable code for status and retry
├── InputsError          plan, recipe or snapshot missing or not matching its recorded sha256
├── SecretMissingError   an API-key variable the snapshot names is unset in the job's environment
├── EngineCacheError     the servers' engine cache (the profile's ``engine_cache``) is not this user's own
├── EngineError          Data Designer failed (``retryable`` says whether a new attempt may help)
│   ├── ProviderUnavailableError  a provider answered 429 or 5xx, refused or timed out for longer than the
│   │                    attempt waits it out (``provider_wait``; retryable)
│   ├── RecipeError      Data Designer refuses the recipe (never retryable: every attempt would repeat it)
│   └── KeyRefusedError  a hosted endpoint refused the API key, HTTP 401 or 403 (never retryable: the job's key
│                        stays the same until it is exported again and the shard retried)
└── VerificationError    the candidate dataset is unreadable, short, or leaks a secret
    └── EmptyOutputsError  LLM columns hold more empty or null values than ``max_empty_outputs`` (retryable)

BuilderFailure           (a DdslurmError too) a builder script could not be loaded, called or serialised (at
                         submit, ``inspect`` answers it; on the node it becomes a RecipeError)

The serving errors (``server_*``, ``proxy_died``, ``gpu_mismatch``, ``node_mismatch``, ``port_unavailable``,
``engine_too_old``) live in
``_serving.py``; ``server_port_taken`` (another user holds a server's port) and ``rendezvous_intruder`` (another
user connected to a replica's rendezvous) in ``_listeners.py``; ``leader_address_unresolved`` (no address of the
leader's node its followers reach) in ``_leader_address.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddslurm.config import DdslurmError


class RuntimeFailure(DdslurmError):
    """Root of the errors raised by ddslurm.runtime."""

    reason = "internal"
    retryable = False

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class InputsError(RuntimeFailure):
    reason = "inputs_invalid"


class SecretMissingError(RuntimeFailure):
    reason = "secret_missing"


class EngineCacheError(RuntimeFailure):
    """The directory the servers download models to and keep compiled kernels in cannot be created, or is not
    this user's own (a link, another user's, writable by others): no server starts with it."""

    reason = "engine_cache_refused"


class EngineError(RuntimeFailure):
    reason = "generation_failed"

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class ProviderUnavailableError(EngineError):
    """A provider answered 429 or 5xx, refused the connection or timed out (at Data Designer's start-up health check
    or after Data Designer's own request retries): an outage or a rate limit, which waiting may outlast."""

    reason = "provider_unavailable"

    def __init__(self, message: str, *, provider: str | None = None) -> None:
        super().__init__(message, retryable=True)
        self.provider = provider


class RecipeError(EngineError):
    reason = "recipe_invalid"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class KeyRefusedError(EngineError):
    """A hosted provider's endpoint answered HTTP 401 or 403: it refused the API key the job was given. Every attempt
    of the job's arrays has the same key, so none is rerun or retried automatically."""

    reason = "key_refused"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


PERMANENT_REASONS = frozenset({"recipe_invalid", "inputs_invalid", "key_refused", "engine_too_old"})
"""Failures that a new attempt of the same run repeats: automatic retry arrays do not start work after them."""


class OutputExistsError(RuntimeFailure):
    """The attempt's dataset path exists (non-empty, or a symbolic link): it is never touched."""

    reason = "output_exists"


class VerificationError(RuntimeFailure):
    reason = "output_invalid"


class EmptyOutputsError(VerificationError):
    """LLM columns of the candidate hold more empty or null values than the plan's ``max_empty_outputs``.

    Retryable: the rejected dataset is set aside, so the next generation (a rerun inside the allocation or a
    ``ddslurm retry``) regenerates the shard instead of resuming the empty values. ``counts``: per column, the
    empty or null values of the columns above the limit.
    """

    reason = "empty_outputs"
    retryable = True

    def __init__(self, message: str, *, counts: Mapping[str, int]) -> None:
        super().__init__(message)
        self.counts = dict(counts)


class BuilderFailure(DdslurmError):
    """The builder could not be loaded, called or serialised: ``message``, at ``file``:``line``."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.message, self.file, self.line = message, file, line
