"""The rate-limit headers of the real providers, as their API references give them, read into one signal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from ddslurm.runtime._rate_headers import RateSignal, parse_duration, rate_signal

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("12", 12.0), ("0.5", 0.5), ("2m", 120.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "-3", "1s garbage", "nan", "inf"])
def test_what_is_no_duration(text: str) -> None:
    assert parse_duration(text) is None


def test_openai_headers() -> None:
    headers = {
        "X-RateLimit-Limit-Requests": "120",
        "x-ratelimit-remaining-requests": "117",
        "x-ratelimit-reset-requests": "1.5s",
        "x-ratelimit-limit-tokens": "40000",
        "x-ratelimit-remaining-tokens": "39000",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert rate_signal(headers, NOW) == RateSignal(
        requests_limit=120, requests_remaining=117, requests_reset_s=1.5,
        tokens_limit=40000, tokens_remaining=39000, tokens_reset_s=360.0,
    )  # fmt: skip


def test_anthropic_headers_with_split_token_limits_take_the_tighter() -> None:
    reset = (NOW + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "30000",
        "anthropic-ratelimit-input-tokens-remaining": "100",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "7000",
        "anthropic-ratelimit-output-tokens-reset": reset,
        "retry-after": "30",
    }
    signal = rate_signal(headers, NOW)
    assert (signal.requests_limit, signal.requests_remaining, signal.requests_reset_s) == (50, 0, 30.0)
    assert (signal.tokens_limit, signal.tokens_remaining, signal.tokens_reset_s) == (8000, 7000, 30.0)
    assert signal.retry_after_s == 30.0


def test_retry_after_as_an_http_date_or_in_milliseconds() -> None:
    later = format_datetime(NOW + timedelta(seconds=7), usegmt=True)
    assert rate_signal({"Retry-After": later}, NOW).retry_after_s == 7.0
    assert rate_signal({"retry-after-ms": "250", "retry-after": "1"}, NOW).retry_after_s == 0.25
    past = format_datetime(NOW - timedelta(seconds=7), usegmt=True)
    assert rate_signal({"Retry-After": past}, NOW).retry_after_s == 0.0


def test_no_headers_or_broken_ones_say_nothing() -> None:
    assert rate_signal({}, NOW).empty
    broken = {"x-ratelimit-limit-requests": "many", "x-ratelimit-reset-requests": "later", "retry-after": "?"}
    assert rate_signal(broken, NOW).empty
    assert rate_signal({"x-ratelimit-remaining-requests": "-1"}, NOW).empty


@pytest.mark.parametrize("style", ["openai", "anthropic"])
def test_what_the_stand_in_says_of_its_limited_key_reads_as_the_providers_do(style: str) -> None:
    """The stand-in's rate-limited key (``--fake-rate-limit-rpm``) answers in each provider's header style; read
    back here, its answers say the limit, what is left and, on its 429, how long to wait."""
    import httpx

    from fake_vllm.testing import start_server

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    args = ["--served-model-name", "m", "--fake-rate-limit-rpm", "3", "--fake-rate-headers", style]
    with start_server("m", args=args) as server:
        answers = [httpx.post(f"{server.base_url}/chat/completions", json=chat) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    now = datetime.now(UTC)
    first, limited = rate_signal(answers[0].headers, now), rate_signal(answers[3].headers, now)
    assert (first.requests_limit, first.requests_remaining) == (3, 2)
    assert (limited.requests_limit, limited.requests_remaining) == (3, 0)
    assert limited.retry_after_s is not None and limited.retry_after_s >= 1
    assert limited.requests_reset_s is not None and 0 < limited.requests_reset_s <= 60
