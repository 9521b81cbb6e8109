"""What a run asked of its hosted keys and what that cost: every request its clients' gates sent, by key, model,
stage, shard and attempt, summed from each attempt's ``hosted-requests.jsonl`` (the exact record the gate appends
as requests go and come, :class:`ddslurm.config.HostedRequest`), and what each key's shared budget learned.

"Spent" counts every attempt; "kept" counts the attempts whose batches the winners hold: each stage's winner and
the attempts it resumed from (``resumed_from``, followed back). A request is in one attempt's record only, so no
request is counted twice however often a shard resumed; the granularity is the attempt (a resumed-from attempt's
unfinished batch counts as kept). Dollars come from the run's price file (``Plan.prices``), never a built-in
table; a model without a price has no dollars, and says so."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ddslurm.config import (
    ConfigError,
    HostedRequest,
    KeyBudgetState,
    Plan,
    ProviderSnapshot,
    RunLayout,
    WinnerRecord,
    budget_key,
    read_json,
)
from ddslurm.launcher.runs._records import attempt_records


@dataclass(frozen=True, slots=True)
class Tally:
    """Requests of one key and model, as the gates recorded them."""

    requests: int = 0
    """Sent to the provider (each try of a request the gate sent again after a 429 is one), less ``unreached``."""
    succeeded: int = 0
    limited: int = 0
    """Answered 429."""
    failed: int = 0
    """Answered another error, or none in time (the gate's 504)."""
    unreached: int = 0
    """Could not be delivered: the connection was refused, or closed before any answer (the gate's 502; most never
    reached the provider, which then neither counts nor bills them)."""
    unanswered: int = 0
    """Sent, and no answer on record: in flight when its client was killed (the provider may have billed it)."""
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def read_requests(path: Path) -> Iterator[HostedRequest]:
    """The lines of one ``hosted-requests.jsonl`` (a line cut short by a kill is skipped); none if there is none."""
    decoder = msgspec.json.Decoder(HostedRequest)
    try:
        data = path.read_bytes()
    except OSError:
        return
    for line in data.splitlines():
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            yield decoder.decode(line)


def tally(lines: Iterable[HostedRequest]) -> dict[tuple[str, str], Tally]:
    """Per (key, model), what the lines record: each id sent once, answered at most once."""
    sent: dict[str, HostedRequest] = {}
    answers: dict[str, HostedRequest] = {}
    for line in lines:
        (sent if line.status is None else answers)[line.id] = line
    out: dict[tuple[str, str], Tally] = {}
    for rid, request in sent.items():
        answer = answers.get(rid)
        status = None if answer is None else answer.status
        lost = answer is not None and answer.gate and status == 502
        one = Tally(
            requests=int(not lost),
            succeeded=int(status is not None and 200 <= status < 300),
            limited=int(status == 429),
            failed=int(status is not None and status >= 300 and status != 429 and not lost),
            unreached=int(lost),
            unanswered=int(answer is None),
            input_tokens=0 if answer is None else answer.input_tokens,
            output_tokens=0 if answer is None else answer.output_tokens,
        )
        where = (request.key, request.model)
        out[where] = out.get(where, Tally()) + one
    return out


@dataclass(frozen=True, slots=True)
class AttemptSpend:
    """One attempt's requests to one key and model."""

    shard: int
    stage: int | None
    attempt: str
    kept: bool
    key: str
    model: str
    tally: Tally


@dataclass(frozen=True, slots=True)
class ModelSpend:
    """One hosted model of one key over the run: spent (every attempt) and kept (the winners' attempts)."""

    key: str
    provider: str
    key_env: str | None
    model: str
    aliases: tuple[str, ...]
    spent: Tally
    kept: Tally
    spent_cost: float | None
    kept_cost: float | None
    """None: the price file has no price for the model (or the run has no price file)."""


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """What the clients of one key learned together (its ``budgets/<key>.json``), and its stated cap."""

    key: str
    provider: str
    key_env: str | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    in_flight: float | None
    """The key's requests at once as the clients' AIMD ended (None: no budget file)."""
    stated_in_flight: int | None
    stated_requests_per_minute: int | None
    stated_tokens_per_minute: int | None


@dataclass(frozen=True, slots=True)
class Minute:
    """One key's requests sent in one minute (epoch seconds of its start), and its answers that were 429s."""

    key: str
    start: int
    requests: int
    limited: int


@dataclass(frozen=True, slots=True)
class HostedSpend:
    models: tuple[ModelSpend, ...]
    attempts: tuple[AttemptSpend, ...]
    keys: tuple[KeyLimits, ...]
    kept_rows: int
    currency: str | None
    """The price file's currency; None: the run has no price file."""
    minutes: tuple[Minute, ...] = ()
    """Per key, minute by minute (only minutes with a request)."""

    @property
    def spent(self) -> Tally:
        return sum((m.spent for m in self.models), Tally())

    @property
    def kept(self) -> Tally:
        return sum((m.kept for m in self.models), Tally())

    @property
    def spent_cost(self) -> float | None:
        """The dollars of every priced model (None when no model has a price)."""
        costs = [m.spent_cost for m in self.models if m.spent_cost is not None]
        return sum(costs) if costs else None

    @property
    def cost_per_1000_kept_rows(self) -> float | None:
        """Everything spent over the rows kept, per 1,000 rows."""
        cost = self.spent_cost
        return None if cost is None or self.kept_rows <= 0 else cost / self.kept_rows * 1000

    @property
    def unpriced(self) -> tuple[str, ...]:
        """Models with requests and no price, while the run has a price file."""
        if self.currency is None:
            return ()
        return tuple(sorted({m.model for m in self.models if m.spent_cost is None and m.spent.requests}))


def _stages(plan: Plan) -> tuple[int | None, ...]:
    return (0, 1) if len(plan.stages) >= 2 else (None,)


def _winner(layout: RunLayout, shard: int, stage: int | None) -> WinnerRecord | None:
    try:
        return read_json(layout.stage_shard(shard, stage).winner, WinnerRecord)
    except (FileNotFoundError, ConfigError, OSError):
        return None


def _kept_attempts(winner: WinnerRecord | None, resumed: dict[str, str | None]) -> set[str]:
    """The stage's winner and the attempts it resumed from, back to the first."""
    attempt = None if winner is None else winner.attempt
    kept: set[str] = set()
    while attempt is not None and attempt not in kept:
        kept.add(attempt)
        attempt = resumed.get(attempt)
    return kept


def hosted_spend(layout: RunLayout, plan: Plan, snapshot: ProviderSnapshot) -> HostedSpend:
    """The run's hosted requests as its attempts recorded them, summed per key and model, with their dollars."""
    attempts: list[AttemptSpend] = []
    per_minute: dict[tuple[str, int], tuple[int, int]] = {}
    kept_rows = 0
    last = _stages(plan)[-1]
    for shard in range(len(plan.shards)):
        for stage in _stages(plan):
            records = attempt_records(layout, shard, stage)
            winner = _winner(layout, shard, stage)
            kept = _kept_attempts(winner, {r.attempt: r.resumed_from for r in records})
            if stage == last and winner is not None:
                kept_rows += winner.rows
            for record in sorted(records, key=lambda r: r.attempt):
                path = layout.stage_shard(shard, stage).attempt(record.attempt).hosted_requests
                lines = list(read_requests(path))
                for line in lines:
                    at = (line.key, int(line.at // 60 * 60))
                    sent, limited = per_minute.get(at, (0, 0))
                    per_minute[at] = (sent + (line.status is None), limited + (line.status == 429))
                for (key, model), counted in sorted(tally(lines).items()):
                    attempts.append(AttemptSpend(shard, stage, record.attempt, record.attempt in kept, key, model,
                                                 counted))  # fmt: skip
    providers = {budget_key(p.endpoint, p.api_key_env): p for p in snapshot.providers if not p.local}
    prices = plan.prices
    models: list[ModelSpend] = []
    for key, model in sorted({(a.key, a.model) for a in attempts}):
        mine = [a for a in attempts if (a.key, a.model) == (key, model)]
        spent = sum((a.tally for a in mine), Tally())
        kept_tally = sum((a.tally for a in mine if a.kept), Tally())
        provider = providers.get(key)
        aliases = tuple(sorted(m.alias for m in snapshot.models if provider is not None and
                               (m.provider, m.model) == (provider.name, model)))  # fmt: skip

        def cost(t: Tally, model: str = model) -> float | None:
            return None if prices is None else prices.tokens_cost(model, t.input_tokens, t.output_tokens)

        models.append(
            ModelSpend(
                key=key,
                provider=provider.name if provider is not None else "?",
                key_env=provider.api_key_env if provider is not None else None,
                model=model,
                aliases=aliases,
                spent=spent,
                kept=kept_tally,
                spent_cost=cost(spent),
                kept_cost=cost(kept_tally),
            )
        )
    keys = []
    for key, provider in sorted(providers.items()):
        try:
            state: KeyBudgetState | None = read_json(layout.budgets / f"{key}.json", KeyBudgetState)
        except (FileNotFoundError, ConfigError, OSError):
            state = None
        stated = plan.hosted_limits.get(provider.name)
        keys.append(
            KeyLimits(
                key=key,
                provider=provider.name,
                key_env=provider.api_key_env,
                requests_per_minute=None if state is None else state.requests_per_minute,
                tokens_per_minute=None if state is None else state.tokens_per_minute,
                in_flight=None if state is None else round(state.ceiling, 1),
                stated_in_flight=None if stated is None else stated.in_flight,
                stated_requests_per_minute=None if stated is None else stated.requests_per_minute,
                stated_tokens_per_minute=None if stated is None else stated.tokens_per_minute,
            )
        )
    return HostedSpend(
        models=tuple(models),
        attempts=tuple(attempts),
        keys=tuple(keys),
        kept_rows=kept_rows,
        currency=None if prices is None else prices.currency,
        minutes=tuple(Minute(key, start, *counts) for (key, start), counts in sorted(per_minute.items())),
    )
