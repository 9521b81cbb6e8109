"""One hosted key's shared rate budget, as the run directory holds it (``budgets/<key>.json``): what every client
step of every allocation that uses the key learned of its limits, and what each of them asks for now. The runtime
reads and rewrites it a few times a minute per client under a lock (``ddslurm.runtime._key_budget``); ``status``
and the report read it. Numbers only: the key is named by a digest of its endpoint and variable name, never by its
value."""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec

from ddslurm.config._base import Frozen

Count = Annotated[int, msgspec.Meta(ge=0)]
PerMinute = Annotated[int, msgspec.Meta(ge=1, le=100_000_000)]


def budget_key(endpoint: str, api_key_env: str | None) -> str:
    """The name of a key's budget: the same for every client of one endpoint and key variable (two providers on one
    endpoint with one variable share a key), and it says nothing of the key's value."""
    return hashlib.sha256(f"{endpoint.rstrip('/')}\0{api_key_env or ''}".encode()).hexdigest()[:16]


class BudgetMember(Frozen, frozen=True, kw_only=True):
    """One client step's last report: what it wants and what it holds."""

    updated_at: float
    """Epoch seconds of the report; a member silent for :data:`ddslurm.runtime._key_budget.STALE_S` is gone (its
    share returns to the others)."""
    demand: Count
    """Requests it had in flight or waiting then."""
    in_flight: Count


class KeyBudgetState(Frozen, frozen=True, kw_only=True):
    """What the clients of one key know together."""

    key: str
    ceiling: Annotated[float, msgspec.Meta(ge=1)]
    """The requests the key admits at once, all clients together: grown by one for every ``ceiling`` answers
    without a 429, cut to 3/4 by a 429 (at most once a :data:`DECREASE_GAP_S`)."""
    requests_per_minute: PerMinute | None = None
    """The key's requests a minute: the provider's ``x-ratelimit-limit-requests`` (or Anthropic's), lowered to a
    stated cap; None: not known (only ``ceiling`` bounds it)."""
    tokens_per_minute: PerMinute | None = None
    paused_until: float = 0.0
    """Epoch seconds before which no client sends (the longest ``Retry-After`` a client was given)."""
    decreased_at: float = 0.0
    answered: Count = 0
    """Answers the clients reported, all of them (the key's own count: 429s included)."""
    limited: Count = 0
    """Of ``answered``, the 429s."""
    tokens: Count = 0
    """Tokens (input and output) of the answers the clients reported: with ``answered - limited``, the tokens a
    request costs, which turns ``tokens_per_minute`` into requests a minute."""
    checked: dict[str, float] = msgspec.field(default_factory=dict)
    """Model (as the provider names it) -> when a client's start-up check of it was last answered 200 (epoch
    seconds): a client starting within a few minutes of that checks it no more (one check for the run, not one
    per shard)."""
    members: dict[str, BudgetMember] = msgspec.field(default_factory=dict)


class HostedRequest(Frozen, frozen=True, kw_only=True):
    """One line of an attempt's ``hosted-requests.jsonl``, the exact record of its hosted requests: one line when a
    request is sent to the provider (``status`` None), one when its answer comes (``status``, the ``usage``
    tokens). Appended as it happens, so a client killed at any moment leaves every request it sent on record; one
    sent and never answered was in flight then (the provider may have billed it: its tokens are not known)."""

    id: str
    """The request's ``X-Client-Request-Id`` (``<job>-<attempt>-<n>``), as the provider received it."""
    key: str
    model: str
    at: float
    """Epoch seconds."""
    status: int | None = None
    gate: bool = False
    """The gate made the answer (the provider's was late, 504, or unreachable, 502), not the provider."""
    input_tokens: Count = 0
    output_tokens: Count = 0
