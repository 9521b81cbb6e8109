"""ddslurm.providers: reads Data Designer's native model settings, resolves aliases, builds the snapshot.

Only :mod:`ddslurm.providers.discovery` looks at the home directory; everything else takes explicit paths
and an explicit environment mapping.
"""

from ddslurm.providers._capture import describe_run, load_recipe, resolve_run
from ddslurm.providers._check import EndpointChecker, Fetch, check_endpoints, urllib_fetch
from ddslurm.providers._compare import same_model_config
from ddslurm.providers._mcp import describe_mcp, tool_provider_uses
from ddslurm.providers._native import (
    MCP_PROVIDERS_FILE,
    MODEL_CONFIGS_FILE,
    PROVIDERS_FILE,
    NativeMCPProvider,
    NativeModelConfig,
    NativeProvider,
    NativeSettings,
    Origin,
    load_settings,
    with_given_mcp_providers,
)
from ddslurm.providers._resolve import (
    LOCAL_PROVIDER_PREFIX,
    LOCAL_TOKEN_ENV,
    AliasRow,
    ModelComparer,
    Resolution,
    describe,
    resolve,
    used_aliases,
)
from ddslurm.providers._secrets import (
    PLACEHOLDER_MIN_LENGTH,
    SecretHit,
    body_credentials,
    is_credential_header,
    is_credential_key,
    is_env_var_name,
    is_placeholder_secret,
    looks_like_credential,
    missing_env,
    placeholder_secrets,
    redact_url,
    secret_in_tree,
    url_credentials,
)
from ddslurm.providers.errors import ProvidersError, RedirectedError, ResolutionError, SettingsError

__all__ = [
    "LOCAL_PROVIDER_PREFIX",
    "LOCAL_TOKEN_ENV",
    "MCP_PROVIDERS_FILE",
    "MODEL_CONFIGS_FILE",
    "PLACEHOLDER_MIN_LENGTH",
    "PROVIDERS_FILE",
    "AliasRow",
    "EndpointChecker",
    "Fetch",
    "ModelComparer",
    "NativeMCPProvider",
    "NativeModelConfig",
    "NativeProvider",
    "NativeSettings",
    "Origin",
    "ProvidersError",
    "RedirectedError",
    "Resolution",
    "ResolutionError",
    "SecretHit",
    "SettingsError",
    "body_credentials",
    "check_endpoints",
    "describe",
    "describe_mcp",
    "describe_run",
    "is_credential_header",
    "is_credential_key",
    "is_env_var_name",
    "is_placeholder_secret",
    "load_recipe",
    "load_settings",
    "with_given_mcp_providers",
    "looks_like_credential",
    "missing_env",
    "placeholder_secrets",
    "redact_url",
    "resolve",
    "resolve_run",
    "same_model_config",
    "secret_in_tree",
    "tool_provider_uses",
    "url_credentials",
    "urllib_fetch",
    "used_aliases",
]
