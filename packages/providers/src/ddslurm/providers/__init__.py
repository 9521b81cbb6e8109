"""ddslurm.providers: reads Data Designer's native model settings, resolves aliases, builds the snapshot.

Only :mod:`ddslurm.providers.discovery` looks at the home directory; everything else takes explicit paths
and an explicit environment mapping.
"""

from ddslurm.providers._capture import load_recipe, resolve_run
from ddslurm.providers._native import (
    MODEL_CONFIGS_FILE,
    PROVIDERS_FILE,
    NativeModelConfig,
    NativeProvider,
    NativeSettings,
    Origin,
    load_settings,
)
from ddslurm.providers._resolve import (
    LOCAL_PROVIDER_PREFIX,
    AliasRow,
    Resolution,
    recipe_section,
    resolve,
    used_aliases,
)
from ddslurm.providers._secrets import is_credential_header, is_env_var_name, missing_env
from ddslurm.providers.errors import ProvidersError, ResolutionError, SettingsError

__all__ = [
    "LOCAL_PROVIDER_PREFIX",
    "MODEL_CONFIGS_FILE",
    "PROVIDERS_FILE",
    "AliasRow",
    "NativeModelConfig",
    "NativeProvider",
    "NativeSettings",
    "Origin",
    "ProvidersError",
    "Resolution",
    "ResolutionError",
    "SettingsError",
    "is_credential_header",
    "is_env_var_name",
    "load_recipe",
    "load_settings",
    "missing_env",
    "recipe_section",
    "resolve",
    "resolve_run",
    "used_aliases",
]
