"""SGLang's ``/health``: a one-token generation, not a flag.

SGLang answers ``GET /health`` and ``GET /health_generate`` with the same handler (``health_generate`` in
``python/sglang/srt/entrypoints/http_server.py``, sgl-project/sglang, 2025-2026): 503 while the server starts or
shuts down; else it submits a one-token generation and polls once a second, up to ``SGLANG_HEALTH_CHECK_TIMEOUT``
seconds (20 by default), for *any* output of the detokenizer since the probe began (its own token, or another
request's): 200 as soon as there is some, 503 when there is none in time. With
``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false`` (default true) ``/health`` answers 200 at once; ``/health_generate``
always generates. So the probe costs at least a second, and a server whose generation work is held up answers it
late or 503, though it is alive and will answer ``/v1/models`` or ``/model_info`` at once (neither generates).

The stand-in queues the probe's own token behind the held chat requests at the gate (``Gate.wait_open``: a test
holds generation with ``fake_vllm.testing.set_gate(FILE, "hold")`` and /health fails, deterministically), and takes
any chat answer produced meanwhile as output. It answers as soon as there is output, not on SGLang's one-second
ticks (the tests measure outcomes, not times).
"""

from __future__ import annotations

import asyncio
import contextlib

from fake_vllm.log import log
from fake_vllm.state import ServerState


async def _own_token(state: ServerState) -> None:
    """The probe's own one-token generation: it waits behind the held requests, then produces output."""
    if state.gate is not None:
        await state.gate.wait_open()
    state.produced()


async def health_generate(state: ServerState, path: str) -> int:
    """The status SGLang's health handler answers ``GET path`` with (``/health`` or ``/health_generate``)."""
    settings = state.settings
    if not state.ready:
        return 503
    if path == "/health" and not settings.health_generates:
        return 200
    output = state.output
    own = asyncio.create_task(_own_token(state))
    try:
        await asyncio.wait_for(output.wait(), settings.health_check_timeout)
    except TimeoutError:
        log(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"{settings.health_check_timeout:g} seconds.",
            level="ERROR",
        )
        return 503
    finally:
        own.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await own
    return 200
