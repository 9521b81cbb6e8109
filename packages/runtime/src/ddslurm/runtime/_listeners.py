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

The rendezvous of a replica that spans nodes (the engine's own port on the leader's node, where its ranks meet) has
no secret, and its port is on the leader's command line: another user can connect to it and claim a rank. The same
tables show every connection to it: :func:`check_rendezvous` finds another user's socket on this node connected to
it, and a peer that is not one of the allocation's nodes.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ddslurm.runtime.errors import RuntimeFailure

PORT_CLAIM = "\0ddslurm-port-%s-%d"
"""The abstract Unix-domain name that claims a port node-wide (``PORT_CLAIM % (host, port)``): every claimant of a
port uses it, the controller's :class:`~ddslurm.runtime._ports.PortClaims` and an SGLang follower's program
(:data:`~ddslurm.runtime._follower_port.SGLANG_FOLLOWER_CHECK`), so the two see each other's claims."""

PROC_NET = Path("/proc/net")
_LISTEN = "0A"
_GONE = frozenset({"06", "07"})
"""``TIME_WAIT`` (the kernel's own, shown as uid 0 whoever had it) and ``CLOSE``: no process holds them."""
TRUSTED_UIDS = frozenset({0})
"""Besides this user: root, who can read every process's memory anyway (a monitoring agent's probe is no joiner)."""
UNIX_SCHEME = "unix:"
"""``unix:/absolute/path.sock``: a listener on a Unix-domain socket (vLLM's ``--uds``)."""
UNIX_HTTP_BASE = "http://localhost"
"""The base URL of HTTP requests over a Unix-domain socket (the socket is the transport; the host is nominal)."""
MAX_SOCKET_PATH = 107
"""The longest path a Unix-domain socket can be bound at on Linux (``sun_path`` is 108 bytes with its NUL)."""


class ListenerNotOursError(RuntimeFailure):
    """What listens on a server's port is not this user's (another user took the port), or nothing does."""

    reason = "server_port_taken"


class NothingListensError(ListenerNotOursError):
    """Nothing listens where a server's URL points (yet: still loading; or any more: it died)."""


class RendezvousIntruderError(RuntimeFailure):
    """Another user's process is connected to the rendezvous of a replica that spans nodes (or a host outside the
    allocation is): the engine could take it for one of its ranks. The replica is stopped, never served."""

    reason = "rendezvous_intruder"


@dataclass(frozen=True, slots=True)
class Listener:
    address: str
    port: int
    uid: int


@dataclass(frozen=True, slots=True)
class TcpSocket:
    """One row of the kernel's TCP tables: its own end, the other end (``0.0.0.0:0`` for a listener), its state
    (the kernel's hex code) and its owner."""

    address: str
    port: int
    peer: str
    peer_port: int
    state: str
    uid: int


