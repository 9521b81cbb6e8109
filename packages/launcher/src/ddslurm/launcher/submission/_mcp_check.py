"""The recipe's MCP tools, checked on the submit host before anything is written: every stdio server's command
can be found, and every tool an ``allow_tools`` names is offered by the tool config's providers.

The tools are listed in the profile's ``python_env``, by the Data Designer the client step calls them with (its own
MCP client, ``list_tool_names``): ``<python_env>/bin/ddslurm-runtime inspect``'s ``tools`` action
(:mod:`ddslurm.runtime._mcp_tools`), asked through the engine host (:mod:`ddslurm.launcher.cluster._engine_host`) as
every check that needs Data Designer is, so the launcher imports none of its engine. That process gets the submitting
shell's environment (the providers' keys are resolved from their variables there, as on the node) with Data
Designer's home in a scratch directory, its working directory. Only tool configs with ``allow_tools`` are listed: a
recipe whose tools are all allowed connects to no server at submit.

No secret is ever on a command line the check starts (every user of the submit host reads them): the listing gets
its request on its standard input, a stdio server's ``${VAR}`` values reach that server's environment only, and a
server whose command or arguments would hold a secret's value is never started (``providers`` refuses it when the
snapshot is captured; :func:`command_problems` checks it again with the one check of a captured string, before
``python_env`` is asked).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddslurm.config import ProviderSnapshot, SnapshotMCPProvider, ToolsAnswer, ToolsRequest, recipe_section
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._process import Stopped
from ddslurm.launcher.errors import InspectAnswerError
from ddslurm.providers import (
    MCP_PROVIDERS_FILE,
    Origin,
    args_secrets,
    captured_secret,
    secret_names,
    secret_values,
)
from ddslurm.runtime import engine_environment

LIST_TIMEOUT_S = 30.0
"""How long listing one provider's tools may take when its tool config sets no ``timeout_sec``."""


def command_problems(snapshot: ProviderSnapshot, env: Mapping[str, str], settings: Path) -> list[str]:
    """A stdio provider whose ``command`` is neither an absolute path to an executable file nor found on the
    shell's ``PATH`` (the job gets that ``PATH``); a relative path is refused, the node's working directory being
    another. One whose command line would hold the value of a secret of ``env`` (``providers.captured_secret``) is
    refused without the value: it would be on the process list of the submit host and of the node."""
    problems = []
    secrets = secret_values(secret_names(env, snapshot.secret_env_names()), env)
    for provider in snapshot.mcp_providers:
        command = provider.command or ""
        if provider.provider_type != "stdio":
            continue
        named = f"{settings / MCP_PROVIDERS_FILE}: MCP provider {provider.name!r}"
        held = [("command", why)] if (why := captured_secret(command, secrets, shaped=False)) else []
        held += [(f"args[{index}]", why) for index, why in args_secrets(provider.args, secrets)]
        for field, why in held:
            problems.append(f"{named}: {field} {why}; not started: its command line is seen by every user")
        if held:
            continue
        subject = f"{named}: command {command!r}"
        if os.sep in command and not Path(command).is_absolute():
            problems.append(f"{subject} is a relative path; write an absolute path or a command on PATH")
        elif os.sep in command and not (Path(command).is_file() and os.access(command, os.X_OK)):
            problems.append(f"{subject} is not an executable file; the client step starts it on the node")
        elif os.sep not in command and not shutil.which(command, path=env.get("PATH", "")):
            problems.append(f"{subject} is not found on PATH; the client step starts it on the node")
    return problems


