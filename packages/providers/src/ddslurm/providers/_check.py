"""Reachability of hosted endpoints (``ddslurm providers --check``): is the model listed, is the key accepted.

One ``GET {endpoint}/models`` per provider, with the provider's static headers and its key as a bearer token,
as Data Designer would send them. The key is read from the environment and only ever put in that header;
results name statuses and reasons, never the key. Some hosted services list their models without checking the
key, so "ok" means the endpoint answers and lists the model, and the key was not refused.

A redirect is never followed: the request carries the key, and a redirect may point anywhere (another host, a
port another user listens on). It is a failed check that names the origin it pointed to (scheme, host, port).
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from email.message import Message
from typing import IO, Any
from urllib.parse import urljoin, urlsplit

from ddslurm.config import ProviderSnapshot, SnapshotProvider
from ddslurm.providers._resolve import AliasRow, Resolution
from ddslurm.providers._secrets import redact_url
from ddslurm.providers.errors import RedirectedError

Fetch = Callable[[str, Mapping[str, str], float], tuple[int, bytes]]
"""``fetch(url, headers, timeout) -> (status, body)``; raises OSError when the endpoint cannot be reached and
:class:`RedirectedError` when it answers with a redirect, which a fetch must never follow (``headers`` carry the
key)."""

_MAX_BODY = 4 << 20


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows redirects by default, every header included (``Authorization`` too, to any host): here a
    redirect is an answer, handed on as the HTTPError of its status."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def origin_of(url: str, location: str) -> str:
    """The origin (``scheme://host:port``) that ``location``, a redirect's target relative to ``url``, points at;
    no user-info, path or query (they may hold credentials)."""
    try:
        parts = urlsplit(urljoin(url, location.strip()))
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "an invalid URL"
    if not parts.scheme or not host:
        return "an invalid URL"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def urllib_fetch(url: str, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
    """GET ``url`` with the standard library; HTTP errors are answers (their status), not exceptions, and a
    redirect is never followed (:class:`RedirectedError`)."""
    request = urllib.request.Request(url, headers=dict(headers), method="GET")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            status: int = response.status
            return status, response.read(_MAX_BODY)
    except urllib.error.HTTPError as exc:
        location = exc.headers.get("Location") if exc.headers is not None else None
        if 300 <= exc.code < 400 and location:
            raise RedirectedError(exc.code, origin_of(url, location)) from None
        return exc.code, b""
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from exc


def _listed(body: bytes) -> set[str] | None:
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    return {str(e["id"]) for e in entries if isinstance(e, dict) and "id" in e}


class EndpointChecker:
    """Checks hosted rows against their providers; one request per provider however many aliases use it."""

    def __init__(self, env: Mapping[str, str], fetch: Fetch = urllib_fetch, timeout: float = 10.0) -> None:
        self._env = env
        self._fetch = fetch
        self._timeout = timeout
        self._answers: dict[str, tuple[int, set[str] | None] | str] = {}

    def _ask(self, provider: SnapshotProvider) -> tuple[int, set[str] | None] | str:
        if provider.name not in self._answers:
            headers = dict(provider.extra_headers or {})
            if provider.api_key_env:
                headers["Authorization"] = f"Bearer {self._env[provider.api_key_env]}"
            url = f"{provider.endpoint.rstrip('/')}/models"
            try:
                status, body = self._fetch(url, headers, self._timeout)
            except RedirectedError as exc:
                sent = "not followed, the key was not sent there" if provider.api_key_env else "not followed"
                self._answers[provider.name] = f"redirected to {exc.origin} (HTTP {exc.status}; {sent})"
            except (OSError, ValueError) as exc:
                self._answers[provider.name] = f"unreachable: {exc}"
            else:
                self._answers[provider.name] = (status, _listed(body) if status == 200 else None)
        return self._answers[provider.name]

    def check(self, row: AliasRow, provider: SnapshotProvider) -> str:
        """The result for one hosted row: ``ok``, ``key refused (HTTP 401)``, ``model not listed by /models``,
        ``HTTP <status> from /models``, ``redirected to <origin> (...)``, ``unreachable: <reason>`` or
        ``not checked: <why>``."""
        if row.key_literal:
            return "not checked: api_key is a literal key"
        if row.endpoint != provider.endpoint:
            return "not checked: the endpoint carries credentials"
        if row.key_env is not None and not row.key_set:
            return f"not checked: {row.key_env} is unset"
        answer = self._ask(provider)
        if isinstance(answer, str):
            return answer
        status, listed = answer
        if status in (401, 403):
            return f"key refused (HTTP {status})" if row.key_env else f"a key is required (HTTP {status})"
        if status != 200:
            return f"HTTP {status} from /models"
        if listed is None:
            return "answered /models without a model list"
        return "ok" if row.model in listed else "model not listed by /models"


def check_endpoints(
    resolution: Resolution, env: Mapping[str, str], *, fetch: Fetch = urllib_fetch, timeout: float = 10.0
) -> Resolution:
    """``resolution`` with every hosted row's ``check`` filled in (local and unresolved rows stay unchecked)."""
    checker = EndpointChecker(env, fetch, timeout)
    providers = {p.name: p for p in resolution.snapshot.providers}
    rows = tuple(
        dataclasses.replace(row, check=checker.check(row, providers[row.provider]))
        if row.kind == "hosted" and row.provider in providers
        else row
        for row in resolution.rows
    )
    return dataclasses.replace(resolution, rows=rows)


def snapshot_resolution(snapshot: ProviderSnapshot, env: Mapping[str, str]) -> Resolution:
    """The hosted aliases of a run's frozen provider snapshot (the providers and models its attempts use) as rows
    :func:`check_endpoints` checks, each key read from ``env``: ``ddslurm retry`` asks them again after an attempt
    ended ``key_refused``. Local aliases are left out (their key is the attempt's own token)."""
    providers = {p.name: p for p in snapshot.providers if not p.local}
    rows = tuple(
        AliasRow(
            m.alias,
            "hosted",
            p.name,
            redact_url(p.endpoint),
            m.model,
            p.api_key_env,
            bool(env.get(p.api_key_env)) if p.api_key_env else None,
        )
        for m in snapshot.models
        if (p := providers.get(m.provider)) is not None
    )
    return Resolution(snapshot=snapshot, rows=rows)
