"""Issue 18: another user on the node who takes a server's port, before the server binds it or after it died, and
answers like vLLM, gets no token and no traffic. The squatter here is a real process of another uid (``nobody``),
listening on loopback and recording every request it gets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ddslurm.config import Engine
from ddslurm.runtime._listeners import ListenerNotOursError, check_own_listener, check_own_peer, listeners
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._peer_transport import own_peer_transport
from ddslurm.runtime._proxy import Proxy, ProxyConfig
from ddslurm.runtime._serving import ServerKilledError, ServerStartError, alive, answers, ready, wait_ready
from ddslurm.runtime._steps import StepSpec

TOKEN = "attempt-token-listeners-0123456789"
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by another user (the project's venv may not be)

# Answers like vLLM (/health 200, /v1/models lists "served", chat completions) and prints one JSON line per request
# with its path and Authorization header, as an impostor would collect them.
SQUATTER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def _answer(self):
        print(json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}), flush=True)
        body = json.dumps({"data": [{"id": "served"}], "choices": [{"message": {"content": "impostor"}}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *a): pass
server = HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print(json.dumps({"listening": server.server_port}), flush=True)
server.serve_forever()
"""

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists(), reason="a squatter of another uid needs root to start it"
)


class Squatter:
    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", SQUATTER, str(port)], user=NOBODY, group=NOBODY, stdout=subprocess.PIPE, text=True,
            cwd="/",
        )  # fmt: skip
        assert self.proc.stdout is not None
        first = json.loads(self.proc.stdout.readline())
        self.port = int(first["listening"])
        self.requests: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.requests.append(json.loads(line))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=5)


@contextlib.contextmanager
def squatting(port: int = 0) -> Iterator[Squatter]:
    squatter = Squatter(port)
    try:
        yield squatter
    finally:
        squatter.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_kernel_tables_tell_whose_listener_a_port_has() -> None:
    with socket.socket() as own:
        own.bind(("127.0.0.1", 0))
        own.listen()
        port = own.getsockname()[1]
        assert any(ln.port == port and ln.uid == os.getuid() for ln in listeners())
        check_own_listener(f"http://127.0.0.1:{port}/v1")
        check_own_listener(f"http://localhost:{port}")
    with pytest.raises(ListenerNotOursError, match="nothing listens"):
        check_own_listener(f"http://127.0.0.1:{port}")
    with squatting() as squatter, pytest.raises(ListenerNotOursError, match=f"held by uid {NOBODY}"):
        check_own_listener(f"http://127.0.0.1:{squatter.port}/v1")
    check_own_listener("https://api.example.com/v1")  # a hosted endpoint by name: not a local listener


def test_the_kernel_tables_tell_whose_listener_accepted_a_connection() -> None:
    with socket.socket() as own:
        own.bind(("127.0.0.1", 0))
        own.listen()
        with socket.create_connection(own.getsockname()) as conn:
            check_own_peer(conn.getsockname(), conn.getpeername())
    with (
        squatting() as squatter,
        socket.create_connection(("127.0.0.1", squatter.port)) as conn,
        pytest.raises(ListenerNotOursError, match=f"accepted by uid {NOBODY}"),
    ):
        check_own_peer(conn.getsockname(), conn.getpeername())
    with pytest.raises(ListenerNotOursError, match="no socket of this node accepted"):
        check_own_peer(("127.0.0.1", 1), ("127.0.0.1", 2))


class _LiveStep:
    """A server step that is still starting (it never exits here): the squatter holds its port."""

    name = "server-gen-0"

    def __init__(self, log: Path) -> None:
        self.spec = StepSpec(name=self.name, argv=("vllm",), env={}, log=log)

    def poll(self) -> int | None:
        return None


