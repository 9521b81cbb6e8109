"""Secret policy: API keys travel as environment-variable names; credentials never sit in settings."""

from __future__ import annotations

import re
from collections.abc import Mapping

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREDENTIAL_HEADERS = {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"}
_CREDENTIAL_WORDS = re.compile(r"(token|secret|passw(or)?d|credential|auth|(^|[-_])key($|[-_])|apikey)", re.I)
_KEY_PREFIXES = ("sk-", "nvapi-", "ghp_", "gho_", "github_pat_", "AKIA", "xoxb-", "hf_")


def is_env_var_name(value: str) -> bool:
    """True if ``value`` can only be an environment-variable name, not a literal key.

    Names are upper case with underscores (``NVIDIA_API_KEY``); anything with other characters, known key
    prefixes, or lower-case letters mixed with digits in the way generated keys look is a literal.
    """
    if not ENV_NAME.match(value) or value.startswith(_KEY_PREFIXES):
        return False
    return value.upper() == value


def is_credential_header(name: str) -> bool:
    lowered = name.strip().lower()
    return lowered in _CREDENTIAL_HEADERS or bool(_CREDENTIAL_WORDS.search(lowered))


def missing_env(names: tuple[str, ...] | list[str], env: Mapping[str, str]) -> list[str]:
    """Names whose variable is unset or empty in ``env``."""
    return [n for n in names if not env.get(n)]
