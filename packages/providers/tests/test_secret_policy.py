"""Credentials that must never reach the snapshot: literal keys that look like names, credentials in endpoint
URLs, credential-like header values and names, credential keys inside ``extra_body``; and key values that are
placeholders rather than secrets. Which values look like a key is config's one secret policy
(``ddslurm.config.credential_shape``, tested there); a provider's fields refuse exactly what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from ddslurm.config import credential_shape
from ddslurm.config.testing import ID_LIKE_CREDENTIALS, LITERAL_CREDENTIALS, NOT_CREDENTIALS
from ddslurm.providers import (
    PROVIDERS_FILE,
    ResolutionError,
    body_credentials,
    is_credential_header,
    is_placeholder_secret,
    load_settings,
    placeholder_secrets,
    redact_url,
    resolve,
    url_credentials,
)
from ddslurm.providers import Origin as _Origin

PLANTED = "LIVEKEY7F3A9C0D1E2B55"
SK = "sk-proj-7f3a9c0d1e2b55aa41c0ffee"


def _resolve_problems(tmp_path: Path, provider_yaml: str, env: dict[str, str] | None = None) -> list[str]:
    home = tmp_path / "dd"
    home.mkdir()
    (home / PROVIDERS_FILE).write_text("providers:\n" + provider_yaml, encoding="utf-8")
    recipe = {
        "columns": [{"column_type": "llm-text", "name": "q", "model_alias": "gen", "prompt": "p"}],
        "model_configs": [{"alias": "gen", "model": "m", "provider": "hosted"}],
    }
    with pytest.raises(ResolutionError) as info:
        resolve(recipe, _Origin(tmp_path / "recipe.yaml"), load_settings(home), (), env or {"K": "v" * 20})
    return info.value.problems


# --- header names ---


@pytest.mark.parametrize(
    "name",
    ["X-API-KEYS", "Api-Keys", "X-JWT-Assertion", "X-Bearer", "X-Api-Pass", "X-Session-Id", "X-Signature", "Pwd"],
)
def test_more_credential_header_names(name: str) -> None:
    assert is_credential_header(name)


@pytest.mark.parametrize("name", ["X-Title", "HTTP-Referer", "X-Compass", "X-Passenger-Count", "OpenAI-Beta"])
def test_innocent_header_names(name: str) -> None:
    assert not is_credential_header(name)


# --- endpoint URLs ---


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        pytest.param(f"http://u:{SK}@host/v1", "user-info", id="user-and-password"),
        pytest.param(f"http://{SK}@host/v1", "user-info", id="user-only"),
        pytest.param(f"https://host/v1?api_key={SK}", "query parameter 'api_key'", id="api-key-query"),
        pytest.param("https://host/v1?key=abcdef", "query parameter 'key'", id="key-query"),
        pytest.param("https://host/v1?sig=abc&x=1", "query parameter 'sig'", id="signature-query"),
        pytest.param(f"https://host/v1?innocent={SK}", "query parameter 'innocent'", id="credential-value"),
        pytest.param(f"https://host/{SK}/v1", "path", id="key-in-path"),
    ],
)
def test_credentials_in_urls(url: str, needle: str) -> None:
    reason = url_credentials(url)
    assert reason is not None and needle in reason
    assert SK not in reason and "abcdef" not in reason
    assert SK not in redact_url(url)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:18400/v1", "https://integrate.api.nvidia.com/v1", "https://h/v1?api-version=2024-06-01"]
)
def test_clean_urls(url: str) -> None:
    assert url_credentials(url) is None
    assert redact_url(url) == url


# --- extra_body ---


def test_credential_keys_inside_extra_body_nested_and_in_lists() -> None:
    body: dict[str, Any] = {
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 10,
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "skip_special_tokens": True,
        "stop_token_ids": [1, 2],
        "api_key": SK,
        "upstream": {"auth": {"access_token": "t"}},
        "tools": [{"password": "p"}, {"name": "ok"}],
        "X-Api-Key": "k",
        "note": f"Bearer {SK}",
    }
    assert body_credentials(body, "extra_body") == [
        "extra_body.api_key",
        "extra_body.upstream.auth",
        "extra_body.tools[0].password",
        "extra_body['X-Api-Key']",
        "extra_body.note",
    ]


def test_innocent_extra_body() -> None:
    body = {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20, "guided_choice": ["a", "b"]}
    assert body_credentials(body, "extra_body") == []


# --- resolution: each case refused, provider and field named, value never echoed ---


@pytest.mark.parametrize(
    ("provider_yaml", "field", "words"),
    [
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://u:{SK}@host/v1'}}\n",
            "providers[0].endpoint",
            "user-info",
            id="userinfo",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://host/v1?api_key={SK}'}}\n",
            "providers[0].endpoint",
            "query parameter 'api_key'",
            id="query",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', extra_headers: {{X-Upstream: 'Bearer {SK}'}}}}\n",
            "providers[0].extra_headers['X-Upstream']",
            "value looks like a credential",
            id="header-value",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', extra_body: {{upstream: {{api_key: {SK}}}}}}}\n",
            "providers[0].extra_body.upstream.api_key",
            "carries a credential",
            id="extra-body-nested",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', extra_headers: {{X-API-KEYS: {SK}}}}}\n",
            "providers[0].extra_headers['X-API-KEYS']",
            "carries a credential",
            id="header-name-keys",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', extra_headers: {{Api-Keys: {SK}}}}}\n",
            "providers[0].extra_headers['Api-Keys']",
            "carries a credential",
            id="header-name-api-keys",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', extra_headers: {{X-JWT-Assertion: {SK}}}}}\n",
            "providers[0].extra_headers['X-JWT-Assertion']",
            "carries a credential",
            id="header-name-jwt",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', extra_headers: {{X-Bearer: {SK}}}}}\n",
            "providers[0].extra_headers['X-Bearer']",
            "carries a credential",
            id="header-name-bearer",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', extra_headers: {{X-Api-Pass: {SK}}}}}\n",
            "providers[0].extra_headers['X-Api-Pass']",
            "carries a credential",
            id="header-name-pass",
        ),
        pytest.param(
            f"- {{name: hosted, endpoint: 'http://h/v1', api_key: {PLANTED}}}\n",
            "providers[0].api_key",
            "looks like a literal key",
            id="all-caps-literal-key",
        ),
    ],
)
def test_each_credential_is_refused_with_provider_and_field_and_never_echoed(
    tmp_path: Path, provider_yaml: str, field: str, words: str
) -> None:
    problems = _resolve_problems(tmp_path, provider_yaml)

    assert len(problems) == 1, problems
    assert f"{tmp_path / 'dd' / PROVIDERS_FILE}:2:" in problems[0]
    assert f": {field}: provider 'hosted'" in problems[0]
    assert words in problems[0]
    assert SK not in problems[0] and PLANTED not in problems[0]


def test_model_extra_body_credentials_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "dd"
    home.mkdir()
    (home / PROVIDERS_FILE).write_text("providers:\n- {name: hosted, endpoint: 'http://h/v1'}\n", encoding="utf-8")
    recipe = {
        "columns": [{"column_type": "llm-text", "name": "q", "model_alias": "gen", "prompt": "p"}],
        "model_configs": [
            {
                "alias": "gen",
                "model": "m",
                "provider": "hosted",
                "inference_parameters": {"extra_body": {"auth_token": SK}},
            }
        ],
    }
    with pytest.raises(ResolutionError) as info:
        resolve(recipe, _Origin(tmp_path / "recipe.yaml"), load_settings(home), (), {})
    (problem,) = info.value.problems
    assert "model_configs[0].inference_parameters.extra_body.auth_token: model alias 'gen'" in problem
    assert SK not in problem


# --- placeholders: key values that are not secrets to scan for ---


@pytest.mark.parametrize(
    "value", ["none", "None", "EMPTY", "dummy", "x", "1234567", "sk-no-key-required", "not-needed", "ollama"]
)
def test_placeholder_values(value: str) -> None:
    assert is_placeholder_secret(value)


@pytest.mark.parametrize("value", [SK, "abcdefgh", "nvapi-Abc123Def456", "s3cr3t-VALUE-0123"])
def test_real_values(value: str) -> None:
    assert not is_placeholder_secret(value)


def test_placeholder_secrets_names_only_the_placeholders() -> None:
    env = {"LOCAL_KEY": "EMPTY", "REAL_KEY": SK, "NONE_KEY": "none"}
    assert placeholder_secrets(("LOCAL_KEY", "NONE_KEY", "REAL_KEY", "UNSET_KEY"), env) == ("LOCAL_KEY", "NONE_KEY")


# --- place: a model provider's fields agree with the one secret policy (issue 39) ---


def _provider_problems(tmp_path: Path, provider: dict[str, Any]) -> list[str]:
    home = tmp_path / "dd"
    home.mkdir(parents=True)
    (home / PROVIDERS_FILE).write_text(json.dumps({"providers": [provider]}), encoding="utf-8")
    recipe = {
        "columns": [{"column_type": "llm-text", "name": "q", "model_alias": "gen", "prompt": "p"}],
        "model_configs": [{"alias": "gen", "model": "m", "provider": "hosted"}],
    }
    try:
        resolve(recipe, _Origin(tmp_path / "recipe.yaml"), load_settings(home), (), {"K": "v" * 20})
    except ResolutionError as error:
        return error.problems
    return []


def _judged_fields(value: str) -> dict[str, dict[str, Any]]:
    """Each field of a provider whose value is judged by its shape, by the field a problem names, holding ``value``."""
    base = {"name": "hosted", "endpoint": "http://h/v1", "api_key": "K"}
    return {
        "extra_headers['X-Upstream']": {**base, "extra_headers": {"X-Upstream": value}},
        "extra_body.note": {**base, "extra_body": {"note": value}},
        "endpoint": {**base, "endpoint": f"http://h/v1?q={quote(value, safe='')}"},
    }


@pytest.mark.parametrize(
    "value", [pytest.param(v, id=k) for k, v in (*LITERAL_CREDENTIALS.items(), *ID_LIKE_CREDENTIALS.items())]
)
def test_a_provider_refuses_what_the_policy_refuses(tmp_path: Path, value: str) -> None:
    """A ``glpat-`` key (config refused it in ``server.env``, no provider field did), a ``ghu_`` token, a JWT's
    header, credentials in a URL, a generated key: refused as a provider's ``api_key`` and in its headers, its
    ``extra_body`` and its endpoint's query, the value never shown."""
    assert credential_shape(value) is not None
    fields = {"api_key": {"name": "hosted", "endpoint": "http://h/v1", "api_key": value}, **_judged_fields(value)}
    for field, provider in fields.items():
        problems = _provider_problems(tmp_path / field, provider)
        assert len(problems) == 1, (field, problems)
        assert f": providers[0].{field}: provider 'hosted': " in problems[0]
        assert value not in problems[0] and quote(value, safe="") not in problems[0]


@pytest.mark.parametrize("value", [pytest.param(v, id=k) for k, v in NOT_CREDENTIALS.items()])
def test_a_provider_keeps_what_the_policy_keeps(tmp_path: Path, value: str) -> None:
    """A path holding ``hf_`` (a place, not a key), a model's name, a UUID: kept in headers, body and query."""
    assert credential_shape(value) is None
    for field, provider in _judged_fields(value).items():
        assert _provider_problems(tmp_path / field, provider) == [], field
