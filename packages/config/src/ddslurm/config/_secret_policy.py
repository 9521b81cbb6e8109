"""The one secret policy: which strings ddslurm takes for a literal credential by their shape, and which for the
name of an environment variable. Every check that judges a value by its shape calls this module (the run file's
``server.env`` and ``server.extra_args``, a provider's ``api_key``, endpoint, headers and ``extra_body``, an MCP
server's arguments and ``env``, the submitting shell's variables): none keeps a list or a rule of its own.

Nothing here returns or formats the value: callers get booleans and reasons that never repeat it.
"""

from __future__ import annotations

import itertools
import re
from pathlib import PurePath

KEY_PREFIXES: tuple[str, ...] = (
    "sk-",  # OpenAI and the APIs compatible with it
    "nvapi-",  # NVIDIA
    "hf_",  # Hugging Face
    "ghp_",  # GitHub: personal, OAuth, user-to-server and server-to-server tokens, fine-grained tokens
    "gho_",
    "ghu_",
    "ghs_",
    "github_pat_",
    "glpat-",  # GitLab personal access tokens
    "xoxb-",  # Slack bot and user tokens
    "xoxp-",
    "AKIA",  # AWS access key ids, long-lived and temporary
    "ASIA",
    "eyJ",  # a JWT: base64 of '{"'
)
"""The known prefixes of API keys and tokens: a value that starts with one, or holds one after a separator, is a
literal credential wherever it is written; an upper-case one (``AKIA...``) is never a variable's name."""

AUTH_SCHEMES: tuple[str, ...] = ("Bearer", "Basic", "Token", "Digest", "ApiKey", "Api-Key", "Key")
"""Schemes of an ``Authorization`` value: one followed by a credential (any case: ``bearer abc``) is one."""

_AUTH_SCHEME = re.compile(r"\A\s*(" + "|".join(map(re.escape, AUTH_SCHEMES)) + r")\s+\S", re.I)
# Inside a value, a prefix that ends in "-" or "_" needs 3 key characters after it, one that ends in a letter (AKIA,
# eyJ) 12 letters or digits, so that a word such as EAST_ASIA_KEY is no key.
_PREFIX_INSIDE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    + "|".join(re.escape(p) + (r"[A-Za-z0-9_-]{3,}" if p[-1] in "-_" else r"[A-Za-z0-9]{12,}") for p in KEY_PREFIXES)
    + ")"
)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.")
_URL_CREDENTIALS = re.compile(r"\A[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]+:[^/@\s]+@")
_GENERATED = re.compile(r"\A[A-Za-z0-9_-]{24,}\Z")
_HEX_RUN_32 = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{32,}(?![0-9A-Fa-f])")
_TOKEN_RUN = re.compile(r"[A-Za-z0-9+/_=]{32,}")
_UPPER_NAME = re.compile(r"\A[A-Z_][A-Z0-9_]*\Z")
_DIGIT_RUN = re.compile(r"[0-9]{5,}")
_HEX_RUN_8 = re.compile(r"[0-9A-F]{8,}")
_LONGEST_WORD = 32
_SHORTEST_CAPITALS_KEY = 12

_STARTS_LIKE_A_KEY = "the value starts like an API key or token"
_HOLDS_A_KEY = "the value holds something that starts like an API key or token"
_AUTH_VALUE = "the value is a scheme and a credential, as in an Authorization header"
_URL_WITH_CREDENTIALS = "the value is a URL with credentials in it"
_GENERATED_KEY = "the value looks like a generated key"


