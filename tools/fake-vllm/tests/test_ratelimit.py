"""The stand-in's rate-limited key on a fake clock: its buckets, its concurrency and the headers of each style."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fake_vllm.ratelimit import RateLimiter

WALL = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_minute_of_requests_then_one_every_half_second_at_120_a_minute() -> None:
    clock = Clock()
    key = RateLimiter(requests_per_minute=120, tokens_per_minute=None, in_flight=None, clock=clock)
    answers = [key.admit(10) for _ in range(121)]
    assert [a.admitted for a in answers] == [True] * 120 + [False]
    refused = answers[-1]
    assert (refused.reason, refused.headers["retry-after"], refused.headers["x-ratelimit-remaining-requests"]) == (
        "requests", "1", "0"
    )  # fmt: skip
    assert refused.headers["x-ratelimit-limit-requests"] == "120"
    clock.now = 0.5  # one request's worth refilled
    assert key.admit(10).admitted and not key.admit(10).admitted
    assert (key.admitted, key.refused) == (121, 2)


def test_tokens_a_minute_and_requests_at_once() -> None:
    clock = Clock()
    key = RateLimiter(requests_per_minute=None, tokens_per_minute=1000, in_flight=2, clock=clock)
    first, second = key.admit(300), key.admit(300)
    assert first.admitted and second.admitted
    third = key.admit(300)
    assert (third.admitted, third.reason) == (False, "concurrency")
    key.done()
    fourth = key.admit(500)  # 400 tokens left: 100 more refill in 6 s
    assert (fourth.admitted, fourth.reason, fourth.headers["retry-after"]) == (False, "tokens", "6")
    assert fourth.headers["x-ratelimit-remaining-tokens"] == "400"
    assert fourth.headers["x-ratelimit-reset-tokens"] == "36s"  # 600 of 1000 used: 36 s to a full bucket
    clock.now = 6.0
    assert key.admit(500).admitted


@pytest.mark.parametrize("style", ["anthropic", "none"])
def test_the_other_header_styles(style: str) -> None:
    clock = Clock()
    key = RateLimiter(requests_per_minute=60, tokens_per_minute=None, in_flight=None, style=style,  # type: ignore[arg-type]
                      clock=clock, wall=lambda: WALL)  # fmt: skip
    admitted = key.admit(1)
    if style == "none":  # nothing but the status, even on a 429
        rest = [key.admit(1) for _ in range(60)]
        assert admitted.headers == {} and not rest[-1].admitted and rest[-1].headers == {}
        return
    assert admitted.headers == {
        "anthropic-ratelimit-requests-limit": "60",
        "anthropic-ratelimit-requests-remaining": "59",
        "anthropic-ratelimit-requests-reset": "2026-12-04T12:00:01Z",
    }
