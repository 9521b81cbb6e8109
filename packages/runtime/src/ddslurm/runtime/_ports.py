"""Loopback ports for servers and proxies: chosen outside the kernel's ephemeral range, claimed node-wide while a
server binds them (:class:`PortClaims`), held for the proxies so that no other user can bind them
(:class:`PortHolds`), and rendezvous ports drawn at random (:func:`draw_port`)."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from ddslurm.runtime._listeners import PORT_CLAIM, listeners
from ddslurm.runtime._serving import PortUnavailableError

PORT_BASE = 20000
PORT_SPAN = 30000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
MIN_LISTEN_SPAN = 4096


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


class _PortSockets:
    """Sockets this process keeps bound, one a port, until it lets them go (or dies, and the kernel does)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._held: dict[int, socket.socket] = {}

    def holds(self, port: int) -> bool:
        return port in self._held

    def let_go(self, port: int) -> None:
        """Release ``port`` alone (held or not)."""
        sock = self._held.pop(port, None)
        if sock is not None:
            sock.close()

    def release(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()


class PortHolds(_PortSockets):
    """Loopback ports this process holds for the proxies it starts, so that no other user can ever bind them.

    A held port is bound with ``SO_REUSEPORT`` and never listened on: the kernel lets another socket bind the
    same address only if it sets ``SO_REUSEPORT`` too *and* belongs to the same uid. The proxy (started with
    ``--reuse-port``) binds and listens beside the hold; when it dies, the hold keeps the port: a connection is
    refused (nothing listens) instead of reaching whoever bound it next, and the restarted proxy binds it again.
    Another user's bind fails with "address already in use" before, during and after the proxy's life."""

    def take(self, port: int) -> bool:
        """Hold ``port`` (True), or False when it is not free: bound by anyone without ``SO_REUSEPORT`` or by
        another uid, listened on by anyone (this uid's stale proxy too), or held already."""
        if port in self._held:
            return False
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self._host, port))
        except OSError:
            sock.close()
            return False
        if any(listener.port == port for listener in listeners()):
            # This uid's own listener with SO_REUSEPORT (a proxy left by an earlier job): the kernel would share
            # the port's connections between it and the new proxy.
            sock.close()
            return False
        self._held[port] = sock
        return True


class PortClaims(_PortSockets):
    """The ports this process chose for its servers, claimed node-wide until it lets them go or dies.

    A port is chosen free and bound by the server a moment later (seconds for a real engine): two controllers on
    one node (two jobs, or the tests' three nodes on one host) that choose in that moment would both find it free,
    and the later server dies with "address already in use". A claim is a Unix-domain socket bound in Linux's
    abstract namespace under a name derived from the port: binding it is atomic across the node, it leaves no file,
    and the kernel lets it go when the process ends however it ends. A name bound by anyone else is not this
    process's to take (any user can bind an abstract name: the port is passed over, never shared)."""

    def take(self, port: int, is_free: Callable[[int], bool] | None = None) -> bool:
        """Claim ``port`` if no other process has and ``is_free`` (else :func:`port_is_free` on this host) says it
        is free (True), else False."""
        if port in self._held:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(PORT_CLAIM % (self._host, port))
        except OSError:
            sock.close()
            return False
        if not (is_free(port) if is_free is not None else port_is_free(port, self._host)):
            sock.close()
            return False
        self._held[port] = sock
        return True


def listening_ports(ephemeral_file: Path = EPHEMERAL_RANGE_FILE) -> range:
    """Where servers and proxies listen: outside the kernel's ephemeral range, from which every outgoing
    connection on the node (the clients' own, thousands a run) takes its source port. A port in that range can be
    held by a connection between the check and the server's bind, and the server then dies with "address already
    in use". Below the range when it leaves room there (Linux's default 32768-60999 leaves 20000-32767), else
    above it, else the whole of the old span."""
    try:
        low, high = (int(v) for v in ephemeral_file.read_text().split()[:2])
    except (OSError, ValueError):
        return range(PORT_BASE, PORT_BASE + PORT_SPAN)
    if low - PORT_BASE >= MIN_LISTEN_SPAN:
        return range(PORT_BASE, low)
    if 65536 - (high + 1) >= MIN_LISTEN_SPAN:
        return range(high + 1, 65536)
    return range(PORT_BASE, PORT_BASE + PORT_SPAN)


def choose_ports(
    wanted: list[int | None],
    job_id: str,
    is_free: Callable[[int], bool] = port_is_free,
    ports: range | None = None,
) -> list[int]:
    """Concrete ports: fixed ones are checked, the rest come from ``ports`` (:func:`listening_ports` unless
    given), starting at an offset derived from the job id (so two jobs sharing a node start far apart), and are
    checked before use."""
    ports = ports if ports is not None else listening_ports()
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    offset = (int(digits) * 64) % len(ports)
    taken: set[int] = {p for p in wanted if p is not None}
    out: list[int] = []
    for port in wanted:
        if port is not None:
            if not is_free(port):
                raise PortUnavailableError(f"port {port} (server.port) is already in use on this node")
            out.append(port)
            continue
        for _ in range(len(ports)):
            candidate = ports[offset]
            offset = (offset + 1) % len(ports)
            if candidate not in taken and is_free(candidate):
                break
        else:
            raise PortUnavailableError("no free port found on this node")
        taken.add(candidate)
        out.append(candidate)
    return out


def draw_port(take: Callable[[int], bool], *, span: int = 1, ports: range | None = None) -> int:
    """A port drawn at random from ``ports`` (:func:`listening_ports` unless given) such that ``take`` accepts it
    (it claims the ``span`` ports from it on, :class:`PortClaims`): the first one ``take`` accepts from a random
    place on, so that no one can tell it before the job starts (unlike :func:`choose_ports`, whose order follows
    the job id). Raises :class:`PortUnavailableError` when ``take`` accepts none."""
    ports = ports if ports is not None else listening_ports()
    starts = range(ports.start, ports.stop - span + 1)
    if len(starts) > 0:
        offset = secrets.randbelow(len(starts))
        for i in range(len(starts)):
            candidate = starts[(offset + i) % len(starts)]
            if take(candidate):
                return candidate
    raise PortUnavailableError(f"no free rendezvous port ({span} in a row) found on this node in {ports}")
