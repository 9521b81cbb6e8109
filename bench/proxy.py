"""Reverse-proxy overhead against its floor, measured in the same run.

Baseline: chat requests at concurrency C sent straight to one vLLM stand-in (fake-vllm under uvicorn).
Measured: the same requests through ``ddslurm-runtime proxy`` (its ``main()`` in a subprocess, as deployed)
in front of that same stand-in. Reference: the same requests through a null proxy (a TCP relay that copies
bytes between one client and one upstream connection, parsing nothing: what any extra hop costs). A round
runs all three in turn (the order rotates), ``--repeat`` rounds per case after a warm-up; every figure is the
median over the rounds (ratios and added latencies are taken within a round).

    uv run python bench/proxy.py [--requests 3000] [--concurrency 64] [--repeat 5] [--stream]
                                 [--cases cpu_bound,shared,replica_bound,unloaded] [--loop auto|uvloop|asyncio]
                                 [--proxy-file OLD_PROXY.py]

The load generator, the stand-in and the proxy are three single-threaded processes. Cases:

- ``cpu_bound`` (the headline): the stand-in answers at once (``--fake-latency 0``), so every process is
  CPU-bound: the proxy's worst case. The load generator and the stand-in share CPU 0, the proxy (or the
  relay) has CPU 1 to itself, as on a node where the proxy step gets a CPU of its own. The direct runs leave
  CPU 1 idle, so both sides of the ratio have the same CPU for the work they share: the ratio shows what the
  hop through the proxy costs, not whose CPU it takes. The null relay's ratio is the floor of that hop.
- ``shared``: the same without pinning: all three share every CPU. On a 2-core machine the proxy then takes
  CPU from the other two, so this ratio mostly measures the proxy's CPU per request against theirs.
- ``replica_bound``: the stand-in holds each request ``--replica-latency`` seconds (a GPU's time per request),
  pinned as ``cpu_bound`` (with ``--replica-requests`` requests): the usual case, where the proxy should be free.
  The 64 requests start and end in step here, so CPU 0 works through bursts of them and the p50 includes that
  queueing, which the proxy's own CPU partly takes over: its added latency can come out below zero.
- ``unloaded``: one request at a time (``--unloaded-requests``), stand-in answering at once, pinned: the
  latency the hop through the proxy itself adds when nothing queues anywhere (``p50_added_ms``).

Other processes on the machine disturb the timings: each run measures the CPUs they kept busy (/proc/stat
minus our three processes); a pair with more than ``--quiet`` CPUs of that is run again (up to as many pairs
again), and the medians count only quiet pairs when at least half are. ``background_cpus`` says what remained.

Prints readable lines to stderr, then one JSON line: ``ratio`` proxy/direct requests/s (1.0 = free; the target
is >= 0.95) and ``p50_added_ms`` (proxied p50 latency minus direct, target < 1 ms) of the ``cpu_bound`` case,
then per case the same for the relay (``relay_ratio``, ``relay_p50_added_ms``), ``proxy_to_relay``, the
requests/s and p50 latencies of all three, the ratio's range, and the CPU each process used per request in
microseconds (``cpu_us_per_request``: load generator, stand-in, relay or proxy), which contention barely moves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import httpx
from _cpu import busy_seconds, cpu_seconds

from fake_vllm.testing import free_port, start_server

BODY = {"model": "m", "messages": [{"role": "user", "content": "Write one sentence."}], "max_tokens": 64}
PROXY_CODE = "import sys; from ddslurm.runtime._proxy import main; sys.exit(main(sys.argv[1:]))"
# --proxy-file: main() of another revision of _proxy.py (e.g. `git show REV:packages/.../_proxy.py > old.py`)
FILE_CODE = (
    "import runpy, sys; path = sys.argv.pop(1); "
    "sys.exit(runpy.run_path(path, run_name='proxy_under_test')['main'](sys.argv[1:]))"
)
CASES = ("cpu_bound", "shared", "replica_bound", "unloaded")


@dataclass(frozen=True)
class Case:
    name: str
    pinned: bool
    latency: float  # the stand-in's seconds per request
    requests: int
    concurrency: int


@dataclass
class Sample:
    rps: float
    p50: float
    cpu: dict[str, float | None]  # seconds per request, by process
    background: float  # CPUs that other processes on the machine kept busy meanwhile (0 where unknown)


class _RelayUp(asyncio.Protocol):
    def __init__(self, down: asyncio.Transport) -> None:
        self.down = down

    def data_received(self, data: bytes) -> None:
        self.down.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.down.close()


class _RelayDown(asyncio.Protocol):
    """A client connection of the null proxy: bytes go to its own upstream connection and back, unparsed."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.pending: list[bytes] = []
        self.up: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        self.task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        up, _ = await asyncio.get_running_loop().create_connection(
            lambda: _RelayUp(self.transport), self.host, self.port
        )
        for data in self.pending:
            up.write(data)
        self.up = up

    def data_received(self, data: bytes) -> None:
        if self.up is None:
            self.pending.append(data)
        else:
            self.up.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None:
            self.up.close()


