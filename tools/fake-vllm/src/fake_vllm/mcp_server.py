"""A real MCP server for tests, built with the ``mcp`` package (FastMCP): one tool, every call logged.

The tool (named by ``--tool``) takes a ``term`` and returns ``<tool> says: <term>``; each call appends one JSON
line to ``--log``: ``tool``, ``arguments`` and ``env_sha256``, the sha256 of each ``--log-env`` variable's value
(a test sees what the server got, and the value is never written). Over stdio it serves its parent process; over
``streamable-http`` or ``sse`` it listens on ``--host``/``--port`` and, with ``--key-env VAR``, answers only
requests that carry ``Authorization: Bearer <value of VAR>`` (the key comes through the environment, never the
command line).

    python -m fake_vllm.mcp_server --tool lookup --log calls.jsonl                              # stdio
    KEY=... python -m fake_vllm.mcp_server --transport streamable-http --port 8123 --key-env KEY --log calls.jsonl

In tests: :func:`stdio_command` (what a stdio provider runs) and :func:`start_remote` (a remote server on a free
loopback port, stopped on exit).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fake_vllm.testing import ServerStartError, _stop, child_environment, free_port

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def tool_output(tool: str, term: str) -> str:
    """What the tool ``tool`` answers for ``term``."""
    return f"{tool} says: {term}"


def build(tool: str, log: Path, host: str = "127.0.0.1", port: int = 8000, log_env: Sequence[str] = ()) -> Any:
    """The FastMCP server with its one tool."""
    from mcp.server.fastmcp import FastMCP

    server = FastMCP("ddslurm-test-mcp", host=host, port=port)

    def call(term: str) -> str:
        digests = {name: hashlib.sha256(os.environ.get(name, "").encode()).hexdigest() for name in log_env}
        with log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": tool, "arguments": {"term": term}, "env_sha256": digests}) + "\n")
        return tool_output(tool, term)

    server.add_tool(call, name=tool, description=f"Look a term up ({tool}).")
    return server


def require_key(app: App, key: str) -> App:
    """``app`` behind a bearer-key check: HTTP requests without ``Authorization: Bearer <key>`` get 401."""
    expected = f"Bearer {key}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send(
                    {"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]}
                )
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


def calls(log: Path) -> list[dict[str, Any]]:
    """The calls a server logged to ``log`` (none if it has not written it)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]


def stdio_command(tool: str, log: Path, log_env: Sequence[str] = ()) -> tuple[str, list[str]]:
    """The command and arguments of a stdio server of ``tool`` that logs to ``log``."""
    logged = [arg for name in log_env for arg in ("--log-env", name)]
    return sys.executable, ["-m", "fake_vllm.mcp_server", "--tool", tool, "--log", str(log), *logged]


@dataclass(frozen=True)
class RemoteMCP:
    proc: subprocess.Popen[bytes]
    endpoint: str
    log: Path


@contextlib.contextmanager
def start_remote(
    tool: str,
    log: Path,
    *,
    key_env: str | None = None,
    env: Mapping[str, str] | None = None,
    transport: Literal["streamable-http", "sse"] = "streamable-http",
    timeout: float = 30.0,
) -> Iterator[RemoteMCP]:
    """A remote server of ``tool`` on a free loopback port until the block ends; ``key_env``: the variable of
    ``env`` (given to the child) that holds the key it requires."""
    port = free_port()
    command = [sys.executable, "-m", "fake_vllm.mcp_server", "--transport", transport, "--tool", tool]
    command += ["--log", str(log), "--port", str(port), *(["--key-env", key_env] if key_env else [])]
    output = log.with_name(log.name + ".out")
    with output.open("wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=child_environment(env))
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ServerStartError(f"the MCP server did not start:\n{output.read_text(errors='replace')[-4000:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        path = "/mcp" if transport == "streamable-http" else "/sse"
        yield RemoteMCP(proc=proc, endpoint=f"http://127.0.0.1:{port}{path}", log=log)
    finally:
        _stop(proc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fake_vllm.mcp_server", description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("stdio", "streamable-http", "sse"), default="stdio")
    parser.add_argument("--tool", default="lookup")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--key-env", help="the variable that holds the key remote clients must send")
    parser.add_argument("--log-env", action="append", default=[], help="log the sha256 of this variable's value")
    args = parser.parse_args(argv)
    server = build(args.tool, args.log, args.host, args.port, args.log_env)
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    import uvicorn

    app = server.streamable_http_app() if args.transport == "streamable-http" else server.sse_app()
    if args.key_env:
        key = os.environ.get(args.key_env, "")
        if not key:
            print(f"{args.key_env} is unset or empty", file=sys.stderr)
            return 2
        app = require_key(app, key)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
