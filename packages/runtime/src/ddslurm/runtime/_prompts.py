"""The requests a ``ddslurm tune`` allocation's proxy records for its calibration sweep to replay.

Only the body of a chat completion request is kept (the recipe's prompts and inference parameters: data, no
secret), one compact JSON object a line in ``prompts-<alias>.jsonl`` (:func:`~ddslurm.config.prompts_file`, an
owner-only file), at most :data:`~ddslurm.config.PROMPTS_KEPT` of them. No header is ever written: the token
travels in ``Authorization``, never in a body.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from ddslurm.config import PROMPTS_KEPT, open_append

RECORDED_PATH = "/v1/chat/completions"


class PromptRecorder:
    """Appends the bodies of the first ``limit`` chat completion requests to ``path`` (opened on the first)."""

    def __init__(self, path: Path, limit: int = PROMPTS_KEPT) -> None:
        self._path = path
        self._limit = limit
        self._stream: IO[bytes] | None = None
        self.recorded = len(read_prompts(path))
        """Bodies in the file, those of an earlier start of this proxy (a restart) included."""

    def record(self, path: str, body: bytes) -> None:
        """Record ``body`` if ``path`` is a chat completion's, it is a JSON object and the limit is not reached."""
        if self.recorded >= self._limit or path.rstrip("/") != RECORDED_PATH:
            return
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return
        if not isinstance(doc, dict):
            return
        if self._stream is None:
            self._stream = open_append(self._path)
        self._stream.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")
        self._stream.flush()
        self.recorded += 1

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def read_prompts(path: Path) -> list[bytes]:
    """The request bodies recorded at ``path`` (each a JSON object, as it was forwarded); [] when there is none."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    return [line for line in lines if line.strip()]
