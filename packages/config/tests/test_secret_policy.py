"""Issue 39: one secret policy. ``credential_shape`` and ``is_env_var_name`` decide, for every place ddslurm judges a
value by its shape, whether it is a literal credential or a variable's name; the run file's ``server.env`` and
``server.extra_args`` refuse exactly what the policy refuses. Rows marked "was: ..." are cases the old places
disagreed on (config's prefix list had ``glpat-`` and ``ghu_`` but not ``ASIA``; providers' had ``ASIA`` and found a
prefix inside a value, config only at its start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddslurm.config import KEY_PREFIXES, ConfigFileError, credential_shape, is_env_var_name, load_run_file
from ddslurm.config.testing import ID_LIKE_CREDENTIALS, LITERAL_CREDENTIALS, NOT_CREDENTIALS

pytestmark = pytest.mark.smoke  # make test-isolated runs these with only the package's dependencies

STARTS = "starts like an API key or token"
HOLDS = "holds something that starts like an API key or token"
AUTH = "scheme and a credential"
URL = "URL with credentials"
GENERATED = "looks like a generated key"
SK = "sk-proj-7f3a9c0d1e2b55aa41c0ffee"
GLPAT = "glpat-Zq3Vb8Kd9Lm2Np4Rt6Wx"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"


# --- the policy: (value, why, why where ids are ordinary) -------------------------------------------------------

POLICY = [
    pytest.param(SK, STARTS, STARTS, id="sk"),
    pytest.param("nvapi-Abc123Def456", STARTS, STARTS, id="nvapi"),
    pytest.param("hf_x", STARTS, STARTS, id="hf-anything-after"),
    pytest.param(GLPAT, STARTS, STARTS, id="glpat-was-config-only"),
    pytest.param("ghu_0123456789abcdef", STARTS, STARTS, id="ghu-was-config-only"),
    pytest.param("ASIAIOSFODNN7EXAMPLE", STARTS, STARTS, id="asia-was-providers-only"),
    pytest.param("AKIAIOSFODNN7EXAMPLE", STARTS, STARTS, id="akia"),
    pytest.param("eyJhbGciOiJIUzI1NiJ9", STARTS, STARTS, id="jwt-header-alone-was-config-only"),
    pytest.param(JWT, STARTS, STARTS, id="jwt"),
    pytest.param(f"Bearer {SK}", AUTH, AUTH, id="bearer"),
    pytest.param("bearer abc", AUTH, AUTH, id="lower-case-scheme-was-providers-only"),
    pytest.param("Basic dXNlcjpwYXNzd29yZA==", AUTH, AUTH, id="basic"),
    pytest.param("Token abc", AUTH, AUTH, id="token-scheme-was-providers-only"),
    pytest.param("https://user:s3cr3t-pass@hub.example/v1", URL, URL, id="url-userinfo-was-config-only"),
    pytest.param("upstream=sk-abc123def456", HOLDS, HOLDS, id="prefix-inside-was-providers-only"),
    pytest.param(f"X-Key:{GLPAT}", HOLDS, HOLDS, id="glpat-inside-was-neither"),
    pytest.param("id=AKIAIOSFODNN7EXAMPLE", HOLDS, HOLDS, id="aws-inside"),
    pytest.param(f"abc{JWT}", HOLDS, HOLDS, id="jwt-inside-was-providers-only"),
    pytest.param("Zq3Vb8Kd9Lm2Np4Rt6Wx1Yz5", GENERATED, GENERATED, id="generated-24-was-config-only"),
    pytest.param("Zk9xR2tLc3VwZXJzZWNyZXRrZXkxMjM0NTY3ODkw", GENERATED, GENERATED, id="generated-long"),
    pytest.param("a8f5f167f44f4964e6c998dee827110c0a8f5f16", GENERATED, None, id="hex-run-was-providers-only"),
    pytest.param("k9x2tlc3vwzxjzzwnyzxrrzxkxmjm0ntyz+q", GENERATED, None, id="letters-digits-run-was-providers-only"),
    pytest.param("LIVEKEY7F3A9C0D1E2B55", GENERATED, None, id="all-capitals-was-providers-only"),
    # kept everywhere
    pytest.param("ddslurm", None, None, id="word"),
    pytest.param("", None, None, id="empty"),
    pytest.param("application/json", None, None, id="media-type"),
    pytest.param("https://example.org/my-app", None, None, id="url"),
    pytest.param("2024-06-01", None, None, id="date"),
    pytest.param("assistants=v2", None, None, id="setting"),
    pytest.param("550e8400-e29b-41d4-a716-446655440000", None, None, id="uuid"),
    pytest.param("NeMo Data Designer", None, None, id="prose"),
    pytest.param("Llama-3-70B-Instruct", None, None, id="model-name"),
    pytest.param("meta-llama/Llama-3.1-8B-Instruct", None, None, id="model"),
    pytest.param("NVIDIA_API_KEY", None, None, id="variable-name"),
    pytest.param("EAST_ASIA_API_KEY", None, None, id="prefix-as-a-word"),
    pytest.param("skip_special_tokens", None, None, id="setting-name"),
    pytest.param("/scratch/hf_cache", None, None, id="path-holding-a-prefix-was-refused-by-providers"),
    pytest.param("/data/a8f5f167f44f4964e6c998dee827110c0a8f5f16/x", None, None, id="path-holding-a-hex-run"),
]


@pytest.mark.parametrize(("value", "why", "why_ids_ordinary"), POLICY)
def test_the_secret_policy(value: str, why: str | None, why_ids_ordinary: str | None) -> None:
    found = credential_shape(value)
    assert (found is None) is (why is None), found
    assert why is None or why in (found or "")
    found_ids_ordinary = credential_shape(value, ids_ordinary=True)
    assert (found_ids_ordinary is None) is (why_ids_ordinary is None), found_ids_ordinary
    assert why_ids_ordinary is None or why_ids_ordinary in (found_ids_ordinary or "")
    for reason in (found, found_ids_ordinary):
        assert not value or value not in (reason or "")


def test_the_examples_are_what_the_policy_says() -> None:
    """The shared examples every place's agreement test uses are, by the policy itself, what their names say."""
    assert {f"prefix {p}" for p in KEY_PREFIXES} <= set(LITERAL_CREDENTIALS)
    for value in LITERAL_CREDENTIALS.values():
        assert credential_shape(value, ids_ordinary=True) is not None, value
    for value in ID_LIKE_CREDENTIALS.values():
        assert credential_shape(value) is not None, value
        assert credential_shape(value, ids_ordinary=True) is None, value
    for value in NOT_CREDENTIALS.values():
        assert credential_shape(value) is None, value