def test_a_squatter_that_took_the_port_first_gets_no_token_and_is_never_called_ready(tmp_path: Path) -> None:
    """Before: the readiness probes carried the token to whoever answered, and called the impostor ready in 0.01 s."""
    with squatting() as squatter, httpx.Client() as client:
        with pytest.raises(ListenerNotOursError, match=f"uid {NOBODY}"):
            wait_ready(
                _LiveStep(tmp_path / "server.log"),  # type: ignore[arg-type]
                f"http://127.0.0.1:{squatter.port}",
                "served",
                10.0,
                client=client,
                token=TOKEN,
                interval=0.05,
            )
        time.sleep(0.2)
    assert squatter.requests, "the squatter was never even asked /health"
    assert all(r["auth"] is None for r in squatter.requests), squatter.requests
    assert {r["path"] for r in squatter.requests} == {"/health"}


def test_a_server_that_dies_before_it_is_ready_still_fails_fast(tmp_path: Path) -> None:
    class Exited(_LiveStep):
        def poll(self) -> int | None:
            return 3

    (tmp_path / "server.log").write_text("address already in use\n")
    with httpx.Client() as client, pytest.raises(ServerStartError, match="address already in use"):
        wait_ready(Exited(tmp_path / "server.log"), f"http://127.0.0.1:{_free_port()}", "served", 5.0, client=client)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "reason", "said"),
    [
        (3, "server_start_failed", "exited with status 3"),
        (137, "server_killed", "was killed (status 137, signal 9)"),  # srun's 128 + SIGKILL
        (-15, "server_killed", "was killed (status -15, signal 15)"),  # a step run outside Slurm
    ],
)
def test_a_server_killed_before_it_is_ready_is_told_from_one_that_exited(
    tmp_path: Path, code: int, reason: str, said: str
) -> None:
    """Issue 40: a server killed by a signal (kill -9, the OOM killer) is ``server_killed``, which ``retry`` runs;
    one that exited by itself (a bad flag, a model it cannot load) is ``server_start_failed``, which the frozen
    plan repeats. Both keep the log's tail."""

    class Ended(_LiveStep):
        def poll(self) -> int | None:
            return code

    (tmp_path / "server.log").write_text("last words\n")
    with httpx.Client() as client, pytest.raises(ServerStartError) as raised:
        wait_ready(Ended(tmp_path / "server.log"), f"http://127.0.0.1:{_free_port()}", "served", 5.0, client=client)  # type: ignore[arg-type]
    assert raised.value.reason == reason and isinstance(raised.value, ServerKilledError) == (reason == "server_killed")
    assert said in str(raised.value) and "last words" in str(raised.value)


def _proxy(upstreams: list[str]) -> Proxy:
    from ddslurm.runtime._log import new_logger

    config = ProxyConfig(
        listen_host="127.0.0.1", listen_port=0, upstreams=tuple(upstreams), token=TOKEN, health_interval=0.1,
        unavailable_grace=0.3, metrics_interval=0.1,
    )  # fmt: skip
    return Proxy(config, new_logger(sys.stderr.buffer, component="proxy"))


def test_the_proxy_never_sends_the_token_or_a_request_to_a_squatter_before_or_after_a_replica_died() -> None:
    """Before: the proxy's once-a-second /health probe carried the token to a listener that took a dead replica's
    port, and put it back into rotation (3 of 6 collected rows held the impostor's text)."""

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
        replica = socket.socket()  # our own replica: a listener of this uid that answers like vLLM
        replica.bind(("127.0.0.1", 0))
        replica_port = replica.getsockname()[1]
        replica.close()
        from fake_vllm.testing import start_server

        statuses: list[int] = []
        with squatting() as early:
            proxy = _proxy([f"http://127.0.0.1:{early.port}", f"http://127.0.0.1:{replica_port}"])
            with start_server("own", args=["--served-model-name", "served"], api_key=TOKEN, port=replica_port) as own:
                port = await proxy.start()
                try:
                    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                        auth = {"Authorization": f"Bearer {TOKEN}"}
                        body = {"model": "served", "messages": [{"role": "user", "content": "hi"}]}
                        for _ in range(6):
                            statuses.append(
                                (await client.post("/v1/chat/completions", json=body, headers=auth)).status_code
                            )
                        own.proc.kill()  # the replica dies; another user takes its port at once
                        own.proc.wait()
                        with squatting(replica_port) as late:
                            for _ in range(4):
                                await asyncio.sleep(0.15)
                                statuses.append(
                                    (await client.post("/v1/chat/completions", json=body, headers=auth)).status_code
                                )
                            late_requests = list(late.requests)
                finally:
                    await proxy.stop()
            return list(early.requests), late_requests, statuses

    early, late, statuses = asyncio.run(scenario())
    assert statuses[:6] == [200] * 6  # the own replica served while the squatter was out of rotation
    assert all(s != 200 for s in statuses[6:])  # no upstream left: nothing served by the impostor
    assert all(r["auth"] is None for r in early + late), early + late
    assert all(r["path"] == "/health" for r in early) and not any(r["path"].startswith("/v1") for r in late)


