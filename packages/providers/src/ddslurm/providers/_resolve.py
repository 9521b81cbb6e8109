"""Alias resolution: every model alias a recipe uses becomes a local deployment or a hosted provider."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ddslurm.config import (
    Deployment,
    ProviderSnapshot,
    SnapshotModel,
    SnapshotProvider,
    credential_shape,
    did_you_mean,
    is_env_var_name,
    recipe_section,
)
from ddslurm.providers._compare import same_model_config
from ddslurm.providers._mcp import describe_mcp
from ddslurm.providers._native import (
    PROVIDERS_FILE,
    NativeModelConfig,
    NativeProvider,
    NativeSettings,
    Origin,
    Step,
    field_text,
    first_definition,
)
from ddslurm.providers._secrets import (
    body_credentials,
    captured_secret,
    endpoint_key_problems,
    holds_secret,
    is_credential_header,
    is_placeholder_secret,
    redact_url,
    secret_in_tree,
    secret_names,
    secret_values,
    settings_secret_names,
)
from ddslurm.providers.errors import ResolutionError

LOCAL_PROVIDER_PREFIX = "ddslurm-local-"
LOCAL_TOKEN_ENV = "DDSLURM_LOCAL_TOKEN"
"""The API-key variable of every local provider: on the node, the attempt's own random token, which the servers
and proxies require and only the Data Designer client step's environment holds (never set on the submit host)."""

ModelComparer = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
"""Whether two model configs (plain data) are the same one; the default asks Data Designer's ``ModelConfig``."""


@dataclass(frozen=True, slots=True)
class AliasRow:
    """One line of the resolution table shown to users (never holds a secret value)."""

    alias: str
    kind: Literal["local", "hosted", "unresolved"]
    provider: str
    endpoint: str
    """The endpoint as shown: credentials in it (refused anyway) replaced by ``***``."""
    model: str
    key_env: str | None
    """The API-key variable's name; None without a key, or when ``api_key`` is a literal key (never shown)."""
    key_set: bool | None
    key_scanned: bool | None = None
    """False when the key's value is a placeholder (``EMPTY``, ``none``): attempts do not scan their files for it."""
    key_literal: bool = False
    """``api_key`` holds a literal key rather than a variable name (refused; the value is never shown)."""
    check: str | None = None
    """The reachability check's result (``ddslurm providers --check``), None when not checked."""


@dataclass(frozen=True, slots=True)
class Resolution:
    snapshot: ProviderSnapshot
    rows: tuple[AliasRow, ...]
    problems: tuple[str, ...] = ()
    """What stops a submission (:func:`describe` only; :func:`resolve` raises instead). Never holds a value."""


def _section_steps(recipe: Mapping[str, Any]) -> tuple[Step, ...]:
    return ("data_designer",) if isinstance(recipe.get("data_designer"), Mapping) else ()


