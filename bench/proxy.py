"""Reverse-proxy overhead against its floor, measured in the same run.

Baseline: N chat requests at concurrency C sent straight to one vLLM stand-in.
Measured: the same requests through ``ddslurm-runtime proxy`` (its ``main()`` in a subprocess, as deployed)
in front of that same stand-in.

    uv run python bench/proxy.py [--requests 2000] [--concurrency 64] [--latency 0] [--stream]

Prints requests/s of both, the ratio proxy/direct (1.0 = free) and the p50 latency the proxy adds.
With ``--latency 0`` the stand-in answers as fast as it can, so this is the proxy's worst case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx

from fake_vllm.testing import free_port, start_server

BODY = {"model": "m", "messages": [{"role": "user", "content": "Write one sentence."}], "max_tokens": 64}
PROXY_CODE = "import sys; from ddslurm.runtime._proxy import main; sys.exit(main(sys.argv[1:]))"


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
def _proxy(upstream: str, log: Path) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-c", PROXY_CODE, "--listen", f"127.0.0.1:{port}", "--upstream", upstream]
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
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(url: str, args: argparse.Namespace) -> tuple[float, float]:
    """(requests/s, p50 latency in s) after a short warm-up."""
    asyncio.run(_load(url, min(args.requests, 200), args.concurrency, args.stream))
    seconds, latencies = asyncio.run(_load(url, args.requests, args.concurrency, args.stream))
    return args.requests / seconds, statistics.median(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.0, help="stand-in seconds per request (--fake-latency)")
    parser.add_argument("--stream", action="store_true", help="send stream: true (SSE) requests")
    parser.add_argument("--repeat", type=int, default=2, help="alternate direct/proxy runs; the best of each counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, start_server("m", args=["--fake-latency", str(args.latency)]) as server:
        direct: list[tuple[float, float]] = []
        proxied: list[tuple[float, float]] = []
        with _proxy(server.root_url, Path(tmp) / "proxy.log") as proxy_url:
            for _ in range(args.repeat):
                direct.append(_run(server.root_url, args))
                proxied.append(_run(proxy_url, args))
    d_rps, d_p50 = max(direct)
    p_rps, p_p50 = max(proxied)
    kind = "streamed " if args.stream else ""
    print(f"proxy: {args.requests} {kind}chat requests, concurrency {args.concurrency}, latency {args.latency}s")
    print(f"  direct to the stand-in:  {d_rps:8.0f} req/s   p50 {d_p50 * 1000:7.1f} ms")
    print(f"  through the proxy:       {p_rps:8.0f} req/s   p50 {p_p50 * 1000:7.1f} ms")
    print(f"  ratio proxy/direct:      {p_rps / d_rps:8.2f}   p50 added {(p_p50 - d_p50) * 1000:+7.1f} ms")


if __name__ == "__main__":
    main()
