"""Secrets of a run: API keys travel as environment-variable names; credentials never sit in settings.

Nothing here returns or formats a value that might be a key: callers get booleans, field paths and reasons. Which
values look like a literal key, and which are a variable's name, is decided by config's one secret policy
(:func:`ddslurm.config.credential_shape`, :func:`ddslurm.config.is_env_var_name`); this module keeps no rule of
shape of its own.

Every string ddslurm captures into a run (the snapshot's providers and MCP servers, the run file, the recipe, the
seed) is judged by one check, :func:`captured_secret`: it must not hold the value of any secret of the
submitting shell (:func:`secret_names`: the variables the providers' ``api_key``, the MCP servers' ``api_key`` and
``${VAR}`` values and the deployments' ``server.env_from`` name, and every variable whose name or value looks like a
credential), then, where a field has one, the key-shape rule of its kind. What a process the user's code runs in
prints is shown through :func:`redact`, for the same secrets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ddslurm.config import arg_values, credential_shape, is_env_var_name, named_credential

if TYPE_CHECKING:
    from ddslurm.providers._native import NativeSettings

_CREDENTIAL_HEADERS = {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"}
_CREDENTIAL_HEADER_WORDS = re.compile(
    r"(token|secret|passw(or)?d|passphrase|credential|auth|bearer|jwt|assertion|session|signature|cookie|apikey"
    r"|(^|[-_])(keys?|pass|pwd|sig)($|[-_]))",
    re.I,
)

# Keys of extra_body (and of URL queries): "token" alone is no sign (max_tokens, budget_tokens, stop_token_ids).
_CREDENTIAL_KEY_WORDS = {
    "apikey",
    "apikeys",
    "secret",
    "secrets",
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "credential",
    "credentials",
    "authorization",
    "auth",
    "bearer",
    "jwt",
    "cookie",
    "signature",
    "sig",
}
_KEY_QUALIFIERS = {"api", "secret", "private", "access", "auth", "client", "session", "subscription", "x"}
_NOT_A_CREDENTIAL_TOKEN = {"max", "min", "budget", "stop", "special", "bos", "eos", "pad", "unk", "sep", "cls", "mask"}
_QUERY_CREDENTIAL_NAMES = {"key", "keys", "token", "code", "sig"}

PLACEHOLDER_MIN_LENGTH = 8
"""Key values shorter than this are placeholders (``none``, ``EMPTY``, ``dummy``), not secrets to scan for."""
PLACEHOLDER_VALUES = frozenset(
    {
        "none",
        "null",
        "nil",
        "empty",
        "dummy",
        "dummy-key",
        "fake",
        "fake-key",
        "placeholder",
        "not-needed",
        "not_needed",
        "notneeded",
        "not-used",
        "unused",
        "no-key",
        "nokey",
        "no-key-required",
        "sk-no-key-required",
        "sk-dummy",
        "sk-fake",
        "sk-xxx",
        "sk-empty",
        "anything",
        "changeme",
        "your-api-key",
        "your_api_key",
        "api-key",
        "api_key",
        "apikey",
        "token",
        "secret",
        "password",
        "ollama",
        "lm-studio",
        "lmstudio",
        "vllm",
        "local",
        "test",
        "testing",
        "xxx",
    }
)


def is_credential_header(name: str) -> bool:
    """A header name that carries a credential (``Authorization``, ``X-API-Keys``, ``X-JWT-Assertion``, ...)."""
    lowered = name.strip().lower()
    return lowered in _CREDENTIAL_HEADERS or bool(_CREDENTIAL_HEADER_WORDS.search(lowered))


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.strip())
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_credential_key(name: str) -> bool:
    """A key of ``extra_body`` or of a URL query that names a credential (``api_key``, ``access_token``,
    ``client_secret``, ``password``, ``Authorization``); ``max_tokens`` and ``budget_tokens`` are not."""
    words = _words(name)
    if not words:
        return False
    if any(w in _CREDENTIAL_KEY_WORDS for w in words):
        return True
    last = words[-1]
    before = words[-2] if len(words) > 1 else ""
    if last in {"key", "keys"}:
        return len(words) == 1 or before in _KEY_QUALIFIERS
    if last == "token":
        return before not in _NOT_A_CREDENTIAL_TOKEN
    return any(w.endswith("password") or w.endswith("secret") or w.endswith("apikey") for w in words)


def _path_holds_key(path: str) -> bool:
    """A segment of a URL's path (or fragment) that looks like a key; ids are ordinary there."""
    return any(credential_shape(segment, ids_ordinary=True) is not None for segment in path.split("/"))


