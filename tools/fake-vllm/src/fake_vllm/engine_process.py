"""``--fake-engine-process``: the engine as a process of its own beside the API server, as vLLM's V1 engine is.

vLLM's API server starts its engine core in a child process whose title is ``VLLM::EngineCore`` (``setproctitle``;
the engine core's ``run_engine_core``); when that process dies, the server's engine monitor marks the engine dead,
``GET /health`` answers 503 (``EngineDeadError``) and the API server's watchdog (``vllm/entrypoints/launcher.py``,
``watchdog_loop``: ``terminate_if_errored`` every ``VLLM_WATCHDOG_TIME_S`` = 5 s) shuts the server down, which then
exits with status 1. The stand-in models that: a child Python process whose command line holds ``VLLM::EngineCore``
(so a tool finds it as it finds vLLM's, ``tools/gpu_smoke``), watched from the event loop; once it has exited,
``/health`` answers 503 and, :data:`WATCHDOG_S` later, the server exits 1. The child ends with its parent (it
polls the parent's pid) or when the server shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import NoReturn

from fake_vllm.log import log
from fake_vllm.state import ServerState

ENGINE_TITLE = "VLLM::EngineCore"
"""What vLLM's engine-core process is called (``ps``, ``/proc/PID/cmdline``)."""
WATCHDOG_S = 1.0
"""Between the engine's death and the server's exit (vLLM's watchdog checks every 5 s)."""
_CHILD = "import os,sys,time\nparent=int(sys.argv[1])\nwhile os.getppid()==parent: time.sleep(0.2)\n"


@contextlib.asynccontextmanager
async def engine_process(state: ServerState, crash: Callable[[str], NoReturn]) -> AsyncIterator[int]:
    """Start the engine child and watch it while the server runs; yields its pid."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(os.getpid()), ENGINE_TITLE])
    log(f"Started the engine core process {ENGINE_TITLE} (pid {proc.pid})")

    async def watch() -> None:
        code = await asyncio.to_thread(proc.wait)
        state.ready = False
        state.engine_dead = True
        log(f"Engine core proc {ENGINE_TITLE} died unexpectedly (exit {code}); GET /health -> 503", level="ERROR")
        await asyncio.sleep(WATCHDOG_S)
        crash("the engine core process died; shutting down the API server")

    task = asyncio.create_task(watch())
    try:
        yield proc.pid
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
