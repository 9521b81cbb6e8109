"""Issue 41, point 5: the address the ranks of a replica that spans nodes meet at is resolved on the leader's node
before it is rendered (``leader_ip``): an address of this host the name resolves to, loopback only when every node
is this host, else this host's address on the route to another node, else the attempt fails
``leader_address_unresolved``. The resolver, this host's addresses and the route are injected: each branch is a
network this machine does not have. The controller's side (the command lines carry the IP) is
``test_multinode.py``'s."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ddslurm.runtime._leader_address import (
    LeaderAddress,
    LeaderAddressError,
    interface_addresses,
    leader_ip,
    resolve_name,
    route_source,
)
from ddslurm.runtime._listeners import RendezvousIntruderError, check_rendezvous

HERE = frozenset({"127.0.0.1", "::1", "10.1.0.7", "fd00::7", "fe80::1"})
"""This host's addresses, as the kernel lists them: loopback, the cluster network's, a ULA and a link-local one."""


def _resolver(table: Mapping[str, Sequence[str]]) -> object:
    def resolve(name: str) -> list[str]:
        return list(table.get(name, [name] if name[:1].isdigit() else []))

    return resolve


def _place(
    name: str,
    nodes: set[str],
    table: Mapping[str, Sequence[str]],
    *,
    routes: Mapping[str, str] | None = None,
    here: frozenset[str] = HERE,
) -> LeaderAddress:
    asked: list[str] = []

    def route(address: str) -> str | None:
        asked.append(address)
        return (routes or {}).get(address)

    return leader_ip(name, nodes, resolve=_resolver(table), interfaces=lambda: here, route=route)  # type: ignore[arg-type]


def test_a_name_that_resolves_to_an_address_of_this_host_is_that_address() -> None:
    """IPv4 before IPv6, never link-local or loopback when the name has a real address of this host; the route is
    not asked."""
    placed = _place("gpu-07", {"gpu-07", "gpu-08"}, {"gpu-07": ["fe80::1", "fd00::7", "127.0.1.1", "10.1.0.7"]})
    assert placed == LeaderAddress("10.1.0.7", HERE)
    assert _place("gpu-07", {"gpu-08"}, {"gpu-07": ["fd00::7"]}).ip == "fd00::7"


def test_a_name_that_resolves_only_to_loopback_takes_the_route_to_another_node() -> None:
    """Debian's ``127.0.1.1 gpu-07`` in /etc/hosts: the leader would bind loopback, and each follower would connect
    to a loopback address of its own host. This host's address on the route to the other node is taken."""
    table = {"gpu-07": ["127.0.1.1"], "gpu-08": ["10.1.0.8"]}
    placed = _place("gpu-07", {"gpu-07", "gpu-08"}, table, routes={"10.1.0.8": "10.1.0.7"})
    assert placed.ip == "10.1.0.7"


def test_a_name_that_resolves_to_another_host_s_address_takes_the_route_too() -> None:
    """A DNS record out of date (or a management network's address): the leader could not bind it."""
    table = {"gpu-07": ["10.9.9.9"], "gpu-08": ["10.1.0.8"]}
    assert _place("gpu-07", {"gpu-08"}, table, routes={"10.1.0.8": "10.1.0.7"}).ip == "10.1.0.7"


def test_loopback_when_every_node_is_this_host() -> None:
    """The local test cluster: every node's NodeAddr is 127.0.0.1 (NodeHostName localhost), on one host."""
    table = {"localhost": ["127.0.0.1", "::1"]}
    assert _place("127.0.0.1", {"127.0.0.1", "::1"}, table).ip == "127.0.0.1"
    assert _place("localhost", {"127.0.0.1"}, table).ip == "127.0.0.1"
    assert _place("gpu-07", {"10.1.0.7"}, {"gpu-07": ["127.0.1.1"]}).ip == "127.0.1.1"  # its own loopback


@pytest.mark.parametrize(
    ("nodes", "routes"),
    [
        pytest.param(set(), {}, id="nodes-unknown"),  # scontrol said nothing: loopback would be a guess
        pytest.param({"gpu-08"}, {}, id="no-route"),
        pytest.param({"gpu-08"}, {"10.1.0.8": "127.0.0.1"}, id="route-over-loopback"),
        pytest.param({"gpu-08"}, {"10.1.0.8": "10.5.5.5"}, id="route-from-no-address-of-here"),
    ],
)
def test_no_address_the_followers_reach_fails_naming_what_was_found(nodes: set[str], routes: dict[str, str]) -> None:
    table = {"gpu-07": ["127.0.1.1", "10.9.9.9"], "gpu-08": ["10.1.0.8"]}
    with pytest.raises(LeaderAddressError) as err:
        _place("gpu-07", nodes, table, routes=routes)
    assert err.value.reason == "leader_address_unresolved" and not err.value.retryable
    message = err.value.message
    assert "'gpu-07' resolves to 127.0.1.1, 10.9.9.9" in message
    assert "this host (10.1.0.7, fd00::7, fe80::1)" in message
    assert ("10.1.0.8" in message) == bool(nodes)


