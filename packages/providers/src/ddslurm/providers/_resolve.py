"""Alias resolution: every model alias a recipe uses becomes a local deployment or a hosted provider."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ddslurm.config import Deployment, ProviderSnapshot, SnapshotModel, SnapshotProvider
from ddslurm.providers._native import NativeModelConfig, NativeProvider, NativeSettings, Origin
from ddslurm.providers._secrets import is_credential_header, is_env_var_name, missing_env
from ddslurm.providers.errors import ResolutionError

LOCAL_PROVIDER_PREFIX = "ddslurm-local-"


@dataclass(frozen=True, slots=True)
class AliasRow:
    """One line of the resolution table shown to users (never holds a secret value)."""

    alias: str
    kind: Literal["local", "hosted"]
    provider: str
    endpoint: str
    model: str
    key_env: str | None
    key_set: bool | None


@dataclass(frozen=True, slots=True)
class Resolution:
    snapshot: ProviderSnapshot
    rows: tuple[AliasRow, ...]


def recipe_section(recipe: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``data_designer`` section of a recipe (DD's full format) or the recipe itself (shorthand)."""
    section = recipe.get("data_designer")
    return section if isinstance(section, Mapping) else recipe


def _walk_aliases(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "model_alias" and isinstance(value, str):
                yield value
            else:
                yield from _walk_aliases(value)
    elif isinstance(node, list | tuple):
        for item in node:
            yield from _walk_aliases(item)


def used_aliases(recipe: Mapping[str, Any]) -> tuple[str, ...]:
    """Model aliases referenced by the recipe's columns, in order of first use."""
    seen: dict[str, None] = {}
    for alias in _walk_aliases(recipe_section(recipe).get("columns") or []):
        seen.setdefault(alias, None)
    return tuple(seen)


def recipe_models(recipe: Mapping[str, Any], origin: Origin) -> tuple[tuple[NativeModelConfig, Origin], ...]:
    raw = recipe_section(recipe).get("model_configs") or []
    try:
        models = msgspec.convert(raw, tuple[NativeModelConfig, ...])
    except msgspec.ValidationError as exc:
        raise ResolutionError([f"{origin}: model_configs: {exc}"]) from exc
    return tuple((m, origin) for m in models)


def _unique(
    items: tuple[tuple[Any, Origin], ...], key: str, what: str, problems: list[str]
) -> dict[str, tuple[Any, Origin]]:
    found: dict[str, tuple[Any, Origin]] = {}
    for item, origin in items:
        name = getattr(item, key)
        if name in found and found[name][0] != item:
            problems.append(
                f"{what} {name!r} is defined twice with different content ({found[name][1]} and {origin}); "
                "keep one definition"
            )
            continue
        found.setdefault(name, (item, origin))
    return found


def _check_provider(provider: NativeProvider, origin: Origin, env: Mapping[str, str], problems: list[str]) -> None:
    if provider.api_key:
        if not is_env_var_name(provider.api_key):
            problems.append(
                f"provider {provider.name!r} ({origin}): api_key looks like a literal key; put the key in an "
                "environment variable and write its NAME here (e.g. api_key: MY_PROVIDER_API_KEY)"
            )
        elif missing_env([provider.api_key], env):
            problems.append(
                f"provider {provider.name!r} ({origin}): environment variable {provider.api_key} is unset or "
                "empty in this shell; export it before submitting"
            )
    for header in provider.extra_headers or {}:
        if is_credential_header(header):
            problems.append(
                f"provider {provider.name!r} ({origin}): extra_headers[{header!r}] carries a credential; use "
                "api_key with an environment-variable name instead"
            )


def resolve(
    recipe: Mapping[str, Any],
    recipe_origin: Origin,
    settings: NativeSettings,
    deployments: tuple[Deployment, ...],
    env: Mapping[str, str],
) -> Resolution:
    """Resolve every alias the recipe uses; raise ResolutionError listing every problem at once."""
    problems: list[str] = []
    models = _unique((*recipe_models(recipe, recipe_origin), *settings.models), "alias", "model alias", problems)
    providers = _unique(settings.providers, "name", "provider", problems)
    local: dict[str, Deployment] = {}
    for index, dep in enumerate(deployments):
        if dep.model_alias in local:
            problems.append(
                f"deployments[{index}]: model alias {dep.model_alias!r} is already deployed by an earlier entry; "
                "use replicas to run more copies of one model"
            )
        local.setdefault(dep.model_alias, dep)
    for name in (f"{LOCAL_PROVIDER_PREFIX}{a}" for a in local):
        if name in providers:
            problems.append(f"provider name {name!r} is reserved for ddslurm's local deployments; rename yours")

    snap_providers: dict[str, SnapshotProvider] = {}
    snap_models: list[SnapshotModel] = []
    rows: list[AliasRow] = []
    for alias in used_aliases(recipe):
        model_entry = models.get(alias)
        if alias in local:
            dep = local[alias]
            pname = f"{LOCAL_PROVIDER_PREFIX}{alias}"
            served = dep.served_model_name or dep.model
            params = model_entry[0].inference_parameters if model_entry else None
            snap_providers[pname] = SnapshotProvider(name=pname, endpoint="", local=True)
            snap_models.append(
                SnapshotModel(
                    alias=alias,
                    model=served,
                    provider=pname,
                    inference_parameters=params,
                    source="deployment",
                )
            )
            rows.append(AliasRow(alias, "local", pname, "(started in the job)", served, None, None))
            continue
        if model_entry is None:
            problems.append(
                f"model alias {alias!r} has no deployment in the run file and no model config in the recipe or "
                f"in {settings.directory}"
            )
            continue
        model, origin = model_entry
        if not model.provider:
            problems.append(f"model alias {alias!r} ({origin}): model config names no provider")
            continue
        if model.provider not in providers:
            problems.append(
                f"model alias {alias!r} ({origin}): provider {model.provider!r} does not exist in "
                f"{settings.directory / 'model_providers.yaml'}"
            )
            continue
        provider, porigin = providers[model.provider]
        if provider.name not in snap_providers:
            _check_provider(provider, porigin, env, problems)
            snap_providers[provider.name] = SnapshotProvider(
                name=provider.name,
                endpoint=provider.endpoint,
                provider_type=provider.provider_type,
                api_key_env=provider.api_key or None,
                extra_body=provider.extra_body,
                extra_headers=provider.extra_headers,
            )
        source: Literal["recipe", "settings"] = "recipe" if origin == recipe_origin else "settings"
        snap_models.append(
            SnapshotModel(
                alias=alias,
                model=model.model,
                provider=provider.name,
                inference_parameters=model.inference_parameters,
                skip_health_check=model.skip_health_check,
                source=source,
            )
        )
        key = provider.api_key or None
        rows.append(
            AliasRow(
                alias,
                "hosted",
                provider.name,
                provider.endpoint,
                model.model,
                key,
                bool(env.get(key)) if key else None,
            )
        )
    for alias in local:
        if alias not in {r.alias for r in rows}:
            problems.append(f"deployment for model alias {alias!r}: no column of the recipe uses this alias")
    if problems:
        raise ResolutionError(problems)
    snapshot = ProviderSnapshot(providers=tuple(snap_providers.values()), models=tuple(snap_models))
    return Resolution(snapshot=snapshot, rows=tuple(rows))
