"""One hosted key's budget shared by many clients: the settling rule on its own, through its file, and a
simulated key (a fake clock, never a sleep) that 40 clients share."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddslurm.config import KeyBudgetState, budget_key, exclusive_lock
from ddslurm.config.testing import wait_for_lock_waiter
from ddslurm.runtime._key_budget import (
    CHECK_FRESH_S,
    DECREASE,
    INTERVAL_S,
    STALE_S,
    START_CEILING,
    Caps,
    Pacer,
    Report,
    Share,
    fallback_share,
    request_rate,
    settle,
    settle_file,
)
from ddslurm.runtime._rate_headers import RateSignal

KEY = budget_key("https://api.example.com/v1", "EXAMPLE_API_KEY")


def test_the_key_is_named_by_its_endpoint_and_variable_never_its_value() -> None:
    assert budget_key("https://api.example.com/v1/", "EXAMPLE_API_KEY") == KEY  # one endpoint, written two ways
    assert budget_key("https://api.example.com/v1", "OTHER_API_KEY") != KEY
    assert len(KEY) == 16 and KEY.isalnum()


def test_a_new_key_starts_small_and_shares_by_demand() -> None:
    state, first = settle(None, KEY, Report("a", demand=12, in_flight=0), Caps(), now=100.0)
    assert (state.ceiling, first.in_flight, first.requests_per_minute) == (START_CEILING, 4, None)
    state, second = settle(state, KEY, Report("b", demand=4, in_flight=0), Caps(), now=101.0)
    assert second.in_flight == math.floor(START_CEILING * 4 / 16)  # its part of what all of them want
    assert set(state.members) == {"a", "b"}


def test_answers_without_429_grow_the_ceiling_only_while_more_is_wanted() -> None:
    state, _ = settle(None, KEY, Report("a", demand=40, in_flight=4), Caps(), now=0.0)
    state, _ = settle(state, KEY, Report("a", demand=40, in_flight=4, answered=8), Caps(), now=2.0)
    assert state.ceiling == START_CEILING + 8 / START_CEILING
    full = state.ceiling
    state, _ = settle(state, KEY, Report("a", demand=2, in_flight=2, answered=8), Caps(), now=4.0)
    assert state.ceiling == full  # it had more than it wanted: nothing learned of the key


def test_a_429_cuts_the_ceiling_once_for_a_burst_and_pauses_everyone_for_the_retry_after() -> None:
    state = KeyBudgetState(key=KEY, ceiling=16.0)
    state, _ = settle(state, KEY, Report("a", demand=8, in_flight=8, answered=3, limited=1, retry_after_s=5.0),
                      Caps(), now=10.0)  # fmt: skip
    assert (state.ceiling, state.paused_until) == (16.0 * DECREASE, 15.0)
    state, share = settle(state, KEY, Report("b", demand=8, in_flight=8, answered=2, limited=2), Caps(), now=11.0)
    assert state.ceiling == 16.0 * DECREASE  # the same burst: not cut again
    assert share.paused_until == 15.0  # b was told to wait too
    assert (state.answered, state.limited) == (5, 3)
    state, _ = settle(state, KEY, Report("b", demand=8, in_flight=8, answered=1, limited=1), Caps(), now=13.0)
    assert state.ceiling == 16.0 * DECREASE * DECREASE


def test_the_headers_teach_the_rate_and_a_spent_window_pauses_before_any_429() -> None:
    signal = RateSignal(requests_limit=120, requests_remaining=0, requests_reset_s=0.5)
    state, share = settle(None, KEY, Report("a", demand=6, in_flight=2, answered=1, signal=signal), Caps(), now=3.0)
    assert (state.requests_per_minute, share.paused_until) == (120, 3.5)
    state, share = settle(state, KEY, Report("b", demand=2, in_flight=0), Caps(), now=4.0)
    assert share.requests_per_minute == 120 * 2 / 8


def test_a_stated_cap_lowers_what_was_learned() -> None:
    signal = RateSignal(requests_limit=10_000, tokens_limit=2_000_000)
    caps = Caps(in_flight=2, requests_per_minute=60, tokens_per_minute=100_000)
    state, share = settle(None, KEY, Report("a", demand=50, in_flight=0, answered=40, signal=signal), caps, now=0.0)
    assert (state.requests_per_minute, state.tokens_per_minute, state.ceiling) == (60, 100_000, 2.0)
    assert (share.in_flight, share.requests_per_minute) == (2, 60.0)


def test_tokens_a_minute_bound_the_requests_by_what_an_answer_costs() -> None:
    """A key of 100,000 tokens a minute whose answers cost 2,000 tokens each admits 50 requests a minute, fewer
    than its 120; with nothing answered yet, its tokens say nothing about requests."""
    caps = Caps(tokens_per_minute=100_000)
    signal = RateSignal(requests_limit=120)
    state, share = settle(None, KEY, Report("a", demand=8, in_flight=0, signal=signal), caps, now=0.0)
    assert (request_rate(state), share.requests_per_minute) == (120.0, 120.0)
    report = Report("a", demand=8, in_flight=4, answered=12, limited=2, tokens=20_000)  # 10 answers, 2,000 each
    state, share = settle(state, KEY, report, caps, now=2.0)
    assert state.tokens == 20_000 and request_rate(state) == 100_000 / 2_000
    assert share.requests_per_minute == 50.0  # the only member: the whole rate


def test_a_model_checked_by_one_client_is_checked_for_the_run_for_a_while() -> None:
    state, share = settle(None, KEY, Report("a", demand=1, in_flight=0, checked=("m",)), Caps(), now=100.0)
    assert share.checked == {"m"} and state.checked == {"m": 100.0}
    state, share = settle(state, KEY, Report("b", demand=1, in_flight=0), Caps(), now=100.0 + CHECK_FRESH_S)
    assert share.checked == {"m"}
    state, share = settle(state, KEY, Report("b", demand=1, in_flight=0), Caps(), now=101.0 + CHECK_FRESH_S)
    assert share.checked == frozenset() and state.checked == {}  # long ago: checked again


def test_a_silent_member_is_gone_and_an_idle_one_leaves() -> None:
    state, _ = settle(None, KEY, Report("dead", demand=30, in_flight=4), Caps(), now=0.0)
    state, share = settle(state, KEY, Report("alive", demand=10, in_flight=0), Caps(), now=STALE_S + 1)
    assert set(state.members) == {"alive"} and share.in_flight == math.floor(START_CEILING)
    state, _ = settle(state, KEY, Report("alive", demand=0, in_flight=0), Caps(), now=STALE_S + 2)
    assert state.members == {}


def test_settling_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / f"{KEY}.json"
    settle_file(path, KEY, Report("a", demand=4, in_flight=0), Caps(), now=1.0)
    share = settle_file(path, KEY, Report("b", demand=4, in_flight=0), Caps(), now=2.0)
    assert share.in_flight == 2
    held = json.loads(path.read_text())
    assert held["key"] == KEY and set(held["members"]) == {"a", "b"}
    assert path.stat().st_mode & 0o077 == 0
    path.write_text("{not json")  # damaged: learned again, never an error
    assert settle_file(path, KEY, Report("a", demand=4, in_flight=0), Caps(), now=3.0).in_flight == 4
    blocked = tmp_path / "gone" / f"{KEY}.json"  # its folder missing: the small safe share
    assert (
        settle_file(blocked, KEY, Report("a", demand=4, in_flight=0), Caps(60), now=4.0)
        == fallback_share(Caps(60))
        == Share(in_flight=1, requests_per_minute=None, paused_until=0.0)
    )


def test_a_client_settling_waits_for_another_clients_lock_however_long_it_holds_it(tmp_path: Path) -> None:
    """The key's file is settled under a blocking lock (:func:`ddslurm.config.exclusive_lock` without a bound): a
    client whose neighbour holds it waits, and then settles its real share, never the small safe one."""
    path = tmp_path / f"{KEY}.json"
    lock = tmp_path / f"{KEY}.json.lock"
    shares: list[Share] = []
    thread = threading.Thread(
        target=lambda: shares.append(settle_file(path, KEY, Report("a", demand=4, in_flight=0), Caps(60), now=1.0)),
        daemon=True,
    )
    with exclusive_lock(lock, wait_s=0):  # another client settling
        thread.start()
        wait_for_lock_waiter(lock)
        assert shares == [] and not path.exists()  # waiting, not settled with the fallback
    thread.join(60)
    assert shares and shares[0] != fallback_share(Caps(60)), shares
    assert set(json.loads(path.read_text())["members"]) == {"a"}


def test_a_lock_file_that_is_not_the_clients_own_gives_the_small_safe_share(tmp_path: Path) -> None:
    path = tmp_path / f"{KEY}.json"
    target = tmp_path / "elsewhere"
    (tmp_path / f"{KEY}.json.lock").symlink_to(target)
    assert settle_file(path, KEY, Report("a", demand=4, in_flight=0), Caps(60), now=1.0) == fallback_share(Caps(60))
    assert not target.exists() and not path.exists()  # never followed, nothing written


# --- a simulated key shared by 40 clients: a fake clock in steps of 0.1 s ---

LIMIT_RPM, LIMIT_AT_ONCE, LATENCY_S, STEP_S = 120, 16, 1.0, 0.1


@dataclass
class Provider:
    """A key of 120 requests a minute as OpenAI counts them (a bucket of 120 refilled at 2 a second) and 16 at
    once: 429 with ``Retry-After`` above either, the rate headers on every answer."""

    bucket: float = float(LIMIT_RPM)
    at: float = 0.0
    running: list[float] = field(default_factory=list)
    answers: int = 0
    limited: int = 0

    def ask(self, now: float) -> tuple[bool, RateSignal]:
        self.bucket = min(float(LIMIT_RPM), self.bucket + (now - self.at) * LIMIT_RPM / 60)
        self.at = now
        self.running = [t for t in self.running if t > now]
        self.answers += 1
        if self.bucket < 1 or len(self.running) >= LIMIT_AT_ONCE:
            self.limited += 1
            reset = (1 - self.bucket) * 60 / LIMIT_RPM if self.bucket < 1 else 0.0
            signal = RateSignal(requests_limit=LIMIT_RPM, requests_remaining=math.floor(self.bucket),
                                requests_reset_s=reset, retry_after_s=max(reset, 0.5))  # fmt: skip
            return False, signal
        self.bucket -= 1
        self.running.append(now + LATENCY_S)
        reset = (LIMIT_RPM - self.bucket) * 60 / LIMIT_RPM
        return True, RateSignal(requests_limit=LIMIT_RPM, requests_remaining=math.floor(self.bucket),
                                requests_reset_s=reset)  # fmt: skip


@dataclass
class Client:
    name: str
    todo: int
    pacer: Pacer
    running: list[float] = field(default_factory=list)
    answered: int = 0
    limited: int = 0
    signal: RateSignal | None = None
    retry_after: float | None = None
    next_settle: float = 0.0


@pytest.mark.parametrize("clients", [8, 40, 200])
def test_clients_sharing_one_key_use_it_near_its_limit_with_few_429s(clients: int) -> None:
    """240 requests spread over ``clients`` clients that start together and settle every 2 s at their own moments:
    every request is done, under 5 % of all answers are 429s, and the key's requests a minute are used at 0.9 of
    the limit or more (from the first request to the last answer)."""
    provider, state = Provider(), None
    total = 240
    fleet = [Client(f"c{i}", total // clients + (i < total % clients), Pacer(f"c{i}")) for i in range(clients)]
    for i, c in enumerate(fleet):
        c.next_settle = i * INTERVAL_S / clients
    now, done, last = 0.0, 0, 0.0
    while done < total and now < 3600:
        for c in fleet:
            finished = [t for t in c.running if t <= now]
            c.running = [t for t in c.running if t > now]
            done += len(finished)
            last = now if finished else last
            if now >= c.next_settle:
                report = Report(c.name, demand=c.todo + len(c.running), in_flight=len(c.running),
                                answered=c.answered, limited=c.limited, signal=c.signal,
                                retry_after_s=c.retry_after)  # fmt: skip
                state, share = settle(state, KEY, report, Caps(), now)
                c.pacer.update(share, now)
                c.answered = c.limited = 0
                c.retry_after, c.signal = None, None  # what was reported is not reported again
                c.next_settle = now + INTERVAL_S
            while c.todo and c.pacer.ready(now, len(c.running)):
                ok, c.signal = provider.ask(now)
                c.answered += 1
                c.pacer.sent(now)
                if ok:
                    c.todo -= 1
                    c.running.append(now + LATENCY_S)
                else:
                    c.limited += 1
                    c.retry_after = c.signal.retry_after_s
                    c.pacer.limited(now, c.signal.retry_after_s)
                    break
        now = round(now + STEP_S, 6)
    assert done == total
    share_429 = provider.limited / provider.answers
    used = total / (LIMIT_RPM / 60 * last)
    assert share_429 <= 0.05, (share_429, provider.limited, provider.answers)
    assert used >= 0.9, (used, last)