def test_an_unknown_name_says_so() -> None:
    with pytest.raises(LeaderAddressError, match="'gpu-07' resolves to nothing"):
        _place("gpu-07", {"gpu-08"}, {"gpu-08": ["10.1.0.8"]})


def test_this_host_s_addresses_are_read_from_the_kernel_s_tables(tmp_path: Path) -> None:
    fib = tmp_path / "fib_trie"
    fib.write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        "     +-- 10.1.0.0/24 2 0 2\n        |-- 10.1.0.0\n           /24 link UNICAST\n"
        "        |-- 10.1.0.7\n           /32 host LOCAL\n        |-- 10.1.0.255\n           /32 link BROADCAST\n"
        "Local:\n     |-- 192.168.5.1\n           /32 host LOCAL\n"
    )
    inet6 = tmp_path / "if_inet6"
    inet6.write_text(
        "fd000000000000000000000000000007 04 40 00 82     eth0\n00000000000000000000000000000001 01 80 10 80       lo\n"
    )
    assert interface_addresses(fib, inet6) == {"127.0.0.1", "::1", "10.1.0.7", "192.168.5.1", "fd00::7"}
    assert interface_addresses(tmp_path / "none", tmp_path / "none") == {"127.0.0.1", "::1"}


def test_the_real_resolver_interfaces_and_route_of_this_machine() -> None:
    """The defaults, on this machine: loopback resolves to itself, is one of its addresses, and is the source of
    the route to itself (a UDP connect sends nothing)."""
    assert resolve_name("127.0.0.1") == ["127.0.0.1"]
    assert resolve_name("no-such-host.invalid") == []
    assert "127.0.0.1" in interface_addresses()
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert leader_ip("127.0.0.1", {"127.0.0.1"}).ip == "127.0.0.1"


def _tcp_table(directory: Path, rows: Sequence[tuple[str, int, str, int, str, int]]) -> Path:
    """A /proc/net holding these IPv4 TCP rows (local address and port, peer address and port, state, uid), as the
    kernel writes them."""
    directory.mkdir()
    lines = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
    for i, (local, lport, peer, pport, state, uid) in enumerate(rows):
        ends = [f"{int.from_bytes(ipaddress.IPv4Address(a).packed, 'little'):08X}:{p:04X}" for a, p in
                ((local, lport), (peer, pport))]  # fmt: skip
        lines.append(f"{i:4}: {ends[0]} {ends[1]} {state} 00000000:00000000 00:00000000 00000000 {uid:5} 0 {i + 9}")
    (directory / "tcp").write_text("\n".join(lines) + "\n")
    (directory / "tcp6").write_text(lines[0] + "\n")
    return directory


def test_the_rendezvous_watch_takes_the_leader_ip_for_this_node(tmp_path: Path) -> None:
    """The watch is given the resolved IP and this host's addresses (``here``), compared as IP addresses: the
    follower's connection to the IP from its node passes, another user's socket on this node connected to the IP is
    an intruder, and so is a host outside the allocation."""
    me, nobody, port = 1000, 65534, 24000
    placed = _place("gpu-07", {"gpu-08"}, {"gpu-07": ["127.0.1.1"], "gpu-08": ["10.1.0.8"]},
                    routes={"10.1.0.8": "10.1.0.7"})  # fmt: skip
    here = placed.local | {placed.ip}
    listening = ("0.0.0.0", port, "0.0.0.0", 0, "0A", me)
    ranks = _tcp_table(tmp_path / "ranks", [listening, ("10.1.0.7", port, "10.1.0.8", 41000, "01", me)])
    check_rendezvous({port}, {"10.1.0.8"}, here=here, uid=me, proc_net=ranks)
    stranger = _tcp_table(tmp_path / "stranger", [listening, ("10.1.0.7", 41001, "10.1.0.7", port, "01", nobody)])
    with pytest.raises(RendezvousIntruderError, match=f"uid {nobody}"):
        check_rendezvous({port}, {"10.1.0.8"}, here=here, uid=me, proc_net=stranger)
    outside = _tcp_table(tmp_path / "outside", [listening, ("10.1.0.7", port, "10.9.9.9", 41002, "01", me)])
    with pytest.raises(RendezvousIntruderError, match=r"10\.9\.9\.9:41002"):
        check_rendezvous({port}, {"10.1.0.8"}, here=here, uid=me, proc_net=outside)