def relay_main(argv: list[str]) -> None:
    """``proxy.py _relay PORT UPSTREAM_HOST UPSTREAM_PORT LOOP``: the null proxy, the floor of any proxy's cost:
    one upstream connection per client connection, bytes copied both ways, no HTTP parsing at all."""
    port, host, up_port, loop = int(argv[0]), argv[1], int(argv[2]), argv[3]

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: _RelayDown(host, up_port), "127.0.0.1", port)
        await asyncio.Event().wait()

    factory = None
    if loop != "asyncio":
        with contextlib.suppress(ImportError):
            import uvloop

            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve())


def _pin(pid: int, cpus: set[int] | None) -> None:
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, cpus)


def _wait_quiet(limit: float, patience: float) -> None:
    """Wait (up to ``patience`` seconds) until other processes keep at most ``limit`` CPUs busy for 0.3 s."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        start = busy_seconds()
        time.sleep(0.3)
        end = busy_seconds()
        if start is None or end is None or (end - start) / 0.3 <= limit:
            return


async def _load(url: str, requests: int, concurrency: int, stream: bool) -> tuple[float, list[float]]:
    """(seconds for all requests, per-request latencies); raises if any request fails."""
    body = {**BODY, "stream": stream}
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> None:
            async with gate:
                start = time.perf_counter()
                async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{url}: HTTP {response.status}")
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        return time.perf_counter() - start, latencies


@contextlib.contextmanager
def _proxy(upstream: str, log: Path, file: Path | None, extra: list[str]) -> Iterator[tuple[str, int]]:
    port = free_port()
    code = [PROXY_CODE] if file is None else [FILE_CODE, str(file)]
    command = [sys.executable, "-c", *code, "--listen", f"127.0.0.1:{port}", "--upstream", upstream, *extra]
    proc = subprocess.Popen([*command, "--log", str(log)], stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {proc.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("proxy not healthy after 30 s")
            time.sleep(0.05)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _relay(upstream_port: int, loop: str) -> Iterator[tuple[str, int]]:
    port = free_port()
    argv = [sys.executable, __file__, "_relay", str(port), "127.0.0.1", str(upstream_port), loop]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"relay exited with {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("relay not listening after 30 s")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait()


def _loop_of(log: Path) -> str | None:
    """The event loop the proxy reported in its ``proxy.started`` line."""
    with contextlib.suppress(OSError, ValueError):
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("event") == "proxy.started":
                return str(entry.get("loop"))
    return None


def _run(url: str, pids: dict[str, int], requests: int, concurrency: int, args: argparse.Namespace) -> Sample:
    """One timed run of ``requests`` requests, with the CPU every process (and the rest of the machine) used."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    busy = busy_seconds()
    own = time.process_time()
    seconds, latencies = asyncio.run(_load(url, requests, concurrency, args.stream))
    ours = time.process_time() - own
    busy_end = busy_seconds()
    cpu: dict[str, float | None] = {"loadgen": ours / requests}
    for name, pid in pids.items():
        start, end = before[name], cpu_seconds(pid)
        cpu[name] = None if start is None or end is None else (end - start) / requests
        ours += 0.0 if start is None or end is None else end - start
    background = 0.0 if busy is None or busy_end is None else max(0.0, (busy_end - busy - ours) / seconds)
    return Sample(requests / seconds, statistics.median(latencies), cpu, background)