def test_a_port_that_changed_hands_after_its_listener_was_proved_gets_no_connection_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The look at a port's listener and the connection are two moments: a replica that dies between them leaves its
    port to whoever binds it next (a busy machine widened the window enough for the /metrics scrape to carry the
    token to a squatter). Here the look is stale by construction (it says the port is ours; another user holds
    it): every connection the proxy makes there is proved by its accepting end, closed unused, and the upstream is
    out for good."""
    import ddslurm.runtime._upstreams as upstreams

    monkeypatch.setattr(upstreams, "check_own_listener", lambda url: None)  # the look before the port changed hands

    async def scenario(url: str) -> tuple[int, dict[str, Any]]:
        proxy = _proxy([url])
        port = await proxy.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                body = {"model": "served", "messages": [{"role": "user", "content": "hi"}]}
                answer = await client.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
                )
            return answer.status_code, proxy.describe()
        finally:
            await proxy.stop()

    with squatting() as squatter:
        status, described = asyncio.run(scenario(f"http://127.0.0.1:{squatter.port}"))
        requests = list(squatter.requests)
    assert requests == []  # not one request, with or without the token, went on a connection it accepted
    assert status == 503, described
    [upstream] = described["upstreams"]
    assert upstream["dead"] and not upstream["healthy"], upstream


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_port_that_changed_hands_after_the_look_gets_no_probe_with_the_token(
    monkeypatch: pytest.MonkeyPatch, engine: Engine
) -> None:
    """The controller's readiness probe looked at the port's listener, then connected: between the two, a replica
    that died left its port to the next binder, and ``/v1/models`` carried the token there. The look is stale by
    construction here (it says ours; another user holds the port). A plain client sends the token to the squatter;
    the controller's (``own_peer_transport``) sends nothing on a connection it accepted, and the replica is
    another user's, not merely unready; the liveness probe calls it dead."""
    import ddslurm.runtime._serving as serving

    monkeypatch.setattr(serving, "check_own_listener", lambda url: None)  # the look before the port changed hands
    with squatting() as squatter:
        url = f"http://127.0.0.1:{squatter.port}"
        with httpx.Client(timeout=5.0) as plain:
            assert serving.ready(plain, url, engine, "served", TOKEN)  # the hole: the squatter is called ready
        with httpx.Client(timeout=5.0, transport=own_peer_transport(), trust_env=False) as probes:
            with pytest.raises(ListenerNotOursError, match=f"accepted by uid {NOBODY}"):
                serving.ready(probes, url, engine, "served", TOKEN)
            assert not serving.alive(probes, url, engine, "served", TOKEN)
            assert not serving.answers(probes, url)
        requests = list(squatter.requests)
    # Every request the squatter got is the plain client's (the checked one sent none), and its last one carried
    # the token: the look was stale for real.
    assert [r["path"] for r in requests] == (["/v1/models"] if engine == "sglang" else ["/health", "/v1/models"])
    assert requests[-1]["auth"] == f"Bearer {TOKEN}", requests


