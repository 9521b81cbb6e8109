"""Data Designer's native settings files: ``model_providers.yaml``, ``model_configs.yaml`` and
``mcp_providers.yaml``.

Both shapes are accepted: the one DD's library writes (explicit nulls) and the one its CLI writes (keys
absent). Inference parameters are kept as written, so hosted aliases keep their settings exactly.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import msgspec

from ddslurm.config import ConfigError, ConfigFileError, load_struct, locate, read_yaml
from ddslurm.providers.errors import SettingsError

PROVIDERS_FILE = "model_providers.yaml"
MODEL_CONFIGS_FILE = "model_configs.yaml"
MCP_PROVIDERS_FILE = "mcp_providers.yaml"
"""Data Designer's ``MCP_PROVIDERS_FILE_NAME``: its MCP providers, remote and stdio, under ``providers``."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class NativeProvider(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: str
    endpoint: str
    provider_type: str = "openai"
    api_key: str | None = None
    extra_body: dict[str, Any] | None = None
    extra_headers: dict[str, str] | None = None


class NativeModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    alias: str
    model: str
    provider: str | None = None
    inference_parameters: dict[str, Any] | None = None
    skip_health_check: bool = False


class NativeMCPProvider(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One entry of ``mcp_providers.yaml``: Data Designer's ``MCPProvider`` (``sse``, ``streamable_http``) or
    ``LocalStdioMCPProvider`` (``stdio``), told apart by ``provider_type`` as Data Designer tells them."""

    name: str
    provider_type: Literal["sse", "streamable_http", "stdio"]
    endpoint: str | None = None
    api_key: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None


class _MCPProvidersFile(msgspec.Struct, frozen=True, kw_only=True):
    providers: tuple[NativeMCPProvider, ...] = ()


class _ProvidersFile(msgspec.Struct, frozen=True, kw_only=True):
    providers: tuple[NativeProvider, ...] = ()


class _ModelConfigsFile(msgspec.Struct, frozen=True, kw_only=True):
    model_configs: tuple[NativeModelConfig, ...] = ()


Step = str | int


def field_text(steps: tuple[Step, ...] | list[Step]) -> str:
    """``("providers", 0, "extra_headers", "X-Title")`` → ``providers[0].extra_headers['X-Title']``."""
    out = ""
    for step in steps:
        if isinstance(step, int):
            out += f"[{step}]"
        elif _IDENTIFIER.fullmatch(step):
            out += f".{step}" if out else step
        else:
            out += f"[{step!r}]"
    return out


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a definition came from, for error messages: a file and the field path of the entry in it.

    ``placed``: for a recipe that is no file of fields (the config a builder script returned), the place in the
    user's code (``build.py:27``) where the entry at each field path was made (``("data_designer", "columns", 1)``:
    the script's ``add_column`` line); a field under one is named at that place."""

    path: Path
    line: int | None = None
    steps: tuple[Step, ...] = ()
    placed: tuple[tuple[tuple[Step, ...], str], ...] = ()

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else str(self.path)

    def under(self, *more: Step) -> Origin:
        """The entry at ``more`` under this one, in the same file (its places kept)."""
        return replace(self, steps=(*self.steps, *more))

    def _made(self, steps: tuple[Step, ...]) -> str | None:
        """The place that made the deepest entry of :attr:`placed` holding the field at ``steps``."""
        held = [(len(prefix), where) for prefix, where in self.placed if steps[: len(prefix)] == prefix]
        return max(held)[1] if held else None

    def at(self, *more: Step, shown: str | None = None) -> str:
        """``file:line:col: field`` of a field under this entry (line and column looked up in the file; in a
        builder's config, the line of the user's code that made its entry, :attr:`placed`).

        ``more`` is the path used to find the line; ``shown`` replaces its text when the deepest part is not a
        plain key (a nested ``extra_body`` path)."""
        steps = (*self.steps, *more)
        line, col = self.line, None
        if steps:
            try:
                found = locate(read_yaml(self.path), list(steps))
            except ConfigError:
                found = (None, None)
            if found[0] is not None:
                line, col = found
        made = self._made(steps) if line is None else None
        where = made if made is not None else str(self.path)
        if line is not None:
            where += f":{line}" + (f":{col}" if col is not None else "")
        text = shown if shown is not None else field_text(steps)
        return f"{where}: {text}" if text else where


def first_definition(
    what: str,
    name: str,
    definitions: list[tuple[Any, Origin]],
    same: Callable[[Any, Any], bool],
    problems: list[str],
) -> tuple[Any, Origin]:
    """The first definition of ``name``; any later one with different content is a problem naming both places."""
    first, first_origin = definitions[0]
    for other, other_origin in definitions[1:]:
        if not same(first, other):
            problems.append(
                f"{other_origin.at()}: {what} {name!r} is defined twice with different content (first at "
                f"{first_origin.at()}); keep one definition"
            )
    return first, first_origin


@dataclass(frozen=True, slots=True)
class NativeSettings:
    """Providers and model configs found in a settings directory, with their origins."""

    directory: Path
    providers: tuple[tuple[NativeProvider, Origin], ...]
    models: tuple[tuple[NativeModelConfig, Origin], ...]
    mcp_providers: tuple[tuple[NativeMCPProvider, Origin], ...] = ()


def _lower_provider_type(tree: Any) -> Any:
    if isinstance(tree, dict):
        for entry in tree.get("providers") or []:
            if isinstance(entry, dict) and isinstance(entry.get("provider_type"), str):
                entry["provider_type"] = entry["provider_type"].lower()
        if tree.get("providers") is None:
            tree["providers"] = []
    return tree


def _null_list(key: str) -> Any:
    def prepare(tree: Any) -> Any:
        if isinstance(tree, dict) and tree.get(key) is None:
            tree[key] = []
        return tree

    return prepare


def load_settings(directory: Path) -> NativeSettings:
    """Read the settings directory. Missing files mean "nothing defined there"; malformed ones are errors."""
    providers: list[tuple[NativeProvider, Origin]] = []
    models: list[tuple[NativeModelConfig, Origin]] = []
    mcp: list[tuple[NativeMCPProvider, Origin]] = []
    providers_path = directory / PROVIDERS_FILE
    models_path = directory / MODEL_CONFIGS_FILE
    mcp_path = directory / MCP_PROVIDERS_FILE
    try:
        if providers_path.is_file():
            pfile = load_struct(providers_path, _ProvidersFile, prepare=_lower_provider_type)
            providers = [(p, Origin(providers_path, steps=("providers", i))) for i, p in enumerate(pfile.providers)]
        if models_path.is_file():
            mfile = load_struct(models_path, _ModelConfigsFile, prepare=_null_list("model_configs"))
            models = [(m, Origin(models_path, steps=("model_configs", i))) for i, m in enumerate(mfile.model_configs)]
        if mcp_path.is_file():
            cfile = load_struct(mcp_path, _MCPProvidersFile, prepare=_null_list("providers"))
            mcp = [(p, Origin(mcp_path, steps=("providers", i))) for i, p in enumerate(cfile.providers)]
    except ConfigFileError as exc:
        raise SettingsError(str(exc)) from exc
    return NativeSettings(
        directory=directory, providers=tuple(providers), models=tuple(models), mcp_providers=tuple(mcp)
    )


def with_given_mcp_providers(
    settings: NativeSettings, given: Sequence[tuple[Mapping[str, Any], Origin]]
) -> NativeSettings:
    """``settings`` with the MCP providers a builder script gives ``DataDesigner(mcp_providers=...)`` first: Data
    Designer uses those when the script creates it, so they come before ``mcp_providers.yaml``'s (one of the same
    name there with other content is refused as defined twice)."""
    read = []
    for fields, origin in given:
        try:
            read.append((msgspec.convert(dict(fields), NativeMCPProvider), origin))
        except msgspec.ValidationError as exc:
            raise SettingsError(f"{origin}: an MCP provider the script gives Data Designer: {exc}") from exc
    return dataclasses.replace(settings, mcp_providers=(*read, *settings.mcp_providers))
