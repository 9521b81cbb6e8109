"""The provider snapshot: the immutable copy of the model providers and model configs a run needs.

It is captured on the submit host and is the only source of provider settings on compute nodes. API keys
are kept as environment-variable *names* (``api_key_env``); values never appear in a snapshot.
"""

from __future__ import annotations

from typing import Any, Literal

from ddslurm.config._base import Frozen

SNAPSHOT_VERSION = 1


class SnapshotProvider(Frozen, frozen=True, kw_only=True):
    """A Data Designer model provider. ``local`` providers get their endpoint on the node."""

    name: str
    endpoint: str
    provider_type: str = "openai"
    api_key_env: str | None = None
    extra_body: dict[str, Any] | None = None
    extra_headers: dict[str, str] | None = None
    local: bool = False


class SnapshotModel(Frozen, frozen=True, kw_only=True):
    """A Data Designer model config, with inference parameters kept exactly as the user wrote them."""

    alias: str
    model: str
    provider: str
    inference_parameters: dict[str, Any] | None = None
    skip_health_check: bool = False
    source: Literal["recipe", "settings", "deployment"] = "recipe"


class ProviderSnapshot(Frozen, frozen=True, kw_only=True):
    version: int = SNAPSHOT_VERSION
    providers: tuple[SnapshotProvider, ...] = ()
    models: tuple[SnapshotModel, ...] = ()

    def secret_env_names(self) -> tuple[str, ...]:
        """Names of the environment variables that hold API keys, sorted and without repeats."""
        return tuple(sorted({p.api_key_env for p in self.providers if p.api_key_env}))
