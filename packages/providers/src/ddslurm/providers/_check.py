"""Reachability of hosted endpoints (``ddslurm providers --check``): is the model listed, is the key accepted.

One ``GET {endpoint}/models`` per provider, with the provider's static headers and its key as a bearer token,
as Data Designer would send them. The key is read from the environment and only ever put in that header;
results name statuses and reasons, never the key. Some hosted services list their models without checking the
key, so "ok" means the endpoint answers and lists the model, and the key was not refused.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from ddslurm.config import SnapshotProvider
from ddslurm.providers._resolve import AliasRow, Resolution

Fetch = Callable[[str, Mapping[str, str], float], tuple[int, bytes]]
"""``fetch(url, headers, timeout) -> (status, body)``; raises OSError when the endpoint cannot be reached."""

_MAX_BODY = 4 << 20


def urllib_fetch(url: str, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
    """GET ``url`` with the standard library; HTTP errors are answers (their status), not exceptions."""
    request = urllib.request.Request(url, headers=dict(headers), method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status: int = response.status
            return status, response.read(_MAX_BODY)
    except urllib.error.HTTPError as exc:
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
            except (OSError, ValueError) as exc:
                self._answers[provider.name] = f"unreachable: {exc}"
            else:
                self._answers[provider.name] = (status, _listed(body) if status == 200 else None)
        return self._answers[provider.name]

    def check(self, row: AliasRow, provider: SnapshotProvider) -> str:
        """The result for one hosted row: ``ok``, ``key refused (HTTP 401)``, ``model not listed by /models``,
        ``HTTP <status> from /models``, ``unreachable: <reason>`` or ``not checked: <why>``."""
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