@pytest.mark.parametrize(
    "value",
    [
        "NVIDIA_API_KEY",
        "OPENAI_API_KEY",
        "DEMO_HOSTED_API_KEY",
        "GPT4_API_KEY",
        "K8S_TOKEN",
        "H2O_KEY",
        "AWS_2024_KEY",
        "KEY2",
        "X",
        "_PRIVATE",
        "MY_V2_KEY_3",
        "EAST_ASIA_API_KEY",
    ],
)
def test_variable_names(value: str) -> None:
    assert is_env_var_name(value)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("LIVEKEY7F3A9C0D1E2B55", id="hex-run"),
        pytest.param("A1B2C3D4E5F6", id="alternating-letters-and-digits"),
        pytest.param("KEY123456789", id="long-digit-run"),
        pytest.param("DEADBEEF0123CAFE", id="hex-run-8"),
        pytest.param("QWERTYUIOPASDFGHJKLZXCVBNMQWERTYUIOP", id="very-long-word"),
        pytest.param("X9Y8Z7", id="digit-heavy"),
        pytest.param("2FAST", id="starts-with-digit"),
        pytest.param("AKIAIOSFODNN7EXAMPLE", id="aws-access-key"),
        pytest.param("ASIAIOSFODNN7EXAMPLE", id="aws-temporary-access-key"),
        pytest.param("SK-ABC", id="hyphen"),
        pytest.param("MY KEY", id="space"),
        pytest.param("my_key", id="lower-case"),
        pytest.param("Nvidia_Api_Key", id="mixed-case"),
        pytest.param("${MCP_API_KEY}", id="shell-interpolation"),
        pytest.param("", id="empty"),
        *(pytest.param(v, id=k) for k, v in LITERAL_CREDENTIALS.items()),
    ],
)
def test_literal_keys_are_not_variable_names(value: str) -> None:
    assert not is_env_var_name(value)


# --- place: the run file (server.env and server.extra_args) -----------------------------------------------------

DEPLOYMENT = "name: demo\nrecipe: recipe.yaml\nnum_records: 10\ndeployments:\n  - model_alias: a\n    model: m\n"


def _server(tmp_path: Path, entry: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(DEPLOYMENT + "    server:\n      " + entry + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("value", [pytest.param(v, id=k) for k, v in LITERAL_CREDENTIALS.items()])
def test_the_run_file_refuses_what_the_policy_refuses(tmp_path: Path, value: str) -> None:
    """Each credential of the policy's examples (a ``glpat-`` key, an ``ASIA`` key id, a key after a separator, ...)
    is refused in ``server.env`` and in ``server.extra_args``, with the policy's reason, the value not shown."""
    why = credential_shape(value)
    assert why is not None
    with pytest.raises(ConfigFileError) as info:
        load_run_file(_server(tmp_path, f"env: {{SETTING: {json.dumps(value)}}}"))
    assert f"env.SETTING: looks like a secret ({why})" in info.value.message
    assert value not in str(info.value)
    with pytest.raises(ConfigFileError) as info:
        load_run_file(_server(tmp_path, f"extra_args: [{json.dumps(value)}]"))
    assert info.value.field == "deployments[0].server.extra_args[0]"
    assert "looks like a secret (the value " in info.value.message  # the policy's reason for the value given
    assert value not in str(info.value)


@pytest.mark.parametrize(
    "value", [pytest.param(v, id=k) for k, v in (*ID_LIKE_CREDENTIALS.items(), *NOT_CREDENTIALS.items())]
)
def test_the_run_file_keeps_what_the_policy_keeps_where_ids_are_ordinary(tmp_path: Path, value: str) -> None:
    """A git revision, a path holding ``hf_``, a model's name: ``server.env`` and ``server.extra_args`` keep them."""
    assert credential_shape(value, ids_ordinary=True) is None
    run = load_run_file(_server(tmp_path, f"env: {{SETTING: {json.dumps(value)}}}"))
    assert run.deployments[0].server.env == {"SETTING": value}
    run = load_run_file(_server(tmp_path, f"extra_args: [--setting, {json.dumps(value)}]"))
    assert run.deployments[0].server.extra_args == ("--setting", value)