def _address(hex_address: str) -> str:
    """The kernel's hex address (host byte order in 32-bit words) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def tcp_sockets(proc_net: Path = PROC_NET) -> Iterator[TcpSocket]:
    """Every TCP socket of this network namespace, IPv4 and IPv6, in every state."""
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            hex_peer, _, hex_peer_port = fields[2].partition(":")
            yield TcpSocket(
                _address(hex_address), int(hex_port, 16), _address(hex_peer), int(hex_peer_port, 16), fields[3],
                int(fields[7]),
            )  # fmt: skip


def listeners(proc_net: Path = PROC_NET) -> Iterator[Listener]:
    """Every listening TCP socket of this network namespace, IPv4 and IPv6."""
    for sock in tcp_sockets(proc_net):
        if sock.state == _LISTEN:
            yield Listener(sock.address, sock.port, sock.uid)


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
        raise NothingListensError(f"nothing listens at {path} (the server there has gone)") from None
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
        raise NothingListensError(f"nothing listens on {host}:{port} (the server there has gone)")
    others = sorted(owners - {uid})
    if others:
        raise ListenerNotOursError(
            f"{host}:{port} is held by uid {others[0]}, not by this job's server (uid {uid}): another user took the "
            "port; nothing was sent to it"
        )


def check_own_peer(
    local: Sequence[Any], peer: Sequence[Any], *, uid: int | None = None, proc_net: Path = PROC_NET
) -> None:
    """The process that accepted a connection this process made (its own end ``local``, the other ``peer``, as
    the connected socket names them: address and port, then an IPv6 socket's flow and scope, not read) is this
    user's (``uid``, else this process's); raises :class:`ListenerNotOursError` otherwise, before anything is sent
    on the connection.

    :func:`check_own_listener` looks at the port before connecting: a server that dies between that look and the
    connection leaves its port to whoever binds it next, and the connection goes there. This looks at the
    connection itself: the kernel's tables list the accepting end (its own address ``peer``, its other end
    ``local``) with the owner of the listener that accepted it, from the moment the handshake completes."""
    uid = os.getuid() if uid is None else uid
    ends = (_plain(peer[0]), _plain(local[0]))
    owners = {
        sock.uid
        for sock in tcp_sockets(proc_net)
        if sock.port == peer[1] and sock.peer_port == local[1]  # the ports first: addresses are parsed for few rows
        and sock.state not in _GONE and sock.state != _LISTEN
        and (_plain(sock.address), _plain(sock.peer)) == ends
    }  # fmt: skip
    if not owners:
        raise NothingListensError(
            f"no socket of this node accepted the connection to {peer[0]}:{peer[1]} (the server there has gone, or it "
            "is on another host); nothing was sent on it"
        )
    others = sorted(owners - {uid})
    if others:
        raise ListenerNotOursError(
            f"the connection to {peer[0]}:{peer[1]} was accepted by uid {others[0]}, not by this job's server (uid "
            f"{uid}): another user took the port; nothing was sent on it"
        )


def _plain(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``address`` as an IP address, an IPv4-mapped IPv6 one as its IPv4 address; None if it is none."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def check_rendezvous(
    ports: Collection[int],
    nodes: Collection[str],
    *,
    here: Collection[str] = (),
    uid: int | None = None,
    proc_net: Path = PROC_NET,
) -> None:
    """Nobody but this user (``uid``, else this process's) and root meets at a replica's rendezvous ``ports`` on
    this node, and no host but the allocation's ``nodes`` (addresses) connects to them. Raises
    :class:`ListenerNotOursError` when another user listens on one of them, and :class:`RendezvousIntruderError`
    when another user's socket on this node is connected to one of them (whatever the engine made of it), or this
    user's end of a connection on one of them has a peer that is neither this node (its addresses in the tables,
    loopback, ``here``) nor one of ``nodes``.

    What it cannot see: another user on one of the allocation's other nodes (the peer is then that node's address,
    the socket's owner is in that node's tables), a connection made and closed between two looks, and the
    engines' other ports (NCCL's, Gloo's, which the ranks learn at the rendezvous)."""
    uid = os.getuid() if uid is None else uid
    trusted = TRUSTED_UIDS | {uid}
    table = list(tcp_sockets(proc_net))
    mine = {ip for a in (*(s.address for s in table), *here) if (ip := _plain(a)) is not None and not ip.is_unspecified}
    allowed = mine | {ip for a in nodes if (ip := _plain(a)) is not None}

    def on_this_node(address: str) -> bool:
        ip = _plain(address)
        return ip is not None and (ip.is_loopback or ip in mine)

    for sock in table:
        if sock.state == _LISTEN:
            if sock.port in ports and sock.uid not in trusted:
                raise ListenerNotOursError(
                    f"the rendezvous port {sock.port} is held by uid {sock.uid}, not by this job's leader (uid {uid}): "
                    "another user took the port"
                )
            continue
        if sock.state in _GONE:
            continue
        if sock.peer_port in ports and sock.uid not in trusted and on_this_node(sock.peer):
            raise RendezvousIntruderError(
                f"uid {sock.uid} (not this job's user, uid {uid}) holds a connection to the rendezvous port "
                f"{sock.peer_port} on this node (from {sock.address}:{sock.port}): another user joined or probed the "
                "ranks' meeting point, where the engine could take it for one of its ranks"
            )
        if sock.port in ports and sock.uid in trusted and not on_this_node(sock.peer):
            ip = _plain(sock.peer)
            if ip is None or ip not in allowed:
                known = ", ".join(sorted(str(a) for a in allowed if not a.is_loopback)) or "none"
                raise RendezvousIntruderError(
                    f"{sock.peer}:{sock.peer_port} is connected to the rendezvous port {sock.port} on this node, and "
                    f"it is none of the allocation's nodes ({known}): a host outside the allocation joined or probed "
                    "the ranks' meeting point, where the engine could take it for one of its ranks"
                )
