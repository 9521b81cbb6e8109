"""vLLM started with the token in its arguments, not in its environment, so that no process of vLLM's (its engine
core, its workers, what they write) ever sees ``VLLM_API_KEY``.

Why: vLLM names its ``torch.compile`` cache (``<VLLM_CACHE_ROOT>/torch_compile_cache/<hash>/``, and the
ahead-of-time one beside it) from a hash of ``vllm.envs.compile_factors()``: every vLLM variable but an ignored
list, which before vllm-project/vllm#52523 did not hold ``VLLM_API_KEY``. With the key in the environment, as
``--api-key``'s variable, the key is one of the factors: written in clear to the directory's
``cache_key_factors.json``, and, ddslurm's token being new in every allocation, a new directory every time, so the
compiled graphs are never reused. The factors are computed in the engine's worker processes, which inherit the
API server's environment when they are started, before the API server reads its key; so the key must be gone
from the environment before vLLM starts at all, and given as ``--api-key`` instead, which vLLM's API server reads
and never passes to its engine. A command line is no place for it (``ps`` shows it to every user of the node), so
:data:`VLLM_BOOT` puts it into ``sys.argv`` inside the Python process that then runs vLLM's own ``vllm`` script
(as SGLang's boot program does, :data:`~ddslurm.runtime._server_command.SGLANG_BOOT`). vLLM logs its non-default
arguments at start, ``api_key`` among them: the runtime writes each server's output to its log with the token
taken out (:mod:`~ddslurm.runtime._redact`).

The program needs the Python that runs the ``vllm`` script: for a bare server it is read from the script's first
line (``#!/…/python``, as pip and uv write console scripts), for a container it is the image's ``python3``, and
the program moves itself into the script's own interpreter when that is another one (a venv inside the image). A
``vllm`` that is not such a script (a shell wrapper, a binary) is started as before, the key in its
environment: vLLM then works as before, and only a vLLM before #52523 misses its compile cache.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

VLLM_BOOT = (
    "import os,runpy,shutil,sys;"
    "e=shutil.which(sys.argv[1]) or sys.argv[1];"
    "h=open(e,'rb').readline();"
    "p=h[2:].split()[0].decode() if h.startswith(b'#!') and h[2:].split() else '';"
    "py='python' in os.path.basename(p);"
    "py or os.execv(e,[e,*sys.argv[2:]]);"
    "o=getattr(sys,'orig_argv',None);"
    "o and os.path.abspath(p)!=sys.executable and os.execv(p,[p,*o[1:]]);"
    "k=os.environ.pop('VLLM_API_KEY',None);"
    "k or sys.exit('VLLM_API_KEY is unset: vLLM is never started without its API key');"
    "sys.argv=[e,*sys.argv[2:],'--api-key='+k];"
    "runpy.run_path(e,run_name='__main__')"
)
"""The one-line program (``PYTHON -c VLLM_BOOT VLLM serve ARGS``): finds ``VLLM`` on ``PATH``; a script whose first
line names no Python is executed as it is (the key stays in its environment); else the program goes on in that
Python (re-executing itself there, when it runs in another one), takes ``VLLM_API_KEY`` out of its environment,
appends ``--api-key=TOKEN`` (one item: a token may start with ``-``) to its own ``sys.argv``, which no other process
sees, and runs the script as ``__main__``. Without the variable it exits: vLLM never runs without its key."""


def script_python(executable: str, env: Mapping[str, str]) -> str | None:
    """The Python that runs ``executable`` (found on ``env``'s ``PATH``) when it is a Python script: the path on its
    ``#!`` line; None for anything else (a shell wrapper, a binary, a name not found)."""
    found = shutil.which(executable, path=env.get("PATH"))
    if found is None:
        return None
    try:
        with Path(found).open("rb") as script:
            head = script.readline(4096)
    except OSError:
        return None
    words = head[2:].split() if head.startswith(b"#!") else []
    if not words:
        return None
    python = words[0].decode(errors="replace")
    return python if "python" in Path(python).name else None