def url_credentials(url: str) -> str | None:
    """Why ``url`` carries a credential (user-info, a credential query parameter, a key in its path), else None.
    The reason names the part, never its value."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "it is not a valid URL"
    if "@" in parts.netloc:
        return "the URL carries credentials in its user-info part (before '@')"
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if is_credential_key(name) or (_words(name) or [""])[-1] in _QUERY_CREDENTIAL_NAMES:
            return f"query parameter {_safe_key(name)} carries a credential"
        if credential_shape(value) is not None:
            return f"query parameter {_safe_key(name)} holds a value that looks like a credential"
    if _path_holds_key(parts.path) or _path_holds_key(parts.fragment):
        return "the URL's path looks like it holds a key"
    return None


def redact_url(url: str) -> str:
    """``url`` for display: user-info, query and path replaced by ``***`` when they carry a credential."""
    if url_credentials(url) is None:
        return url
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "***"
    host = parts.netloc.rsplit("@", 1)[-1]
    path = "/***" if _path_holds_key(parts.path) else parts.path
    return urlunsplit((parts.scheme, host, path, "***" if parts.query else "", ""))


def _safe_key(name: str) -> str:
    return "<redacted>" if credential_shape(name) is not None else repr(name)


def _child(path: str, key: str) -> str:
    if credential_shape(key) is not None:
        return f"{path}[<redacted>]"
    return f"{path}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else f"{path}[{key!r}]"


def body_credentials(tree: Any, path: str) -> list[str]:
    """Field paths under ``tree`` (an ``extra_body``) whose key names a credential or whose string value looks
    like one; nested mappings and lists are searched. A credential key is reported once, not descended into."""
    found: list[str] = []
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            where = _child(path, str(key))
            if is_credential_key(str(key)) or credential_shape(str(key)) is not None:
                found.append(where)
            else:
                found.extend(body_credentials(value, where))
    elif isinstance(tree, list | tuple):
        for index, item in enumerate(tree):
            found.extend(body_credentials(item, f"{path}[{index}]"))
    elif isinstance(tree, str) and credential_shape(tree) is not None:
        found.append(path)
    return found


def is_placeholder_secret(value: str) -> bool:
    """A key value that local OpenAI-compatible servers accept as "no key" (``none``, ``EMPTY``, ``dummy``):
    shorter than PLACEHOLDER_MIN_LENGTH or a known placeholder. Such values occur in ordinary output (Data
    Designer writes ``"with_trace": "none"``), so scanning for them would fail every attempt."""
    stripped = value.strip()
    return len(stripped) < PLACEHOLDER_MIN_LENGTH or stripped.lower() in PLACEHOLDER_VALUES


def placeholder_secrets(names: Iterable[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """The names among ``names`` whose value in ``env`` is set and a placeholder (not scanned for on the node)."""
    return tuple(n for n in names if env.get(n) and is_placeholder_secret(env[n]))


def missing_env(names: tuple[str, ...] | list[str], env: Mapping[str, str]) -> list[str]:
    """Names whose variable is unset or empty in ``env``."""
    return [n for n in names if not env.get(n)]


def endpoint_key_problems(
    at: Callable[[str], str], subject: str, endpoint: str, api_key: str | None, env: Mapping[str, str], example: str
) -> list[str]:
    """What is wrong with a provider's ``endpoint`` and ``api_key`` (a credential in the URL, a literal key, a key
    variable unset in ``env``), each placed by ``at(field)``; ``example``: a variable name to suggest."""
    problems = []
    why = url_credentials(endpoint)
    if why is not None:
        problems.append(
            f"{at('endpoint')}: {subject}: {why}; write the bare base URL here and give the key through "
            "api_key (the NAME of an environment variable)"
        )
    if api_key:
        if not is_env_var_name(api_key):
            problems.append(
                f"{at('api_key')}: {subject}: looks like a literal key (not shown); put the key in an "
                f"environment variable and write its NAME here (e.g. api_key: {example})"
            )
        elif missing_env([api_key], env):
            problems.append(
                f"{at('api_key')}: {subject}: environment variable {api_key} is unset or empty in "
                "this shell; export it before submitting"
            )
    return problems


@dataclass(frozen=True, slots=True)
class SecretHit:
    """Where a secret's value sits in a parsed file: the variable's name and the steps (mapping keys, list
    indexes) to the string that holds it; ``in_key`` when that string is a mapping's key (the steps end at the
    mapping). Never the value."""

    name: str
    steps: tuple[str | int, ...]
    in_key: bool = False

    @property
    def field(self) -> str:
        """The steps as a field path (``data_designer.columns[1].prompt``); a key that might be a credential,
        and the key that holds the secret, shown as ``[<redacted>]``."""
        path = ""
        for step in self.steps:
            path = f"{path}[{step}]" if isinstance(step, int) else _child(path, str(step))
        if self.in_key:
            path += "[<redacted>]"
        return path.removeprefix(".")


def secret_in_tree(tree: Any, secrets: Mapping[str, str]) -> SecretHit | None:
    """The first string of ``tree`` (mapping keys and values at any depth, lists included) that contains the
    value of one of ``secrets`` (name to value), or None (:func:`held_secret` of each string). Values are searched
    as given: pass only real secrets (not placeholders such as ``EMPTY``)."""
    values = {name: value for name, value in secrets.items() if value}

    def held(text: str) -> str | None:
        return held_secret(text, values)

    def walk(node: Any, steps: tuple[str | int, ...]) -> SecretHit | None:
        if isinstance(node, str):
            name = held(node)
            return None if name is None else SecretHit(name, steps)
        if isinstance(node, Mapping):
            for key, value in node.items():
                name = held(str(key))
                if name is not None:
                    return SecretHit(name, steps, in_key=True)
                found = walk(value, (*steps, str(key)))
                if found is not None:
                    return found
        elif isinstance(node, list | tuple):
            for index, item in enumerate(node):
                found = walk(item, (*steps, index))
                if found is not None:
                    return found
        return None

    return walk(tree, ()) if values else None


ENV_REF = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}$")
"""A whole value written ``${VAR}``: it names the variable that holds it (an MCP stdio server's ``env``)."""


def holds_secret(name: str) -> str:
    """How every refusal of a secret's value says it (never the value)."""
    return f"holds the value of ${name}, a secret (values are not shown)"


def held_secret(text: str, secrets: Mapping[str, str]) -> str | None:
    """The name of the first of ``secrets`` (name to value, by name) whose value ``text`` contains, or None."""
    return next((name for name, value in sorted(secrets.items()) if value and value in text), None)


def captured_secret(
    value: str, secrets: Mapping[str, str], *, name: str | None = None, shaped: bool = True
) -> str | None:
    """Why ``value``, a string ddslurm would capture into a run (its snapshot, plan or inputs, or a command line
    it starts), must not be captured, or None. The one check every captured string goes through:

    - it holds the value of one of ``secrets`` (name to value: :func:`secret_values`), whatever its shape;
    - given under ``name`` (a variable, a flag without its dashes, ``name=`` of an argument), a name that says it
      holds a credential with a value of 8 characters or more, or a value that looks like a key (as
      ``server_env_secret`` judges ``server.env``);
    - else, unless ``shaped`` is false (prose: a prompt, a comment), a value that looks like a key
      (``credential_shape`` where ids are ordinary, as in ``server.env``).

    The reason says which secret by its variable's name, or why it looks like one; never the value."""
    held = held_secret(value, secrets)
    if held is not None:
        return holds_secret(held)
    if name is not None:
        why = "its name says it holds a credential" if named_credential(name, value) else _shape(value)
    else:
        why = _shape(value) if shaped else None
    return None if why is None else f"looks like a secret ({why}; not shown)"


def _shape(value: str) -> str | None:
    """The secret policy's judgment of a captured value: a command line's or an environment's, where ids such as a
    git revision are ordinary (as in ``server.extra_args`` and ``server.env``)."""
    return credential_shape(value, ids_ordinary=True)


def args_secrets(args: Sequence[str], secrets: Mapping[str, str]) -> list[tuple[int, str]]:
    """Each item of the command-line arguments ``args`` that :func:`captured_secret` refuses, with why: the item
    whole (a secret's value anywhere in it), then each value it gives under its flag or name, split at ``=`` as
    ``server.extra_args`` is (``--auth=VALUE``, ``token=VALUE``, ``--token VALUE``: ``arg_values``). One reason
    per item, in order."""
    found: dict[int, str] = {}
    for index, item in enumerate(args):
        held = held_secret(item, secrets)
        if held is not None:
            found[index] = holds_secret(held)
    for arg in arg_values(args):
        why = captured_secret(arg.value, secrets, name=arg.name if arg.flag else None)
        if why is not None and arg.at not in found:
            found[arg.at] = why
    return sorted(found.items())


def secret_names(env: Mapping[str, str], named: Iterable[str] = (), *, kept: Collection[str] = ()) -> set[str]:
    """The variables of ``env`` that hold secrets: those ``named`` (the API-key variables of the providers, the MCP
    servers' key variables, the deployments' ``server.env_from``: :func:`settings_secret_names`) and every other,
    but ``kept``, whose name or value looks like a credential. An absolute path is never a credential by its
    variable's name (``PWD``, ``SSH_AUTH_SOCK``, ``GOOGLE_APPLICATION_CREDENTIALS``), and a value with a path
    separator is judged as one where ids are ordinary (``credential_shape(..., ids_ordinary=True)``): paths merely
    hold long names."""
    names = set(named)
    for name, value in env.items():
        if name in kept:
            continue
        place = PurePath(value.strip()).is_absolute()  # a place, not a key, whatever its variable is called
        by_name = is_credential_key(name) and len(value) >= PLACEHOLDER_MIN_LENGTH and not place
        by_value = credential_shape(value, ids_ordinary=os.sep in value) is not None
        if by_name or by_value or named_credential(name, value):
            names.add(name)
    return {name for name in names if name in env}


def secret_values(names: Iterable[str], env: Mapping[str, str]) -> dict[str, str]:
    """The values of ``names`` in ``env`` that are secrets, by name: placeholders (``EMPTY``, ``none``, values under
    8 characters: :func:`is_placeholder_secret`) left out, as the node's scan leaves them out."""
    return {name: env[name] for name in names if env.get(name) and not is_placeholder_secret(env[name])}


def settings_secret_names(settings: NativeSettings) -> set[str]:
    """The variables Data Designer's settings name as holding keys: every model provider's ``api_key``, every MCP
    provider's ``api_key`` and every variable a stdio server's ``env`` names (``${VAR}``); literal keys (refused
    anyway) are not names."""
    names = {p.api_key for p, _ in settings.providers if p.api_key and is_env_var_name(p.api_key)}
    for mcp, _ in settings.mcp_providers:
        if mcp.api_key and is_env_var_name(mcp.api_key):
            names.add(mcp.api_key)
        names |= {ref.group("name") for value in (mcp.env or {}).values() if (ref := ENV_REF.match(value))}
    return names


def redact(text: str, secrets: Mapping[str, str]) -> str:
    """``text`` with the value of each of ``secrets`` (name to value; the longest first) replaced by
    ``<$NAME redacted>``: what a process that runs the user's code printed, before it is shown or put in JSON."""
    for name, value in sorted(secrets.items(), key=lambda item: (-len(item[1]), item[0])):
        if value:
            text = text.replace(value, f"<${name} redacted>")
    return text
