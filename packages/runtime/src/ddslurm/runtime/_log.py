"""Structured JSON logs for the steps ddslurm owns (built explicitly, never configured globally)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import IO, Any

import msgspec
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

_ENC = msgspec.json.Encoder(enc_hook=repr)


def _render_json(_: WrappedLogger, __: str, event: EventDict) -> bytes:
    return _ENC.encode(event)


def base_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.dict_tracebacks,
    ]


class _Tee:
    """Write each line to several byte streams (the attempt's log file and the job's stderr)."""

    def __init__(self, *streams: IO[bytes]) -> None:
        self._streams = streams

    def write(self, data: bytes) -> int:
        for stream in self._streams:
            stream.write(data)
            stream.flush()
        return len(data)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


def new_logger(*streams: IO[bytes], level: int = logging.INFO, **bound: Any) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.wrap_logger(
        structlog.BytesLogger(_Tee(*streams)),  # type: ignore[arg-type]
        processors=[*base_processors(), _render_json],
        wrapper_class=structlog.make_filtering_bound_logger(level),
    )
    return logger.bind(**bound)


def logger_factory(run_id: str, component: str) -> Callable[[IO[bytes]], Any]:
    """What makes the logger of ``component`` in an attempt of run ``run_id``: to the attempt's log (the stream it
    is given) and to standard error."""

    def make(stream: IO[bytes]) -> Any:
        return new_logger(stream, sys.stderr.buffer, component=component, run_id=run_id)

    return make
