"""MCP providers: the ones a recipe's ``tool_configs`` name, read from ``mcp_providers.yaml`` and checked for
credentials as model providers are (keys by variable name only), captured into the snapshot.

Every string of a provider the snapshot keeps (its name, command, arguments, ``env`` names and values, endpoint and
key variable's name) goes through the one check of a captured string (``captured_secret``): a secret's value in any
of them is refused at its file, line, column and field, and an argument is judged by each value it gives (split at
``=`` as ``server.extra_args`` is: ``--auth=VALUE``, ``token=VALUE``, ``--token VALUE``), since a stdio server's
arguments are on command lines every user of the submit host and of the node can read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddslurm.config import SnapshotMCPProvider, is_env_var_name, recipe_section
from ddslurm.providers._native import (
    MCP_PROVIDERS_FILE,
    NativeMCPProvider,
    NativeSettings,
    Origin,
    Step,
    field_text,
    first_definition,
)
from ddslurm.providers._secrets import (
    ENV_REF,
    args_secrets,
    captured_secret,
    endpoint_key_problems,
    held_secret,
    holds_secret,
    missing_env,
    secret_names,
    secret_values,
    settings_secret_names,
)

_SNAPSHOT_KEEPS = "; the run's snapshot would keep it"
_REMOTE_ONLY = ("endpoint", "api_key")
_STDIO_ONLY = ("command", "args", "env")


def tool_provider_uses(recipe: Mapping[str, Any]) -> dict[str, tuple[Step, ...]]:
    """Each MCP provider the recipe's ``tool_configs`` name, with the field path of its first use."""
    section = recipe_section(recipe)
    base: tuple[Step, ...] = ("data_designer",) if isinstance(recipe.get("data_designer"), Mapping) else ()
    uses: dict[str, tuple[Step, ...]] = {}
    configs = section.get("tool_configs") or []
    for i, config in enumerate(configs if isinstance(configs, list) else []):
        names = config.get("providers") if isinstance(config, Mapping) else None
        for j, name in enumerate(names if isinstance(names, list) else []):
            if isinstance(name, str):
                uses.setdefault(name, (*base, "tool_configs", i, "providers", j))
    return uses


def describe_mcp(
    recipe: Mapping[str, Any],
    recipe_origin: Origin,
    settings: NativeSettings,
    env: Mapping[str, str],
    secrets: Mapping[str, str] | None = None,
) -> tuple[tuple[SnapshotMCPProvider, ...], list[str]]:
    """The snapshot entries of the MCP providers the recipe's tools use, and every problem that stops a submission
    (a provider not configured, a literal key, a credential in ``env`` or ``args``, the value of one of ``secrets``
    (name to value: ``secret_values``; by default those of ``env`` the settings name or that look like
    credentials) in any of its strings, a key variable unset). Providers no tool config names are neither checked
    nor captured."""
    if secrets is None:
        secrets = secret_values(secret_names(env, settings_secret_names(settings)), env)
    defined: dict[str, list[tuple[NativeMCPProvider, Origin]]] = {}
    for provider, origin in settings.mcp_providers:
        defined.setdefault(provider.name, []).append((provider, origin))
    captured: list[SnapshotMCPProvider] = []
    problems: list[str] = []
    for name, use in tool_provider_uses(recipe).items():
        if name not in defined:
            problems.append(
                f"{recipe_origin.at(*use)}: MCP provider {name!r} does not exist in "
                f"{settings.directory / MCP_PROVIDERS_FILE}"
            )
            continue
        provider, origin = first_definition("MCP provider", name, defined[name], lambda a, b: a == b, problems)
        snapshot = _checked(provider, origin, env, secrets, problems)
        if snapshot is not None:
            captured.append(snapshot)
    return tuple(captured), problems


def _checked(
    provider: NativeMCPProvider,
    origin: Origin,
    env: Mapping[str, str],
    secrets: Mapping[str, str],
    problems: list[str],
) -> SnapshotMCPProvider | None:
    """The provider as the snapshot keeps it, after its problems are added to ``problems`` (None if it has any)."""
    before = len(problems)
    subject = f"MCP provider {provider.name!r}"
    remote = provider.provider_type != "stdio"
    key_literal = bool(provider.api_key) and not is_env_var_name(provider.api_key or "")  # refused below
    for field in ("name", "endpoint", "command", *([] if key_literal else ["api_key"])):
        text = getattr(provider, field)
        if text and (held := held_secret(text, secrets)) is not None:
            problems.append(f"{origin.at(field)}: {subject}: {holds_secret(held)}{_SNAPSHOT_KEEPS}")
    for field in _STDIO_ONLY if remote else _REMOTE_ONLY:
        if getattr(provider, field):
            problems.append(f"{origin.at(field)}: {subject}: not a field of a {provider.provider_type} provider")
    env_from: dict[str, str] = {}
    literal: dict[str, str] = {}
    if remote:
        if not provider.endpoint:
            problems.append(f"{origin.at('endpoint')}: {subject}: a {provider.provider_type} provider needs one")
        at = origin.at
        problems += endpoint_key_problems(at, subject, provider.endpoint or "", provider.api_key, env, "MY_MCP_API_KEY")
    else:
        if not provider.command:
            problems.append(f"{origin.at('command')}: {subject}: a stdio provider needs one")
        for index, why in args_secrets(provider.args, secrets):
            problems.append(
                f"{origin.at('args', index)}: {subject}: {why}; a server's arguments are written to the run's "
                "snapshot and are on command lines every user of the submit host and of the node can read: give it "
                "through env as ${VAR}"
            )
        for key, value in (provider.env or {}).items():
            if (held := held_secret(key, secrets)) is not None:
                shown = field_text((*origin.steps, "env")) + "[<redacted>]"
                problems.append(f"{origin.at('env', shown=shown)}: {subject}: {holds_secret(held)}{_SNAPSHOT_KEEPS}")
                continue
            if ref := ENV_REF.match(value):
                env_from[key] = ref.group("name")
                if missing_env([ref.group("name")], env):
                    problems.append(
                        f"{origin.at('env', key)}: {subject}: environment variable {ref.group('name')} is unset "
                        "or empty in this shell; export it before submitting"
                    )
            elif "${" in value:
                problems.append(
                    f"{origin.at('env', key)}: {subject}: a variable is named by the whole value, written "
                    "${VAR}; nothing else is expanded"
                )
            elif (reason := captured_secret(value, secrets, name=key)) is not None:
                problems.append(
                    f"{origin.at('env', key)}: {subject}: {reason}; env is written to the run's snapshot: put the "
                    "value in an environment variable and write ${VAR} here"
                )
            else:
                literal[key] = value
    if len(problems) > before:
        return None
    return SnapshotMCPProvider(
        name=provider.name,
        provider_type=provider.provider_type,
        endpoint=provider.endpoint if remote else None,
        api_key_env=provider.api_key or None,
        command=provider.command,
        args=provider.args,
        env=literal,
        env_from=env_from,
    )
