"""Who listens on a loopback port: the kernel's socket tables (``/proc/net/tcp``, ``/proc/net/tcp6``), which give
the owner uid of every listening socket.

On a shared node another user can bind a port the moment it is free (before a server binds it, or after a server
that held it died) and answer like vLLM. The token must never reach such a listener: before a request that carries
it, :func:`check_own_listener` proves that whatever listens on the port is this user's. Another user cannot make
a socket that the kernel attributes to this uid.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ddslurm.runtime.errors import RuntimeFailure

PROC_NET = Path("/proc/net")
_LISTEN = "0A"


class ListenerNotOursError(RuntimeFailure):
    """What listens on a server's port is not this user's (another user took the port), or nothing does."""

    reason = "server_port_taken"


@dataclass(frozen=True, slots=True)
class Listener:
    address: str
    port: int
    uid: int


def _address(hex_address: str) -> str:
    """The kernel's hex address (host byte order in 32-bit words) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listeners(proc_net: Path = PROC_NET) -> Iterator[Listener]:
    """Every listening TCP socket of this network namespace, IPv4 and IPv6."""
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != _LISTEN:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            yield Listener(_address(hex_address), int(hex_port, 16), int(fields[7]))


def _covers(listener: Listener, host: str) -> bool:
    """Whether a connection to ``host`` can reach ``listener`` (its own address, or a wildcard one)."""
    address = ipaddress.ip_address(listener.address)
    target = ipaddress.ip_address(host)
    if address.is_unspecified:
        return address.version == target.version or (address.version == 6 and target.version == 4)
    mapped = getattr(address, "ipv4_mapped", None)
    return address == target or mapped == target


def check_own_listener(url: str, *, uid: int | None = None, proc_net: Path = PROC_NET) -> None:
    """Whatever listens where ``url`` points (a loopback or node address, by number) belongs to ``uid`` (this
    process's); raises :class:`ListenerNotOursError` otherwise, naming the other uid, before any token is sent.
    A URL by host name other than ``localhost`` is not a local listener and is not checked."""
    parts = urlsplit(url)
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    uid = os.getuid() if uid is None else uid
    owners = {listener.uid for listener in listeners(proc_net) if listener.port == port and _covers(listener, host)}
    if not owners:
        raise ListenerNotOursError(f"nothing listens on {host}:{port} (the server there has gone)")
    others = sorted(owners - {uid})
    if others:
        raise ListenerNotOursError(
            f"{host}:{port} is held by uid {others[0]}, not by this job's server (uid {uid}): another user took the "
            "port; nothing was sent to it"
        )
