"""A step's output reaches its log through the runtime with the token taken out (``ddslurm.runtime._redact``):
wherever the token falls in the pieces the pipe delivers, no byte run of it reaches the file, the rest does, and a
step's exit is seen only once its last lines are in the log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddslurm.runtime._redact import REDACTED, Redactor
from ddslurm.runtime._steps import LocalLauncher, StepSpec

TOKEN = "tok-Zq8vN3xR0pL5mK2jH7gF4dS1aW9eY6uT"
LINE = f"INFO server_args=ServerArgs(model_path='m', api_key='{TOKEN}', tp_size=1)\nnext line\n".encode()
WANT = LINE.replace(TOKEN.encode(), REDACTED)


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(TOKEN) - 1, len(TOKEN), len(TOKEN) + 1, len(LINE)])
def test_every_split_of_the_stream_redacts_the_token(size: int) -> None:
    for offset in range(size):  # every position of the cuts relative to the token
        redactor = Redactor([TOKEN])
        pieces = [LINE[:offset], *(LINE[i : i + size] for i in range(offset, len(LINE), size))]
        out = b"".join(redactor.feed(piece) for piece in pieces) + redactor.flush()
        assert out == WANT, (size, offset)


def test_only_a_tail_that_may_start_the_token_is_held_back() -> None:
    redactor = Redactor([TOKEN, ""])
    assert redactor.feed(b"a whole line\n") == b"a whole line\n"
    assert redactor.feed(b"key='tok-Zq") == b"key='"  # the start of the token: held
    assert redactor.feed(b"8 is not it'\n") == b"tok-Zq8 is not it'\n"
    assert redactor.feed(b"tok") == b"" and redactor.flush() == b"tok"


def test_a_step_with_secrets_writes_its_log_through_the_runtime(tmp_path: Path) -> None:
    """The step prints the token in pieces, flushed apart (a split across reads), then dies: its exit is seen with
    its last line in the log, the token nowhere in it."""
    script = (
        "import os, sys\n"
        "t = os.environ['T']\n"
        "for part in ('api_key=' + t[:5], t[5:20], t[20:] + '\\n', 'stderr too: ' + t + '\\n'):\n"
        "    (sys.stderr if 'stderr' in part else sys.stdout).write(part); sys.stdout.flush(); sys.stderr.flush()\n"
        "print('last line', flush=True)\n"
        "sys.exit(3)\n"
    )
    log = tmp_path / "server.log"
    spec = StepSpec(name="server-a-0", argv=(sys.executable, "-c", script), env={"T": TOKEN}, log=log, redact=(TOKEN,))
    step = LocalLauncher().start(spec)
    assert step.proc.wait(timeout=60) == 3
    text = log.read_bytes()
    assert text.endswith(b"last line\n"), text
    assert TOKEN.encode() not in text and text.count(REDACTED) == 2, text
    assert "redact" not in repr(spec)


def test_a_step_without_secrets_writes_its_own_log(tmp_path: Path) -> None:
    log = tmp_path / "client.out"
    spec = StepSpec(name="client", argv=(sys.executable, "-c", "print('hello')"), env={}, log=log)
    step = LocalLauncher().start(spec)
    assert step.proc.wait(timeout=60) == 0 and log.read_text() == "hello\n"
    assert type(step.proc) is subprocess.Popen
