"""vLLM-looking log lines on stderr (``INFO 05-06 12:34:56 [fake_vllm] message``)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime


def log(message: str, level: str = "INFO") -> None:
    stamp = datetime.now(UTC).astimezone().strftime("%m-%d %H:%M:%S")
    sys.stderr.write(f"{level} {stamp} [fake_vllm] {message}\n")
    sys.stderr.flush()
