"""The provider snapshot: the immutable copy of the model providers, model configs and MCP providers a run needs.

It is captured on the submit host and is the only source of provider settings on compute nodes. API keys
are kept as environment-variable *names* (``api_key_env``, an MCP stdio server's ``env_from``); values never
appear in a snapshot.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

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


class SnapshotMCPProvider(Frozen, frozen=True, kw_only=True):
    """A Data Designer MCP provider one of the recipe's ``tool_configs`` names: remote (``sse``,
    ``streamable_http``: ``endpoint``, ``api_key_env``) or a local server the client step starts (``stdio``:
    ``command``, ``args``, ``env``). ``env_from`` maps a variable of the server's environment to the variable of the
    client step's environment that holds its value (written ``${VAR}`` in ``mcp_providers.yaml``)."""

    name: str
    provider_type: Literal["sse", "streamable_http", "stdio"]
    endpoint: str | None = None
    api_key_env: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    env_from: dict[str, str] = msgspec.field(default_factory=dict)


class ProviderSnapshot(Frozen, frozen=True, kw_only=True):
    version: int = SNAPSHOT_VERSION
    providers: tuple[SnapshotProvider, ...] = ()
    models: tuple[SnapshotModel, ...] = ()
    mcp_providers: tuple[SnapshotMCPProvider, ...] = ()
    """The MCP providers the recipe's ``tool_configs`` name (empty for a recipe without tools)."""

    def mcp_secret_env_names(self) -> tuple[str, ...]:
        """The variables the MCP providers' keys are in (``api_key_env``, stdio ``env_from``), sorted, no repeats."""
        names = {p.api_key_env for p in self.mcp_providers if p.api_key_env}
        return tuple(sorted(names | {v for p in self.mcp_providers for v in p.env_from.values()}))

    def secret_env_names(self) -> tuple[str, ...]:
        """Names of the environment variables that hold API keys (model and MCP providers), sorted, no repeats."""
        return tuple(sorted({p.api_key_env for p in self.providers if p.api_key_env} | {*self.mcp_secret_env_names()}))