def _median_cpu(samples: list[Sample], name: str) -> float | None:
    values = [v for s in samples if (v := s.cpu.get(name)) is not None]
    return round(statistics.median(values) * 1e6, 1) if values else None


def _case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = case.pinned and len(cpus) >= 2
    everything = set(cpus) or None
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_server("m", args=["--fake-latency", str(case.latency)]) as server,
        _proxy(server.root_url, Path(tmp) / "proxy.log", args.proxy_file, args.proxy_arg) as (proxy_url, proxy_pid),
    ):
        loop = _loop_of(Path(tmp) / "proxy.log") or "asyncio"
        with _relay(server.port, "uvloop" if loop.startswith("uvloop") else "asyncio") as (relay_url, relay_pid):
            pids = {"stand-in": server.proc.pid, "proxy": proxy_pid, "relay": relay_pid}
            targets = {"direct": server.root_url, "relay": relay_url, "proxy": proxy_url}
            _pin(0, {cpus[0]} if pinned else everything)
            _pin(server.proc.pid, {cpus[0]} if pinned else everything)
            _pin(proxy_pid, {cpus[1]} if pinned else everything)
            _pin(relay_pid, {cpus[1]} if pinned else everything)
            try:
                for url in targets.values():
                    _run(url, {}, min(case.requests, 300), case.concurrency, args)  # warm-up
                rounds: list[dict[str, Sample]] = []
                quiet: list[dict[str, Sample]] = []
                # Rotate the order each round, so drift hits every target alike.
                while len(rounds) < args.repeat or (len(quiet) < args.repeat and len(rounds) < 2 * args.repeat):
                    _wait_quiet(args.quiet, args.patience)
                    names = list(targets)
                    names = names[len(rounds) % 3 :] + names[: len(rounds) % 3]
                    got = {name: _run(targets[name], pids, case.requests, case.concurrency, args) for name in names}
                    rounds.append(got)
                    if max(sample.background for sample in got.values()) <= args.quiet:
                        quiet.append(got)
            finally:
                _pin(0, everything)
    counted = quiet if len(quiet) >= max(1, (args.repeat + 1) // 2) else rounds

    def med(values: Iterator[float], scale: float = 1.0, digits: int = 3) -> float:
        return round(statistics.median(values) * scale, digits)

    ratios = [r["proxy"].rps / r["direct"].rps for r in counted]
    return {
        "pinned": pinned,
        "latency_s": case.latency,
        "requests": case.requests,
        "concurrency": case.concurrency,
        "loop": loop,
        "ratio": med(iter(ratios)),
        "p50_added_ms": med((r["proxy"].p50 - r["direct"].p50 for r in counted), 1000, 2),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "relay_ratio": med(r["relay"].rps / r["direct"].rps for r in counted),
        "relay_p50_added_ms": med((r["relay"].p50 - r["direct"].p50 for r in counted), 1000, 2),
        "proxy_to_relay": med(r["proxy"].rps / r["relay"].rps for r in counted),
        "rps": {name: round(statistics.median(r[name].rps for r in counted)) for name in targets},
        "p50_ms": {name: med((r[name].p50 for r in counted), 1000, 2) for name in targets},
        "cpu_us_per_request": {
            "direct": {name: _median_cpu([r["direct"] for r in counted], name) for name in ("loadgen", "stand-in")},
            "relay": {
                name: _median_cpu([r["relay"] for r in counted], name) for name in ("loadgen", "stand-in", "relay")
            },
            "proxy": {
                name: _median_cpu([r["proxy"] for r in counted], name) for name in ("loadgen", "stand-in", "proxy")
            },
        },
        "rounds": len(rounds),
        "quiet_rounds": len(quiet),
        "counted_rounds": len(counted),
        "background_cpus": med(max(s.background for s in r.values()) for r in counted),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="per run of the cpu_bound and shared cases")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stream", action="store_true", help="send stream: true (SSE) requests")
    parser.add_argument("--repeat", type=int, default=5, help="direct/proxied pairs per case; medians count")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--replica-latency", type=float, default=0.1, help="replica_bound: stand-in s/request")
    parser.add_argument("--replica-requests", type=int, default=1000, help="replica_bound: requests per run")
    parser.add_argument("--unloaded-requests", type=int, default=500, help="unloaded: requests per run")
    parser.add_argument("--quiet", type=float, default=0.1, help="CPUs others may keep busy during a counted pair")
    parser.add_argument("--patience", type=float, default=2.0, help="seconds to wait for quiet before a pair")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default=None, help="the proxy's --loop")
    parser.add_argument("--proxy-file", type=Path, default=None, help="run main() of this copy of _proxy.py instead")
    parser.add_argument("--proxy-arg", action="append", default=[], help="an extra argument for the proxy command")
    args = parser.parse_args()
    if args.loop is not None:
        args.proxy_arg.append(f"--loop={args.loop}")
    names = [name.strip() for name in args.cases.split(",") if name.strip()]
    if not names or any(name not in CASES for name in names):
        parser.error(f"--cases: expected some of {', '.join(CASES)}")
    c = args.concurrency
    cases = {
        "cpu_bound": Case("cpu_bound", True, 0.0, args.requests, c),
        "shared": Case("shared", False, 0.0, args.requests, c),
        "replica_bound": Case("replica_bound", True, args.replica_latency, args.replica_requests, c),
        "unloaded": Case("unloaded", True, 0.0, args.unloaded_requests, 1),
    }
    results = {name: _case(cases[name], args) for name in names}
    kind = "streamed " if args.stream else ""
    print(
        f"proxy: {kind}chat requests at concurrency {args.concurrency} (unloaded: 1), {args.repeat} rounds per "
        f"case, {os.cpu_count()} CPUs (ratio = proxied/direct req/s; CPU in us per request)",
        file=sys.stderr,
    )
    for name, r in results.items():
        rps, p50, cpu = r["rps"], r["p50_ms"], r["cpu_us_per_request"]
        print(
            f"  {name} (concurrency {r['concurrency']}, stand-in {r['latency_s']} s):\n"
            f"    direct {rps['direct']}/s p50 {p50['direct']} ms | relay {rps['relay']}/s p50 {p50['relay']} "
            f"ms | proxy {rps['proxy']}/s p50 {p50['proxy']} ms\n"
            f"    ratio {r['ratio']} {r['ratio_range']}, p50 {r['p50_added_ms']:+} ms (null relay: "
            f"{r['relay_ratio']}, {r['relay_p50_added_ms']:+} ms); proxy/relay {r['proxy_to_relay']}\n"
            f"    CPU us/request: direct {cpu['direct']}, relay {cpu['relay']}, proxy {cpu['proxy']}\n"
            f"    loop {r['loop']}, background {r['background_cpus']} CPUs, {r['counted_rounds']}/{r['rounds']} rounds",
            file=sys.stderr,
        )
    sys.stderr.flush()
    head = results.get("cpu_bound") or next(iter(results.values()))
    summary = {"ratio": head["ratio"], "p50_added_ms": head["p50_added_ms"]}
    print(
        json.dumps(
            {
                "bench": "proxy",
                **summary,
                "concurrency": args.concurrency,
                "stream": args.stream,
                "repeat": args.repeat,
                "cpus": os.cpu_count(),
                **results,
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["_relay"]:
        relay_main(sys.argv[2:])
    else:
        main()