def credential_shape(value: str, *, ids_ordinary: bool = False) -> str | None:
    """Why ``value`` looks like a literal credential by its shape, whatever names it, or None; the reason never
    repeats the value. The signs of a key:

    - it starts with a known key prefix (:data:`KEY_PREFIXES`: ``sk-``, ``nvapi-``, ``hf_``, ``glpat-``, ``AKIA``,
      a JWT's ``eyJ``, ...);
    - it is an auth scheme and a credential (:data:`AUTH_SCHEMES`, any case: ``Bearer ...``, ``basic ...``);
    - it is a URL with credentials in its user-info part (``https://user:pass@host``);
    - it holds a known key prefix after a separator (``upstream=sk-...``; after a prefix that ends in ``-`` or
      ``_``, 3 key characters; after ``AKIA`` or ``eyJ``, 12 letters or digits) or a JWT;
    - it is 24 or more letters, digits, ``-`` and ``_`` that mix upper and lower case and digits with few
      separators (a generated key, not ``Llama-3-70B-Instruct``);
    - unless ``ids_ordinary``: it holds a run of 32 or more hex characters or of 32 or more letters and digits
      mixed, or it is an all-capitals value of 12 or more characters that does not read like a variable's name
      (``LIVEKEY7F3A9C0D1E2B55``; :func:`is_env_var_name`).

    ``ids_ordinary`` is for the places where long identifiers are ordinary values: a git revision on a server's or
    an MCP server's command line or in its environment, an id in a URL's path. An absolute path (no whitespace) is
    a place, not a key: only the first three signs judge it (``HF_HOME: /scratch/hf_cache`` is kept)."""
    text = value.strip()
    if not text:
        return None
    if text.startswith(KEY_PREFIXES):
        return _STARTS_LIKE_A_KEY
    if _AUTH_SCHEME.match(text):
        return _AUTH_VALUE
    if _URL_CREDENTIALS.match(text):
        return _URL_WITH_CREDENTIALS
    if PurePath(text).is_absolute() and not any(ch.isspace() for ch in text):
        return None
    if _PREFIX_INSIDE.search(text) or _JWT.search(text):
        return _HOLDS_A_KEY
    if _generated(text):
        return _GENERATED_KEY
    if not ids_ordinary and (_HEX_RUN_32.search(text) or _mixed_run(text) or _capitals_key(text)):
        return _GENERATED_KEY
    return None


def is_env_var_name(value: str) -> bool:
    """True if ``value`` can be taken for an environment-variable name rather than a literal key.

    A name is upper case, digits and underscores (``NVIDIA_API_KEY``, ``GPT4_API_KEY``) and reads like words:
    no known key prefix (:data:`KEY_PREFIXES`), no run of five digits or of eight hex characters with digits among
    them, no word of more than 32 characters, no word alternating letters and digits (``A1B2C3``), and at most a
    third digits. Anything else is a literal key, and must never be echoed.
    """
    return bool(_UPPER_NAME.match(value)) and not value.startswith(KEY_PREFIXES) and _reads_like_words(value)


def _reads_like_words(value: str) -> bool:
    if _DIGIT_RUN.search(value):
        return False
    if any(sum(c.isdigit() for c in run) >= 2 for run in _HEX_RUN_8.findall(value)):
        return False
    digits = sum(c.isdigit() for c in value)
    if digits >= 3 and digits * 3 > len(value):
        return False
    for word in value.split("_"):
        if len(word) > _LONGEST_WORD:
            return False
        switches = sum(1 for a, b in itertools.pairwise(word) if a.isdigit() != b.isdigit())
        if switches >= 4:
            return False
    return True


def _generated(text: str) -> bool:
    """Mixed case and digits with few separators: a generated key rather than a name (``Llama-3-70B-Instruct``)."""
    if not _GENERATED.match(text):
        return False
    separators = sum(ch in "-_" for ch in text)
    return (
        any(ch.isdigit() for ch in text)
        and any(ch.islower() for ch in text)
        and any(ch.isupper() for ch in text)
        and separators * 8 <= len(text)
    )


def _mixed_run(text: str) -> bool:
    return any(
        any(c.isdigit() for c in run) and any(c.isalpha() for c in run) and not run.startswith("/")
        for run in _TOKEN_RUN.findall(text)
    )


def _capitals_key(text: str) -> bool:
    return bool(_UPPER_NAME.match(text)) and len(text) >= _SHORTEST_CAPITALS_KEY and not is_env_var_name(text)
