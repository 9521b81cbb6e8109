"""A hosted endpoint that refuses the API key (HTTP 401 or 403) is ``key_refused``, never rerun or retried: the
classification reads Data Designer's own error types and the provider error's status code, as Data Designer
raises them (``handle_llm_exceptions`` turns the client's ``ProviderError`` into its model errors), not a message."""

from __future__ import annotations

import pytest

from ddslurm.config import ProviderSnapshot, SnapshotProvider
from ddslurm.runtime._engine import key_refused
from ddslurm.runtime.errors import PERMANENT_REASONS, KeyRefusedError

pytestmark = pytest.mark.dd

SNAPSHOT = ProviderSnapshot(
    providers=(
        SnapshotProvider(name="nv", endpoint="https://nv.example/v1", provider_type="openai", api_key_env="NV_KEY"),
        SnapshotProvider(name="oa", endpoint="https://oa.example/v1", provider_type="openai", api_key_env="OA_KEY"),
        SnapshotProvider(
            name="ddslurm-local-gen", endpoint="", provider_type="openai", api_key_env="TOKEN", local=True
        ),
    )
)


def _as_create_raises(kind: str, status: int | None, provider: str | None) -> BaseException:
    """What ``DataDesigner.create`` raises when a model call failed with this provider error."""
    from data_designer.engine.models.clients.errors import ProviderError, ProviderErrorKind
    from data_designer.engine.models.errors import handle_llm_exceptions
    from data_designer.interface.errors import DataDesignerGenerationError

    error = ProviderError(ProviderErrorKind(kind), "Unauthorized", status_code=status, provider_name=provider)
    try:
        try:
            try:
                raise error
            except ProviderError as caught:  # as catch_llm_exceptions calls it: the provider error is the context
                handle_llm_exceptions(caught, "demo/writer-8b", provider or "unknown", purpose="running health checks")
        except Exception as model_error:
            raise DataDesignerGenerationError(f"🛑 Error generating dataset: {model_error}") from model_error
    except DataDesignerGenerationError as wrapped:
        return wrapped
    raise AssertionError("handle_llm_exceptions raised nothing")


@pytest.mark.parametrize(("kind", "status"), [("authentication", 401), ("permission_denied", 403)])
def test_a_refused_key_names_the_provider_its_variable_and_the_status(kind: str, status: int) -> None:
    refusal = key_refused(_as_create_raises(kind, status, "oa"), SNAPSHOT)
    assert isinstance(refusal, KeyRefusedError)
    assert (refusal.reason, refusal.retryable) == ("key_refused", False)
    assert refusal.message.startswith(f"the endpoint of provider 'oa' refused the API key in OA_KEY (HTTP {status})")
    assert "NV_KEY" not in refusal.message and "ddslurm retry RUN" in refusal.message
    assert "key_refused" in PERMANENT_REASONS  # automatic retry arrays record not_retried after it


def test_without_a_provider_name_every_hosted_providers_variable_is_named() -> None:
    refusal = key_refused(_as_create_raises("authentication", None, None), SNAPSHOT)
    assert refusal is not None
    assert refusal.message.startswith(
        "the endpoint of provider 'nv', 'oa' refused the API key in NV_KEY, OA_KEY (HTTP 401)"
    )


@pytest.mark.parametrize(
    ("kind", "status", "provider"),
    [
        ("internal_server", 500, "nv"),  # a server error: generation_failed, rerun as before
        ("rate_limit", 429, "nv"),
        ("authentication", 401, "ddslurm-local-gen"),  # a local server refusing the attempt's own token
        ("authentication", 401, "not-in-the-snapshot"),
    ],
)
def test_other_errors_and_local_servers_are_not_a_refused_key(kind: str, status: int, provider: str) -> None:
    assert key_refused(_as_create_raises(kind, status, provider), SNAPSHOT) is None


def test_a_plain_error_is_not_a_refused_key() -> None:
    assert key_refused(RuntimeError("HTTP 401 Unauthorized"), SNAPSHOT) is None  # words alone are not evidence
