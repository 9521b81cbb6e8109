"""The calibration sweep of a ``ddslurm tune`` allocation: after its generation succeeded and before teardown,
each deployed alias's replica 0 is measured at increasing concurrency, with the recipe's own requests.

    for each alias: the bodies its proxy recorded (prompts-<alias>.jsonl)
        for each level (1, 2, 4, ... its replica's capacity): ``level`` requests kept in flight (a closed loop)
            against replica 0's own listener (its Unix-domain socket or loopback port, the allocation's token)
            until at least MIN_LEVEL_S have passed and every slot has completed REQUESTS_PER_SLOT requests
            -> ConcurrencyPoint(level, completions / elapsed)
    -> calibration.json (Calibration: per alias its load time, its sweep, how many prompts it replayed)

A request that fails (a status other than 200, a connection error) fails the sweep: the allocation's tune run
then fails with ``calibration_failed`` and the reason.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ddslurm.config import (
    Calibration,
    CalibrationEntry,
    ConcurrencyPoint,
    ServingPlan,
    atomic_write,
    calibration_file,
    calibration_levels,
    encode_pretty,
    prompts_file,
)
from ddslurm.runtime._listeners import http_base, socket_path
from ddslurm.runtime._prompts import read_prompts
from ddslurm.runtime._serving import auth_headers
from ddslurm.runtime.errors import RuntimeFailure

MIN_LEVEL_S = 3.0
"""Seconds each level keeps its requests in flight, at least."""
REQUESTS_PER_SLOT = 4
"""Requests each of a level's slots completes, at least."""
MAX_LEVEL_S = 300.0
"""A level that has not met both bounds after this long ends anyway (a very slow replica)."""
REQUEST_TIMEOUT_S = 600.0


class CalibrationError(RuntimeFailure):
    reason = "calibration_failed"


@dataclass(frozen=True, slots=True)
class Target:
    """One alias to measure: its replica 0's listener (``http://HOST:PORT`` or ``unix:/path``) and capacity."""

    alias: str
    url: str
    capacity: int


def _client(url: str, connections: int) -> httpx.Client:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    path = socket_path(url)
    transport = httpx.HTTPTransport(uds=str(path), limits=limits) if path is not None else None
    return httpx.Client(transport=transport, limits=limits, timeout=REQUEST_TIMEOUT_S)


def measure_level(
    url: str,
    token: str | None,
    bodies: Sequence[bytes],
    level: int,
    *,
    min_s: float = MIN_LEVEL_S,
    per_slot: int = REQUESTS_PER_SLOT,
    max_s: float = MAX_LEVEL_S,
    clock: Callable[[], float] = time.monotonic,
    check: Callable[[], None] = lambda: None,
) -> ConcurrencyPoint:
    """Requests per second of the listener at ``url`` with ``level`` requests in flight: each of ``level`` slots
    sends the bodies in turn (a closed loop: its next request as soon as its last is answered) until ``min_s``
    have passed and it has completed ``per_slot`` requests (or ``max_s`` have passed); completions / elapsed.
    ``check`` runs before each request and may raise to stop the sweep (the job's stop signal)."""
    if not bodies:
        raise CalibrationError("no recorded request to replay")
    target = f"{http_base(url)}/v1/chat/completions"
    headers = {**auth_headers(token), "Content-Type": "application/json"}
    turn = itertools.count()
    lock = threading.Lock()
    started = clock()

    def slot(client: httpx.Client) -> int:
        done = 0
        while True:
            elapsed = clock() - started
            if (elapsed >= min_s and done >= per_slot) or elapsed >= max_s:
                return done
            check()
            with lock:
                body = bodies[next(turn) % len(bodies)]
            try:
                response = client.post(target, content=body, headers=headers)
            except httpx.HTTPError as exc:
                raise CalibrationError(f"a request to {url} failed at {level} in flight: {type(exc).__name__}") from exc
            if response.status_code != 200:
                raise CalibrationError(
                    f"{url} answered {response.status_code} at {level} in flight: {response.text[:300]}"
                )
            done += 1

    with _client(url, level) as client, ThreadPoolExecutor(max_workers=level, thread_name_prefix="sweep") as pool:
        completed = sum(pool.map(lambda _: slot(client), range(level)))
    elapsed = clock() - started
    return ConcurrencyPoint(in_flight=level, requests_per_s=round(completed / elapsed, 4))


def sweep(
    url: str, token: str | None, bodies: Sequence[bytes], levels: Sequence[int], log: Any, **bounds: Any
) -> tuple[ConcurrencyPoint, ...]:
    """:func:`measure_level` at each of ``levels`` in turn."""
    points = []
    for level in levels:
        point = measure_level(url, token, bodies, level, **bounds)
        log.info("calibration.level", url=url, in_flight=level, requests_per_s=point.requests_per_s)
        points.append(point)
    return tuple(points)


def targets(serving: ServingPlan, replica_urls: Mapping[str, str], levels: Sequence[int]) -> list[Target]:
    """Each deployment's replica 0 (its URL in ``replica_urls``) and its capacity (the plan's; else the highest
    level)."""
    return [
        Target(d.alias, replica_urls[d.alias], d.capacity or max(levels))
        for d in serving.deployments
        if d.alias in replica_urls
    ]


def calibrate(
    serving: ServingPlan,
    levels: Sequence[int],
    directory: Path,
    replica_urls: Mapping[str, str],
    load_s: Mapping[str, float],
    token: str | None,
    log: Any,
    **bounds: Any,
) -> Calibration:
    """Measure every deployed alias (:func:`sweep` of its replica 0 at those of ``levels`` its capacity allows:
    1, 2, 4, ... and the capacity itself, :func:`~ddslurm.config.calibration_levels`) with the bodies its proxy
    recorded in ``directory``; write and return ``calibration.json``. :class:`CalibrationError` when an alias
    has no recorded request or a request fails."""
    entries = []
    for target in targets(serving, replica_urls, levels):
        bodies = read_prompts(prompts_file(directory, target.alias))
        if not bodies:
            raise CalibrationError(
                f"the proxy of {target.alias!r} recorded no chat completion request to replay "
                f"({prompts_file(directory, target.alias)}): does the recipe send it any?"
            )
        own = [level for level in calibration_levels(target.capacity) if level in set(levels)]
        log.info("calibration.alias", alias=target.alias, levels=own, prompts=len(bodies))
        points = sweep(target.url, token, bodies, own, log, **bounds)
        entries.append(
            CalibrationEntry(alias=target.alias, load_s=round(load_s.get(target.alias, 0.0), 3), sweep=points,
                             prompts=len(bodies))
        )  # fmt: skip
    calibration = Calibration(entries=tuple(entries))
    atomic_write(calibration_file(directory), encode_pretty(calibration))
    return calibration