def _walk_aliases(node: Any, steps: tuple[Step, ...]) -> Iterator[tuple[str, tuple[Step, ...]]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "model_alias" and isinstance(value, str):
                yield value, (*steps, key)
            else:
                yield from _walk_aliases(value, (*steps, str(key)))
    elif isinstance(node, list | tuple):
        for index, item in enumerate(node):
            yield from _walk_aliases(item, (*steps, index))


def _alias_uses(recipe: Mapping[str, Any]) -> dict[str, tuple[Step, ...]]:
    """Each model alias the recipe's columns use, with the field path of its first use."""
    steps = (*_section_steps(recipe), "columns")
    seen: dict[str, tuple[Step, ...]] = {}
    for alias, where in _walk_aliases(recipe_section(recipe).get("columns") or [], steps):
        seen.setdefault(alias, where)
    return seen


def used_aliases(recipe: Mapping[str, Any]) -> tuple[str, ...]:
    """Model aliases referenced by the recipe's columns, in order of first use."""
    return tuple(_alias_uses(recipe))


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")


def _validation_problem(origin: Origin, exc: msgspec.ValidationError) -> str:
    match = _AT.match(str(exc))
    message, path = (match.group("msg"), match.group("path") or "") if match else (str(exc), "")
    steps: list[Step] = [int(i) if i else name for name, i in _STEP.findall(path)]
    if unknown := _UNKNOWN.match(message):
        steps.append(unknown.group("name"))
        message = "unknown field (Data Designer's model configs have alias, model, provider, inference_parameters, "
        message += "skip_health_check)"
    elif missing := _MISSING.match(message):
        steps.append(missing.group("name"))
        message = "required field is missing"
    else:
        message = message.replace("`", "")
        message = message[:1].lower() + message[1:]
    return f"{origin.at(*steps)}: {message}"


def _recipe_definitions(
    recipe: Mapping[str, Any], origin: Origin
) -> tuple[tuple[tuple[NativeModelConfig, Origin], ...], list[str], set[str]]:
    """The recipe's model configs that can be read, the problems of those that cannot, and their aliases."""
    raw = recipe_section(recipe).get("model_configs") or []
    base = origin.under(*_section_steps(recipe), "model_configs")
    if not isinstance(raw, list):
        try:
            msgspec.convert(raw, tuple[NativeModelConfig, ...])
        except msgspec.ValidationError as exc:
            return (), [_validation_problem(base, exc)], set()
    found: list[tuple[NativeModelConfig, Origin]] = []
    problems: list[str] = []
    broken: set[str] = set()
    for index, entry in enumerate(raw):
        entry_origin = base.under(index)
        try:
            found.append((msgspec.convert(entry, NativeModelConfig), entry_origin))
        except msgspec.ValidationError as exc:
            problems.append(_validation_problem(entry_origin, exc))
            if isinstance(entry, Mapping) and isinstance(entry.get("alias"), str):
                broken.add(entry["alias"])
    return tuple(found), problems, broken


def _run_at(run_origin: Origin | None, *steps: Step) -> str:
    return run_origin.at(*steps) if run_origin is not None else f"the run file: {field_text(steps)}"


_HELD_ADVICE = (
    "; the run's snapshot would keep a copy: remove it (a provider's api_key names the variable that holds the key)"
)


def _held_problem(
    entry: Mapping[str, Any], origin: Origin, subject: str, secrets: Mapping[str, str], problems: list[str]
) -> None:
    """A problem for the first string of ``entry`` (a settings entry's fields, as the snapshot keeps them) that holds
    the value of one of ``secrets``, at its file, line, column and field."""
    hit = secret_in_tree(entry, secrets)
    if hit is None:
        return
    shown = ".".join(part for part in (field_text(origin.steps), hit.field) if part)
    problems.append(f"{origin.at(*hit.steps, shown=shown)}: {subject}: {holds_secret(hit.name)}{_HELD_ADVICE}")


def _check_provider(
    provider: NativeProvider,
    origin: Origin,
    env: Mapping[str, str],
    problems: list[str],
    secrets: Mapping[str, str] | None = None,
) -> None:
    """Every way a provider's settings could carry a credential into the snapshot (the value of one of
    ``secrets`` in any of its strings: :func:`~ddslurm.providers._secrets.captured_secret`); values are never
    repeated."""
    subject = f"provider {provider.name!r}"
    secrets = secrets or {}
    headers = provider.extra_headers or {}
    literal = bool(provider.api_key) and not is_env_var_name(provider.api_key or "")  # refused below as a literal
    skipped = {"extra_headers", *(["api_key"] if literal else [])}
    others = {k: v for k, v in msgspec.to_builtins(provider).items() if k not in skipped}
    _held_problem(others, origin, subject, secrets, problems)
    problems += endpoint_key_problems(
        origin.at, subject, provider.endpoint, provider.api_key, env, example="MY_PROVIDER_API_KEY"
    )
    for header, value in headers.items():
        in_name = captured_secret(header, secrets, shaped=False)
        hidden = in_name is not None or credential_shape(header) is not None
        shown = field_text((*origin.steps, "extra_headers")) + ("[<redacted>]" if hidden else f"[{header!r}]")
        where = origin.at("extra_headers", header, shown=shown)
        held = in_name or captured_secret(value, secrets, shaped=False)
        if is_credential_header(header) or (hidden and in_name is None):
            problems.append(
                f"{where}: {subject}: carries a credential; use api_key with an environment-variable name instead"
            )
        elif held is not None:
            problems.append(f"{where}: {subject}: {held}{_HELD_ADVICE}")
        elif credential_shape(value) is not None:
            problems.append(
                f"{where}: {subject}: the value looks like a credential (not shown); extra_headers are written to "
                "the run's snapshot: use api_key with an environment-variable name instead"
            )
    for path in body_credentials(provider.extra_body or {}, field_text((*origin.steps, "extra_body"))):
        problems.append(
            f"{origin.at('extra_body', shown=path)}: {subject}: carries a credential (not shown); extra_body is "
            "written to the run's snapshot: use api_key with an environment-variable name instead"
        )


def _check_model(
    model: NativeModelConfig, origin: Origin, problems: list[str], secrets: Mapping[str, str] | None = None
) -> None:
    _held_problem(msgspec.to_builtins(model), origin, f"model alias {model.alias!r}", secrets or {}, problems)
    body = (model.inference_parameters or {}).get("extra_body")
    base = field_text((*origin.steps, "inference_parameters", "extra_body"))
    for path in body_credentials(body or {}, base):
        problems.append(
            f"{origin.at('inference_parameters', 'extra_body', shown=path)}: model alias {model.alias!r}: carries a "
            "credential (not shown); extra_body is written to the run's snapshot: use the provider's api_key with "
            "an environment-variable name instead"
        )


def _existing_providers(name: str, settings: NativeSettings) -> str:
    """What a model config naming provider ``name``, which the settings do not define, is told: the providers they
    define (or that they define none, or that there is no file) and the closest one's name."""
    names = sorted({provider.name for provider, _ in settings.providers})
    if names:
        return f" (its providers: {', '.join(map(repr, names))}){did_you_mean(name, names)}"
    return " (it defines none)" if (settings.directory / PROVIDERS_FILE).is_file() else " (there is no such file)"


def describe(
    recipe: Mapping[str, Any],
    recipe_origin: Origin,
    settings: NativeSettings,
    deployments: tuple[Deployment, ...],
    env: Mapping[str, str],
    *,
    run_origin: Origin | None = None,
    same_model: ModelComparer = same_model_config,
) -> Resolution:
    """Resolve every alias the recipe uses as far as possible: a row for each alias (unresolved ones marked) and
    every problem that would stop a submission. Only aliases the recipe uses, and their providers, are checked; so
    are the MCP providers its ``tool_configs`` name (:func:`~ddslurm.providers._mcp.describe_mcp`). Every string
    the snapshot would keep of them is refused when it holds the value of a secret of ``env``
    (:func:`~ddslurm.providers._secrets.secret_names`: the settings' key variables, the deployments'
    ``server.env_from`` and every variable that looks like a credential)."""
    named = settings_secret_names(settings) | {name for dep in deployments for name in dep.server.env_from}
    secrets = secret_values(secret_names(env, named), env)
    recipe_defs, problems, broken = _recipe_definitions(recipe, recipe_origin)
    from_recipe = {origin for _, origin in recipe_defs}
    model_defs: dict[str, list[tuple[NativeModelConfig, Origin]]] = {}
    for model_def, model_origin in (*recipe_defs, *settings.models):
        model_defs.setdefault(model_def.alias, []).append((model_def, model_origin))
    provider_defs: dict[str, list[tuple[NativeProvider, Origin]]] = {}
    for provider_def, provider_origin in settings.providers:
        provider_defs.setdefault(provider_def.name, []).append((provider_def, provider_origin))

    def same_models(a: NativeModelConfig, b: NativeModelConfig) -> bool:
        return a == b or same_model(msgspec.to_builtins(a), msgspec.to_builtins(b))

    local: dict[str, tuple[int, Deployment]] = {}
    for index, dep in enumerate(deployments):
        if dep.model_alias in local:
            problems.append(
                f"{_run_at(run_origin, 'deployments', index, 'model_alias')}: model alias {dep.model_alias!r} is "
                f"already deployed by deployments[{local[dep.model_alias][0]}]; use replicas to run more copies "
                "of one model"
            )
        local.setdefault(dep.model_alias, (index, dep))
    for alias, (index, _) in local.items():
        reserved = f"{LOCAL_PROVIDER_PREFIX}{alias}"
        if reserved in provider_defs:
            problems.append(
                f"{provider_defs[reserved][0][1].at('name')}: provider name {reserved!r} is reserved for ddslurm's "
                f"local deployment of model alias {alias!r} ({_run_at(run_origin, 'deployments', index)}); "
                "rename yours"
            )

    snap_providers: dict[str, SnapshotProvider] = {}
    snap_models: list[SnapshotModel] = []
    rows: list[AliasRow] = []
    uses = _alias_uses(recipe)
    for alias, use in uses.items():
        defs = model_defs.get(alias, [])
        model_entry = first_definition("model alias", alias, defs, same_models, problems) if defs else None
        if model_entry is not None:
            _check_model(model_entry[0], model_entry[1], problems, secrets)
        if alias in local:
            dep = local[alias][1]
            pname = f"{LOCAL_PROVIDER_PREFIX}{alias}"
            served = dep.served_name
            params = model_entry[0].inference_parameters if model_entry else None
            snap_providers[pname] = SnapshotProvider(name=pname, endpoint="", api_key_env=LOCAL_TOKEN_ENV, local=True)
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
            if alias not in broken:
                known = [*local, *model_defs]  # the aliases that resolve
                problems.append(
                    f"{recipe_origin.at(*use)}: model alias {alias!r} has no deployment in the run file and no "
                    f"model config in the recipe or in {settings.directory}{did_you_mean(alias, known)}"
                )
            rows.append(AliasRow(alias, "unresolved", "-", "-", "-", None, None))
            continue
        model, origin = model_entry
        if not model.provider or model.provider not in provider_defs:
            if not model.provider:
                problems.append(f"{origin.at('provider')}: model alias {alias!r}: the model config names no provider")
            else:
                problems.append(
                    f"{origin.at('provider')}: model alias {alias!r}: provider {model.provider!r} does not exist in "
                    f"{settings.directory / PROVIDERS_FILE}{_existing_providers(model.provider, settings)}"
                )
            rows.append(AliasRow(alias, "unresolved", model.provider or "-", "-", model.model, None, None))
            continue
        provider, porigin = provider_defs[model.provider][0]
        if provider.name not in snap_providers:
            first_definition("provider", provider.name, provider_defs[provider.name], lambda a, b: a == b, problems)
            _check_provider(provider, porigin, env, problems, secrets)
            snap_providers[provider.name] = SnapshotProvider(
                name=provider.name,
                endpoint=provider.endpoint,
                provider_type=provider.provider_type,
                api_key_env=provider.api_key or None,
                extra_body=provider.extra_body,
                extra_headers=provider.extra_headers,
            )
        snap_models.append(
            SnapshotModel(
                alias=alias,
                model=model.model,
                provider=provider.name,
                inference_parameters=model.inference_parameters,
                skip_health_check=model.skip_health_check,
                source="recipe" if origin in from_recipe else "settings",
            )
        )
        rows.append(_hosted_row(alias, provider, model, env))
    undeployed = [alias for alias in uses if alias not in local]
    for alias, (index, _) in local.items():
        if alias not in uses:
            problems.append(
                f"{_run_at(run_origin, 'deployments', index, 'model_alias')}: no column of the recipe uses model "
                f"alias {alias!r}{did_you_mean(alias, undeployed) or '; remove the deployment'}"
            )
    mcp_providers, mcp_problems = describe_mcp(recipe, recipe_origin, settings, env, secrets)
    problems.extend(mcp_problems)
    snapshot = ProviderSnapshot(
        providers=tuple(snap_providers.values()), models=tuple(snap_models), mcp_providers=mcp_providers
    )
    return Resolution(snapshot=snapshot, rows=tuple(rows), problems=tuple(problems))


def _hosted_row(alias: str, provider: NativeProvider, model: NativeModelConfig, env: Mapping[str, str]) -> AliasRow:
    key = provider.api_key or None
    literal = key is not None and not is_env_var_name(key)
    key_env = None if literal else key
    value = env.get(key_env, "") if key_env else ""
    return AliasRow(
        alias,
        "hosted",
        provider.name,
        redact_url(provider.endpoint),
        model.model,
        key_env,
        bool(value) if key_env else None,
        (not is_placeholder_secret(value)) if value else None,
        literal,
    )


def resolve(
    recipe: Mapping[str, Any],
    recipe_origin: Origin,
    settings: NativeSettings,
    deployments: tuple[Deployment, ...],
    env: Mapping[str, str],
    *,
    run_origin: Origin | None = None,
    same_model: ModelComparer = same_model_config,
) -> Resolution:
    """Resolve every alias the recipe uses; raise ResolutionError listing every problem at once."""
    resolution = describe(
        recipe, recipe_origin, settings, deployments, env, run_origin=run_origin, same_model=same_model
    )
    if resolution.problems:
        raise ResolutionError(list(resolution.problems))
    return resolution
