"""``make demo PORT=N``: the demo's local endpoint on a port a host's rules allow. Make passes a PORT given on its
command line (never one from the environment) to ``tools/demo`` as DEMO_PORT, which refuses a port that is not one
or is taken before it starts anything (no cluster, no endpoint)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _make_demo_line(*args: str, env: dict[str, str]) -> str:
    """The line ``make -n demo`` would run for ``tools/demo`` (``-n``: nothing runs)."""
    done = subprocess.run(["make", "-n", "demo", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    [line] = [line for line in done.stdout.splitlines() if "tools/demo" in line]
    return line


def test_make_passes_a_command_line_port_only() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PORT"}
    assert _make_demo_line("PORT=8123", env=env) == "DEMO_PORT='8123' tools/demo"
    assert _make_demo_line(env={**env, "PORT": "9"}) == "DEMO_PORT='' tools/demo"  # some other server's PORT


def _demo(port: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEMO_PORT": port}
    return subprocess.run([str(ROOT / "tools" / "demo")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("port", "said"), [("0", "0 is not a TCP port (1 to 65535)"),
                                            ("65536", "65536 is not a TCP port (1 to 65535)"),
                                            ("80x", "80x is not a TCP port (1 to 65535)")])  # fmt: skip
def test_tools_demo_refuses_what_is_not_a_port(port: str, said: str) -> None:
    done = _demo(port)
    assert done.returncode == 2 and done.stdout == ""  # nothing started: the endpoint's header is never printed
    assert done.stderr == f"error: PORT={port}: {said}; choose another, or leave PORT out for a free one\n"


def test_tools_demo_refuses_a_taken_port() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        done = _demo(str(port))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: PORT={port}: port {port} of 127.0.0.1 is taken (something listens on it)")