def test_the_controllers_probes_reach_this_users_own_server_through_the_checked_transport() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stand_in = subprocess.Popen(  # this user's: the same answers as the squatter's
        [sys.executable, "-c", SQUATTER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert stand_in.stdout is not None and json.loads(stand_in.stdout.readline())["listening"] == port
        with httpx.Client(timeout=5.0, transport=own_peer_transport(), trust_env=False) as probes:
            url = f"http://127.0.0.1:{port}"
            assert ready(probes, url, "vllm", "served", TOKEN)
            assert ready(probes, url, "sglang", "served", TOKEN)
            assert alive(probes, url, "vllm", "served", TOKEN) and answers(probes, url)
    finally:
        stand_in.kill()
        stand_in.wait()


# --- Unix-domain sockets and held ports -------------------------------------------------------------------------

TRY_AS_OTHER_USER = r"""
import json, socket, sys
kind, where = sys.argv[1], sys.argv[2]
out = {}
if kind == "bind":
    for options in ((), ("reuseaddr",), ("reuseport",), ("reuseaddr", "reuseport")):
        sock = socket.socket()
        if "reuseaddr" in options: sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if "reuseport" in options: sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(("127.0.0.1", int(where))); sock.listen(); out["+".join(options) or "plain"] = "bound"
        except OSError as exc:
            out["+".join(options) or "plain"] = exc.strerror
        sock.close()
else:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(where); out["connect"] = "connected"
    except OSError as exc:
        out["connect"] = exc.strerror
print(json.dumps(out))
"""


def _as_nobody(kind: str, where: str) -> dict[str, str]:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", TRY_AS_OTHER_USER, kind, where], user=NOBODY, group=NOBODY, capture_output=True,
        text=True, cwd="/", check=True, timeout=30,
    )  # fmt: skip
    result: dict[str, str] = json.loads(done.stdout)
    return result


def _unix_listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_a_unix_socket_is_ours_only_as_a_socket_of_this_uid_in_a_directory_no_one_else_can_enter(
    tmp_path: Path,
) -> None:
    from ddslurm.runtime._listeners import check_own_socket, unix_url

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with contextlib.closing(_unix_listener(private / "gen-0.sock")):
        check_own_listener(unix_url(private / "gen-0.sock"))
        with pytest.raises(ListenerNotOursError, match=f"only uid {os.getuid() + 12345} can enter"):
            check_own_socket(private / "gen-0.sock", uid=os.getuid() + 12345)  # another user's view of it
        assert _as_nobody("connect", str(private / "gen-0.sock")) == {"connect": "Permission denied"}
    (private / "gen-0.sock").unlink()  # a closed socket's file stays (still ours); a removed one is gone
    with pytest.raises(ListenerNotOursError, match="nothing listens at"):
        check_own_listener(unix_url(private / "gen-0.sock"))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a directory anyone can put a socket in: whatever is there may be another user's
    with (
        contextlib.closing(_unix_listener(shared / "gen-0.sock")),
        pytest.raises(ListenerNotOursError, match="not a directory only"),
    ):
        check_own_listener(unix_url(shared / "gen-0.sock"))
    (private / "file.sock").write_text("")
    with pytest.raises(ListenerNotOursError, match="is not a socket"):
        check_own_listener(unix_url(private / "file.sock"))


def test_a_held_port_cannot_be_taken_by_another_user_before_during_or_after_the_proxy_listens() -> None:
    """Before: a proxy's port was free for anyone between the check and the proxy's bind, and again once the proxy
    died, while the clients kept sending the token to it. The controller's hold keeps it for the allocation."""
    from ddslurm.runtime._ports import PortHolds, listening_ports, port_is_free

    holds = PortHolds()
    port = next(p for p in listening_ports()[5000:] if holds.take(p))
    refused = {"plain", "reuseaddr", "reuseport", "reuseaddr+reuseport"}
    try:
        assert not port_is_free(port) and not holds.take(port)
        assert set(_as_nobody("bind", str(port))) == refused
        assert set(_as_nobody("bind", str(port)).values()) == {"Address already in use"}

        async def proxy_life() -> tuple[int, dict[str, str]]:
            proxy = Proxy(
                ProxyConfig("127.0.0.1", port, ("http://127.0.0.1:9",), token=TOKEN, reuse_port=True),
                new_logger(sys.stderr.buffer),
            )
            assert await proxy.start() == port  # the proxy binds beside the hold
            try:
                during = await asyncio.to_thread(_as_nobody, "bind", str(port))
            finally:
                await proxy.stop()
            return port, during

        _, during = asyncio.run(proxy_life())
        assert set(during.values()) == {"Address already in use"}
        after = _as_nobody("bind", str(port))  # the proxy is gone: the hold still keeps the port
        assert set(after.values()) == {"Address already in use"}
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", port))  # refused, never answered by anyone else
        asyncio.run(proxy_life())  # a restarted proxy binds the same port again
    finally:
        holds.release()
    assert port_is_free(port)


def test_the_proxy_serves_replicas_on_unix_sockets_and_requires_the_token_on_every_route(tmp_path: Path) -> None:
    """vLLM's own API key guards only /v1/*; behind the proxy every route but /health wants the token, and the
    replica's socket is in a directory no other user can enter."""
    from aiohttp import web

    from ddslurm.runtime._listeners import unix_url

    private = tmp_path / "sockets"
    private.mkdir(mode=0o700)
    seen: list[tuple[str, str | None]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization")))
        return web.json_response({"path": request.path, "data": [{"id": "served"}]})

    async def scenario() -> dict[str, int]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, str(private / "gen-0.sock")).start()
        proxy = _proxy([unix_url(private / "gen-0.sock")])
        port = await proxy.start()
        statuses: dict[str, int] = {}
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for path in ("/invocations", "/tokenize", "/pooling", "/score", "/v1/chat/completions"):
                    statuses[path] = (await client.post(path, json={})).status_code
                    statuses[path + "+token"] = (
                        await client.post(path, json={}, headers={"Authorization": f"Bearer {TOKEN}"})
                    ).status_code
                statuses["/health"] = (await client.get("/health")).status_code
        finally:
            await proxy.stop()
            await runner.cleanup()
        return statuses

    statuses = asyncio.run(scenario())
    assert statuses.pop("/health") == 200
    assert {k: v for k, v in statuses.items() if not k.endswith("+token")} == dict.fromkeys(
        ("/invocations", "/tokenize", "/pooling", "/score", "/v1/chat/completions"), 401
    )
    assert set(v for k, v in statuses.items() if k.endswith("+token")) == {200}
    forwarded = [(p, a) for p, a in seen if p != "/health" and p != "/metrics"]
    assert [p for p, _ in forwarded] == ["/invocations", "/tokenize", "/pooling", "/score", "/v1/chat/completions"]
    assert {a for _, a in forwarded} == {f"Bearer {TOKEN}"}
    assert all(a is None for p, a in seen if p == "/health")
    # the metrics scrape carries it, to a listener proved this user's (an engine may guard /metrics)
    assert {a for p, a in seen if p == "/metrics"} <= {f"Bearer {TOKEN}"}


def test_a_port_where_a_stale_proxy_of_this_user_listens_is_not_held() -> None:
    """A proxy left by an earlier job of the same user, bound with SO_REUSEPORT, would share the port's connections
    with the new proxy (the kernel balances a reuseport group): such a port counts as taken."""
    from ddslurm.runtime._ports import PortHolds

    with socket.socket() as stale:
        stale.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        stale.bind(("127.0.0.1", 0))
        stale.listen()
        holds = PortHolds()
        try:
            assert not holds.take(stale.getsockname()[1])
        finally:
            holds.release()
