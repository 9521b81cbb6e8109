"""The address a replica that spans nodes meets at, resolved on the leader's node before it is rendered.

The ranks of such a replica meet at the leader's address (vLLM ``--master-addr``/``--data-parallel-address``,
SGLang ``--dist-init-addr``): the leader binds it, the followers connect to it. The address Slurm gives
(``NodeAddr``, else the node's name: :func:`~ddslurm.runtime._node_discovery.leader_address`) is only a name: on
many sites it resolves to an address this host does not have (a management network's, a DNS record out of date),
or only to loopback (``127.0.1.1`` for the host's own name in ``/etc/hosts``, as Debian writes it), and the
leader's bind fails, or the followers connect to a loopback address of their own host. :func:`leader_ip` turns it
into an IP address of this host that the followers can reach, before any server starts:

1. an address the name resolves to that is one of this host's own (not loopback, not link-local);
2. loopback, only when every other node of the allocation is this same host (the local test cluster's nodes share
   one host, ``NodeAddr=127.0.0.1``);
3. else this host's address on the route to another node of the allocation (the kernel's own choice: a UDP
   socket connected to that node's address, which sends nothing, then ``getsockname``);
4. none: the attempt fails at once, ``leader_address_unresolved``, naming the name, what it resolved to and this
   host's addresses (:class:`LeaderAddressError`).

The resolver, this host's interface addresses and the route lookup are parameters, so each branch is tested
without the network it stands for. IPv4 addresses come before IPv6 ones of the same rank.
"""

from __future__ import annotations

import ipaddress
import itertools
import socket
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddslurm.runtime.errors import RuntimeFailure

FIB_TRIE = Path("/proc/net/fib_trie")
IF_INET6 = Path("/proc/net/if_inet6")
LOOPBACK = "127.0.0.1"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolve = Callable[[str], Sequence[str]]
"""A name (or an address) to the IP addresses it stands for, in the resolver's order; none when unknown."""
Interfaces = Callable[[], Collection[str]]
"""This host's own IP addresses."""
Route = Callable[[str], str | None]
"""This host's source address on the route to an address; None when there is no route."""


class LeaderAddressError(RuntimeFailure):
    """No address of the leader's node could be found that the followers of a replica that spans nodes reach it at
    (:func:`leader_ip`): no server was started."""

    reason = "leader_address_unresolved"


@dataclass(frozen=True, slots=True)
class LeaderAddress:
    """Where the ranks meet (``ip``, an address of this host) and this host's addresses (``local``: the
    rendezvous watch counts a connection from any of them as one from this node)."""

    ip: str
    local: frozenset[str]


def resolve_name(name: str) -> list[str]:
    """The IP addresses ``name`` stands for (``getaddrinfo``: ``/etc/hosts``, DNS), in the resolver's order, each
    once, without an IPv6 scope; none when it is unknown."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]).partition("%")[0] for info in infos))


def interface_addresses(fib_trie: Path = FIB_TRIE, if_inet6: Path = IF_INET6) -> frozenset[str]:
    """This host's own IP addresses, as the kernel lists them: IPv4 from ``/proc/net/fib_trie`` (an address
    followed by ``/32 host LOCAL``), IPv6 from ``/proc/net/if_inet6`` (32 hex digits first on each line). Loopback
    always; a table that cannot be read adds nothing."""
    found = {LOOPBACK, "::1"}
    try:
        lines = fib_trie.read_text().splitlines()
    except OSError:
        lines = []
    for previous, line in itertools.pairwise(lines):
        head = previous.strip()
        if head.startswith("|-- ") and line.strip() == "/32 host LOCAL":
            found.add(head.removeprefix("|-- ").strip())
    try:
        rows = if_inet6.read_text().splitlines()
    except OSError:
        rows = []
    for row in rows:
        fields = row.split()
        if fields and len(fields[0]) == 32:
            try:
                found.add(str(ipaddress.IPv6Address(int(fields[0], 16))))
            except ValueError:
                continue
    return frozenset(found)


def route_source(address: str) -> str | None:
    """This host's source address on the kernel's route to ``address``: a UDP socket ``connect``ed to it (nothing
    is sent: a UDP connect only picks the route) says which address it would send from. None without a route."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((address, 9))
            return str(sock.getsockname()[0]).partition("%")[0]
    except OSError:
        return None


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None


def _rank(ip: IPAddress) -> tuple[int, int]:
    """IPv4 first, then by address: the order of a set of addresses, the same every run."""
    return ip.version, int(ip)


def _ordered(addresses: Iterable[IPAddress]) -> list[IPAddress]:
    """IPv4 first, each family in the order given."""
    unique = list(dict.fromkeys(addresses))
    return [a for a in unique if a.version == 4] + [a for a in unique if a.version == 6]


def leader_ip(
    name: str,
    nodes: Collection[str],
    *,
    resolve: Resolve = resolve_name,
    interfaces: Interfaces = interface_addresses,
    route: Route = route_source,
) -> LeaderAddress:
    """The IP address the ranks of a replica that spans nodes meet at, on this (the leader's) node: ``name`` (the
    leader's address as Slurm gives it) resolved to one of this host's addresses, loopback only when every one of
    the allocation's ``nodes`` (names or addresses, this node's among them) is this host, else this host's address
    on the route to another node (the module's docstring says why). Raises :class:`LeaderAddressError`, naming
    ``name``, what it resolved to and this host's addresses, when there is none."""
    own = {ip for a in interfaces() if (ip := _ip(a)) is not None}

    def local(ip: IPAddress) -> bool:
        return ip.is_loopback or ip in own

    here = frozenset(str(ip) for ip in own)
    named = [ip for a in resolve(name) if (ip := _ip(a)) is not None]
    for ip in _ordered(ip for ip in named if local(ip) and not ip.is_loopback and not ip.is_link_local):
        return LeaderAddress(str(ip), here)
    peers = {ip for node in nodes for a in resolve(node) if (ip := _ip(a)) is not None}
    others = sorted((ip for ip in peers if not local(ip)), key=_rank)
    if peers and not others:  # every node is this host: loopback reaches each of them
        loopback = _ordered(ip for ip in named if ip.is_loopback)
        return LeaderAddress(str(loopback[0]) if loopback else LOOPBACK, here)
    for peer in others:
        source = _ip(route(str(peer)) or "")
        if source is not None and local(source) and not source.is_loopback and not source.is_link_local:
            return LeaderAddress(str(source), here)
    shown = ", ".join(str(ip) for ip in named) or "nothing"
    mine = ", ".join(str(ip) for ip in sorted(own, key=_rank) if not ip.is_loopback) or "none but loopback"
    towards = ", ".join(str(ip) for ip in others) or "none known"
    raise LeaderAddressError(
        f"the leader's node name {name!r} resolves to {shown}, none of them an address of this host ({mine}) "
        f"that the other nodes reach, and no route to another node of the allocation ({towards}) leaves from one: "
        "the followers of the replica that spans nodes could not meet its leader; check the node's NodeAddr "
        "(`scontrol show node`) and its entry in /etc/hosts or DNS"
    )
