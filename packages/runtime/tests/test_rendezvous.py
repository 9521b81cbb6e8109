"""Issue 37, item 6: the rendezvous of a replica that spans nodes. Its port is drawn at random when the job starts
(no one can know it before), and the kernel's socket tables tell who is connected to it: another user's socket
on the leader's node, or a host outside the allocation, is an intruder (``rendezvous_intruder``); the ranks' own
connections, this user's, from this node or the allocation's others, are not. The tables here are the kernel's
own, or rows written as the kernel writes them (a host outside the allocation cannot be made on one machine).
The controller's side, with the stand-in engine and ``nobody`` joining it, is ``test_multinode.py``'s."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from pathlib import Path

import pytest

from ddslurm.runtime._listeners import ListenerNotOursError, RendezvousIntruderError, check_rendezvous
from ddslurm.runtime._node_discovery import allocation_addresses
from ddslurm.runtime._ports import draw_port
from ddslurm.runtime._serving import PortUnavailableError

ME = 1000
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
LEADER = "10.0.0.1"
FOLLOWER = "10.0.0.2"
PORT = 24000

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
STATES = {"established": "01", "time_wait": "06", "close_wait": "08", "listen": "0A"}


def _hex(address: str, port: int) -> str:
    """``address:port`` as /proc/net/tcp writes it (the address in host byte order, 32-bit words)."""
    return f"{int.from_bytes(ipaddress.IPv4Address(address).packed, 'little'):08X}:{port:04X}"


def _row(i: int, local: tuple[str, int], peer: tuple[str, int], state: str, uid: int) -> str:
    return (
        f"{i:4}: {_hex(*local)} {_hex(*peer)} {STATES[state]} 00000000:00000000 00:00000000 00000000 {uid:5} "
        f"0 {1000 + i} 1 0000000000000000 20 4 30 10 -1\n"
    )


def _tables(tmp_path: Path, *rows: tuple[tuple[str, int], tuple[str, int], str, int]) -> Path:
    """A /proc/net with these TCP rows (IPv4) and no IPv6 one."""
    proc_net = tmp_path / "net"
    proc_net.mkdir()
    (proc_net / "tcp").write_text(HEADER + "".join(_row(i, *row) for i, row in enumerate(rows)))
    (proc_net / "tcp6").write_text(HEADER)
    return proc_net


LISTENING = ((("0.0.0.0", PORT), ("0.0.0.0", 0), "listen", ME),)


def _check(proc_net: Path) -> None:
    check_rendezvous({PORT}, {LEADER, FOLLOWER}, here={LEADER}, uid=ME, proc_net=proc_net)


def test_the_ranks_own_connections_from_this_node_and_the_allocation_s_others_pass(tmp_path: Path) -> None:
    proc_net = _tables(
        tmp_path,
        *LISTENING,
        ((LEADER, PORT), (FOLLOWER, 41000), "established", ME),  # the follower on the allocation's second node
        ((LEADER, 41001), (LEADER, PORT), "established", ME),  # a rank of the leader's own node: both ends here
        ((LEADER, PORT), (LEADER, 41001), "established", ME),
        ((LEADER, PORT), ("10.0.0.66", 41002), "time_wait", 0),  # a closed connection: the kernel's, uid 0
        (("127.0.0.1", 41003), ("127.0.0.1", PORT + 1), "established", NOBODY),  # another port: not the rendezvous
        ((LEADER, 41004), ("10.9.9.9", PORT), "established", NOBODY),  # another host's port PORT: not ours
        (("127.0.0.1", 41005), ("127.0.0.1", PORT), "established", 0),  # root: trusted
    )
    _check(proc_net)


@pytest.mark.parametrize("state", ["established", "close_wait"])
def test_another_user_s_socket_on_this_node_connected_to_the_rendezvous_is_an_intruder(
    tmp_path: Path, state: str
) -> None:
    """Connected, or still holding its end after the leader closed it (the engine refused it, or died of it)."""
    proc_net = _tables(
        tmp_path,
        *LISTENING,
        (("127.0.0.1", 41000), ("127.0.0.1", PORT), state, NOBODY),
    )
    with pytest.raises(RendezvousIntruderError, match=f"uid {NOBODY} .* rendezvous port {PORT} on this node") as err:
        _check(proc_net)
    assert err.value.reason == "rendezvous_intruder" and not err.value.retryable


def test_a_peer_outside_the_allocation_is_an_intruder(tmp_path: Path) -> None:
    proc_net = _tables(tmp_path, *LISTENING, ((LEADER, PORT), ("10.0.0.66", 41000), "established", ME))
    with pytest.raises(RendezvousIntruderError, match=r"10\.0\.0\.66:41000 .* none of the allocation's nodes") as err:
        _check(proc_net)
    assert f"{LEADER}, {FOLLOWER}" in err.value.message


def test_another_user_listening_on_the_rendezvous_port_took_it(tmp_path: Path) -> None:
    proc_net = _tables(tmp_path, (("127.0.0.1", PORT), ("0.0.0.0", 0), "listen", NOBODY))
    with pytest.raises(ListenerNotOursError, match=f"rendezvous port {PORT} is held by uid {NOBODY}"):
        _check(proc_net)


def test_every_port_of_an_engine_s_block_is_watched(tmp_path: Path) -> None:
    """SGLang meets at several ports from ``--dist-init-addr``'s on (its ZeroMQ sockets): a joiner at any of them."""
    proc_net = _tables(tmp_path, (("127.0.0.1", 41000), ("127.0.0.1", PORT + 3), "established", NOBODY))
    check_rendezvous({PORT}, set(), uid=ME, proc_net=proc_net)
    with pytest.raises(RendezvousIntruderError, match=f"rendezvous port {PORT + 3}"):
        check_rendezvous(set(range(PORT, PORT + 8)), set(), uid=ME, proc_net=proc_net)


