"""``ddslurm-runtime inspect``'s ``tools`` action: the tools each MCP provider of a snapshot offers, listed at submit
by the Data Designer of the profile's ``python_env`` (its own MCP client, ``list_tool_names``), the one the client
step will call them with. The launcher judges the names (``launcher.submission._mcp_check``); this imports Data
Designer.

The request comes on standard input (a :class:`~ddslurm.config.ToolsRequest`: the providers to list, as the
snapshot keeps them, and each one's time limit in seconds); the process runs with the submitting shell's environment
and Data Designer's home in a scratch directory, both set by the launcher. The providers are built as on the node
(:func:`ddslurm.runtime._engine.mcp_providers`): a remote one's key is resolved from its variable by Data Designer's
``EnvironmentResolver``, a stdio one's ``${VAR}`` values are read from this environment into that server's
environment only, never onto a command line. The launcher has already refused a server whose command line would
hold a secret's value; it is never started here.

The answer (a :class:`~ddslurm.config.ToolsAnswer`): ``tools`` (provider → its tool names) and ``errors``
(provider → why), each provider asked in exactly one of them (``errors``: its server's own failure, a refused key
or one past its time limit).
"""

from __future__ import annotations

import os

from ddslurm.config import ToolsAnswer, ToolsRequest


def list_tools(request: ToolsRequest) -> ToolsAnswer:
    """The ``tools`` action (see the module's docstring), with this process's environment."""
    from data_designer.engine.mcp.io import list_tool_names
    from data_designer.engine.secret_resolver import EnvironmentResolver

    from ddslurm.runtime._engine import mcp_providers  # with pyarrow: not for the other actions

    snapshot, timeout = request.snapshot, request.timeout
    resolver = EnvironmentResolver()
    tools: dict[str, tuple[str, ...]] = {}
    errors: dict[str, str] = {}
    for provider in mcp_providers(snapshot, os.environ):
        try:
            key = getattr(provider, "api_key", None)
            resolved = provider.model_copy(update={"api_key": resolver.resolve(key)}) if key else provider
            tools[provider.name] = tuple(str(name) for name in list_tool_names(resolved, timeout_sec=timeout))
        except BaseException as exc:  # the server's own failure, whatever it is (a refused key: CancelledError)
            errors[provider.name] = _why(exc)
    return ToolsAnswer(tools=tools, errors=errors)


def _why(exc: BaseException) -> str:
    """``exc`` in one line; a group of errors (the MCP client's task group) by the first error it holds."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}".rstrip(": ")