def dd_check_tools(
    recipe: Mapping[str, Any],
    origin: Origin,
    snapshot: ProviderSnapshot,
    env: Mapping[str, str],
    settings: Path,
    runtime: Path,
    host: EngineHost = RUNTIME_PROCESS,
) -> list[str]:
    """What is wrong with the recipe's tools (one line per problem, at the recipe's field), or []. ``env``: the
    submitting shell's environment; ``settings``: Data Designer's settings directory (where the providers were
    read); ``runtime``: ``<python_env>/bin/ddslurm-runtime``, which lists the tools, asked through ``host``."""
    problems = command_problems(snapshot, env, settings)
    if problems:
        return problems
    section = recipe_section(recipe)
    base = ("data_designer",) if isinstance(recipe.get("data_designer"), Mapping) else ()
    by_name = {p.name: p for p in snapshot.mcp_providers}
    wanted: list[tuple[int, Mapping[str, Any], list[SnapshotMCPProvider]]] = []
    for index, config in enumerate(section.get("tool_configs") or []):
        if isinstance(config, Mapping) and config.get("allow_tools"):
            named = [by_name[n] for n in config.get("providers") or [] if n in by_name]
            wanted.append((index, config, named))
    if not wanted:
        return []
    listed = _list_tools([p for _, _, named in wanted for p in named], _timeout(wanted), env, runtime, host)
    if isinstance(listed, str):
        return [listed]
    for index, config, named in wanted:
        offered: set[str] = set()
        for provider in named:
            if provider.name in listed.errors:
                problems.append(
                    f"{origin.at(*base, 'tool_configs', index, 'providers')}: MCP provider {provider.name!r}: its "
                    f"tools could not be listed ({listed.errors[provider.name]}); is the server up, and does it take "
                    "the key its api_key variable holds?"
                )
            else:
                offered.update(listed.tools.get(provider.name, ()))
        if any(p.name in listed.errors for p in named):
            continue
        names = ", ".join(repr(p.name) for p in named)
        for k, tool in enumerate(config["allow_tools"]):
            if tool not in offered:
                problems.append(
                    f"{origin.at(*base, 'tool_configs', index, 'allow_tools', k)}: tool {tool!r} is not offered by "
                    f"MCP provider(s) {names} (they offer: {', '.join(sorted(offered)) or 'nothing'})"
                )
    return problems


def _timeout(wanted: list[tuple[int, Mapping[str, Any], list[SnapshotMCPProvider]]]) -> float:
    given = [c.get("timeout_sec") for _, c, _ in wanted]
    return max([float(t) for t in given if isinstance(t, int | float)] or [LIST_TIMEOUT_S])


def _list_tools(
    providers: list[SnapshotMCPProvider], timeout: float, env: Mapping[str, str], runtime: Path, host: EngineHost
) -> ToolsAnswer | str:
    """Each provider's tools as ``runtime`` (``<python_env>/bin/ddslurm-runtime``, asked through ``host``) lists
    them, or the one problem line when it could not be asked."""
    unique = list({p.name: p for p in providers}.values())
    request = ToolsRequest(snapshot=ProviderSnapshot(mcp_providers=tuple(unique)), timeout=timeout)
    budget = timeout * len(unique) + 60  # Data Designer's import and each server's start
    with tempfile.TemporaryDirectory(prefix="ddslurm-mcp-check-") as scratch:
        child = {k: v for k, v in env.items() if not k.startswith("DATA_DESIGNER_")} | engine_environment(Path(scratch))
        try:
            listing = host.ask(runtime, request, timeout_s=budget, env=child, cwd=Path(scratch)).answer
        except Stopped:
            return ToolsAnswer(tools={}, errors={p.name: f"no answer within {budget:.0f} s" for p in unique})
        except OSError as exc:
            return f"cannot run {runtime} (the profile's python_env) to list the MCP tools: {exc}"
        except InspectAnswerError as exc:
            if exc.answered:
                return f"{runtime} (the profile's python_env) could not list the MCP tools: {exc}"
            return f"the MCP tool listing of {runtime} could not run (exit code {exc.returncode}):\n{exc.tail()}"
    unnamed = {p.name: "python_env's answer does not name it" for p in unique if p.name not in listing.tools}
    return ToolsAnswer(tools=listing.tools, errors=unnamed | listing.errors)