@pytest.mark.skipif(
    os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists(), reason="a socket of another uid needs root to start it"
)
def test_the_kernel_s_tables_show_another_user_connected_to_this_user_s_port() -> None:
    with socket.socket() as leader:
        leader.bind(("0.0.0.0", 0))
        leader.listen()
        port = leader.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):  # a rank of this user's
            check_rendezvous({port}, set())
        joiner = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", "import socket,sys; s=socket.create_connection(('127.0.0.1', int(sys.argv[1]))); "
             "print('joined', flush=True); sys.stdin.read()", str(port)],
            user=NOBODY, group=NOBODY, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert joiner.stdout is not None and joiner.stdout.readline().strip() == "joined"
            with pytest.raises(RendezvousIntruderError, match=f"uid {NOBODY} .* port {port}"):
                check_rendezvous({port}, set())
        finally:
            joiner.kill()
            joiner.wait()


def test_the_rendezvous_port_is_drawn_at_random_and_claimed_with_the_engine_s_next_ones() -> None:
    """Before: the port followed from the job id (``choose_ports``), which another user can read in ``squeue``
    before the job starts, and bind or wait at."""
    drawn = {draw_port(lambda p: True, ports=range(20000, 32000)) for _ in range(20)}
    assert len(drawn) > 1 and all(20000 <= p < 32000 for p in drawn)
    busy = set(range(20000, 20010)) - {20004, 20005, 20006}
    tried: list[int] = []

    def take(port: int) -> bool:  # a claim of the 3 ports from ``port`` on
        tried.append(port)
        return not busy & set(range(port, port + 3))

    assert draw_port(take, span=3, ports=range(20000, 20010)) == 20004  # the one block free
    busy.add(20005)
    tried.clear()
    with pytest.raises(PortUnavailableError, match="no free rendezvous port"):
        draw_port(take, span=3, ports=range(20000, 20010))
    assert sorted(tried) == list(range(20000, 20008))  # every start whose 3 ports fit in the range, none beyond


def test_the_allocation_s_node_addresses_come_from_slurm() -> None:
    def scontrol(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert argv[:4] == ["scontrol", "show", "node", "gpu[07-08]"]
        out = (
            "NodeName=gpu-07 Arch=x86_64 NodeAddr=10.1.0.7 NodeHostName=localhost Port=0\n"
            "NodeName=gpu-08 Arch=x86_64 NodeAddr=10.1.0.8 NodeHostName=(null) Port=0\n"
        )
        return subprocess.CompletedProcess(argv, 0, out, "")

    found = allocation_addresses({"SLURM_JOB_NODELIST": "gpu[07-08]"}, run=scontrol)
    assert {"10.1.0.7", "10.1.0.8", "127.0.0.1"} <= found
    assert allocation_addresses({}, run=scontrol) == {"127.0.0.1"}  # outside Slurm: this machine
