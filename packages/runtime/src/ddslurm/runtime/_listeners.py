"""Who listens where a server's URL points: for a TCP port the kernel's socket tables (``/proc/net/tcp``,
``/proc/net/tcp6``), which give the owner uid of every listening socket; for a Unix-domain socket
(``unix:/path``, where the engine supports one) the socket file and the directory that holds it.

On a shared node another user can bind a port the moment it is free (before a server binds it, or after a server
that held it died) and answer like vLLM. The token must never reach such a listener: before a request that carries
it, :func:`check_own_listener` proves that whatever listens on the port is this user's. Another user cannot make
a socket that the kernel attributes to this uid.

A Unix-domain socket in a directory that only this uid can enter (0700) is out of every other user's reach: they
can neither connect to it nor put a socket of their own in its place. Its check is that the file is a socket
owned by this uid in such a directory.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ddslurm.runtime.errors import RuntimeFailure

PROC_NET = Path("/proc/net")
_LISTEN = "0A"
UNIX_SCHEME = "unix:"
"""``unix:/absolute/path.sock``: a listener on a Unix-domain socket (vLLM's ``--uds``)."""
UNIX_HTTP_BASE = "http://localhost"
"""The base URL of HTTP requests over a Unix-domain socket (the socket is the transport; the host is nominal)."""
MAX_SOCKET_PATH = 107
"""The longest path a Unix-domain socket can be bound at on Linux (``sun_path`` is 108 bytes with its NUL)."""


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


def unix_url(path: Path) -> str:
    """The URL of a listener on the Unix-domain socket ``path`` (absolute)."""
    return f"{UNIX_SCHEME}{path}"


def socket_path(url: str) -> Path | None:
    """The socket file of a ``unix:`` URL; None for an ``http(s)://`` one."""
    return Path(url.removeprefix(UNIX_SCHEME)) if url.startswith(UNIX_SCHEME) else None


def http_base(url: str) -> str:
    """Where HTTP requests to a listener go: the URL itself, or :data:`UNIX_HTTP_BASE` over its socket."""
    return UNIX_HTTP_BASE if url.startswith(UNIX_SCHEME) else url


def check_own_socket(path: Path, *, uid: int | None = None) -> None:
    """``path`` is a Unix-domain socket owned by ``uid`` (this process's) in a directory that ``uid`` owns and
    no one else can enter or write (mode 0700 or stricter); raises :class:`ListenerNotOursError` otherwise."""
    uid = os.getuid() if uid is None else uid
    try:
        parent = os.lstat(path.parent)
        info = os.lstat(path)
    except FileNotFoundError:
        raise ListenerNotOursError(f"nothing listens at {path} (the server there has gone)") from None
    except OSError as exc:
        raise ListenerNotOursError(f"cannot inspect {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(parent.st_mode) or parent.st_uid != uid or parent.st_mode & 0o077:
        raise ListenerNotOursError(
            f"{path.parent} (mode {stat.S_IMODE(parent.st_mode):04o}, uid {parent.st_uid}) is not a directory only "
            f"uid {uid} can enter: a socket there could be another user's; nothing was sent to it"
        )
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
        raise ListenerNotOursError(
            f"{path} is not a socket of uid {uid} (uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); "
            "nothing was sent to it"
        )


def check_own_listener(url: str, *, uid: int | None = None, proc_net: Path = PROC_NET) -> None:
    """Whatever listens where ``url`` points (a loopback or node address, by number, or a ``unix:`` socket)
    belongs to ``uid`` (this process's); raises :class:`ListenerNotOursError` otherwise, naming the other uid,
    before any token is sent. A URL by host name other than ``localhost`` is not a local listener and is not
    checked."""
    path = socket_path(url)
    if path is not None:
        check_own_socket(path, uid=uid)
        return
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
