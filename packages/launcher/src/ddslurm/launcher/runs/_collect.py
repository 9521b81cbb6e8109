"""Collection as a CPU Slurm job (no secrets travel with it), or in-process: :func:`collect_run`, the work of
``ddslurm collect`` (and ``--local``), of :meth:`ddslurm.launcher.api.Client.collect` and of ``ddslurm workflow``.

Both ways check the run first (every shard has a winner, every batch file is there with its published size, no
dataset unless overwriting) and fail with the collector's codes (``ddslurm.collector.collect_command``): the
job's exit code is passed on, so ``ddslurm collect`` and ``ddslurm collect --local`` fail alike.
"""

from __future__ import annotations

import io
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from ddslurm.collector import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGNAL_BASE,
    MANIFEST,
    CollectError,
    CollectResult,
    MissingWinnersError,
    collect,
    collect_command,
    preflight,
    read_manifest,
)
from ddslurm.config import RunLayout, atomic_write, make_private_dir, read_plan, read_tail
from ddslurm.launcher.cluster._slurm import Slurm, TaskState
from ddslurm.launcher.errors import CollectFailedError, LauncherError, SlurmError
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.runs._status_model import TERMINAL
from ddslurm.launcher.submission._render import render_collection

_LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED"}
_TERMINATED = {"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE"}  # Slurm sends SIGTERM (then SIGKILL)


def collect_local(
    layout: RunLayout, *, overwrite: bool, progress: Callable[[int, int], None] | None = None
) -> CollectResult:
    return collect(layout, overwrite=overwrite, progress=progress)


def next_step(layout: RunLayout, slurm: Slurm) -> str:
    """What to do about shards without a result, from the run's state: wait for a run still pending or running;
    see why and retry for one that ended without them."""
    try:
        state = run_status(layout, slurm).state
    except SlurmError:  # the scheduler cannot say now: both ways out
        return (
            f"; `ddslurm wait {layout.root}` waits for a run still running, `ddslurm status {layout.root}` says why "
            "shards failed"
        )
    if state not in TERMINAL:
        return f"; the run is still {state}: run `ddslurm wait {layout.root}` first, then collect"
    return (
        f"; the run's state is {state}: `ddslurm status {layout.root}` says why, `ddslurm retry {layout.root}` "
        "makes new attempts"
    )


def _ready(layout: RunLayout, slurm: Slurm, *, overwrite: bool, err: TextIO) -> bool:
    """The collector's checks before any data is read (:func:`preflight`); shards without a result are an
    ``error:`` line with :func:`next_step`, any other refusal the collection's own."""
    try:
        preflight(layout, overwrite=overwrite)
    except MissingWinnersError as exc:
        print(f"error: {exc}{next_step(layout, slurm)}", file=err, flush=True)
        return False
    except CollectError as exc:
        print(f"error: {exc}", file=err, flush=True)
        return False
    return True


def _final(
    slurm: Slurm, job_id: str, *, sleep: Callable[[float], None] = time.sleep, timeout: float | None = None
) -> TaskState:
    start = time.monotonic()
    delay = 0.5
    while True:
        live = slurm.squeue([job_id])
        if not any(t.state in _LIVE for t in live):
            final = [t for t in slurm.sacct([job_id]) if t.state not in _LIVE]
            if final:
                return final[0]
        if timeout is not None and time.monotonic() - start > timeout:
            raise LauncherError(f"job {job_id} did not finish within {timeout:.0f} s")
        sleep(delay)
        delay = min(delay * 1.5, 5.0)


def wait_for_job(
    slurm: Slurm, job_id: str, *, sleep: Callable[[float], None] = time.sleep, timeout: float | None = None
) -> str:
    """Poll until the job has a final accounting state; returns it (e.g. COMPLETED, FAILED)."""
    return _final(slurm, job_id, sleep=sleep, timeout=timeout).state


def job_exit_code(final: TaskState) -> int:
    """The exit code ``ddslurm collect`` passes on for a collection job that did not complete: the job's own
    (``ddslurm-collect``'s) code, 128 + N for a job ended by signal N, 143 for a job Slurm ended with SIGTERM
    (cancelled, time limit, preempted: sacct records those as ``0:0``), else 1."""
    code, _, sig = final.exit_code.partition(":")
    if code.isdigit() and int(code):
        return int(code)
    if sig.isdigit() and 0 < int(sig) < 64:
        return EXIT_SIGNAL_BASE + int(sig)
    if final.state in _TERMINATED:
        return EXIT_SIGNAL_BASE + signal.SIGTERM
    return EXIT_FAILED


def _run_job(layout: RunLayout, slurm: Slurm, *, overwrite: bool) -> tuple[str, TaskState, Path]:
    preflight(layout, overwrite=overwrite)  # a job that would fail at once is never submitted
    plan = read_plan(layout.plan)
    make_private_dir(layout.logs, exist_ok=True)  # Slurm cannot start a job whose output file it cannot open
    script = render_collection(plan, layout, overwrite=overwrite)
    path = layout.root / f"collect-{datetime.now(UTC).strftime('%Y%m%d%H%M%S')}.sbatch"
    atomic_write(path, script.encode(), mode=0o700)
    job_id = slurm.sbatch(str(path), export=())
    return job_id, _final(slurm, job_id), layout.logs / f"collect-{job_id}.out"


def _result(layout: RunLayout) -> CollectResult:
    manifest = read_manifest(layout.dataset)
    return CollectResult(
        dataset=layout.dataset,
        rows=manifest.rows,
        files=tuple(layout.dataset / f.path for f in manifest.files),
        manifest=layout.dataset / MANIFEST,
    )


def collected(layout: RunLayout) -> CollectResult | None:
    """The run's dataset when it has been collected (its manifest is there); None otherwise."""
    if not (layout.dataset / MANIFEST).is_file():
        return None
    return _result(layout)


class Recording(io.StringIO):
    """A text stream that keeps what is written to it (a collection's error lines) and writes it through to
    ``target``."""

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self._target = target

    def write(self, text: str) -> int:
        super().write(text)
        return self._target.write(text)

    def flush(self) -> None:
        self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()


def _by_job(layout: RunLayout, slurm: Slurm, *, overwrite: bool, err: TextIO) -> int:
    """The collection as a Slurm job: 0 once it completed, else the job's own error lines (or its log's last lines)
    on ``err`` and :func:`job_exit_code`."""
    job_id, final, log = _run_job(layout, slurm, overwrite=overwrite)
    if final.state == "COMPLETED":
        return EXIT_OK
    tail = read_tail(log, 200)
    errors = [line for line in tail.splitlines() if line.startswith("error: ")]
    for line in errors or [f"  {line}" for line in tail.splitlines()[-15:]]:
        print(line, file=err)
    print(
        f"error: collection job {job_id} ended {final.state} (exit code {final.exit_code or '?'}); log: {log}",
        file=err,
        flush=True,
    )
    return job_exit_code(final)


def collect_run(
    layout: RunLayout,
    slurm: Slurm,
    *,
    local: bool = False,
    overwrite: bool = False,
    err: TextIO,
    progress: Callable[[int, int], None] | None = None,
) -> CollectResult:
    """Collect the run into its dataset, by a CPU Slurm job or (``local``) with the collector's
    :func:`collect_command` in this process, and return the dataset. What it says on the way goes to ``err``: the
    collector's progress lines with ``local`` and no ``progress`` (called with (batch files done, total)), and its
    ``error: ...`` lines. Checked first (:func:`_ready`): shards without a result say what to do (the run's
    state, :func:`next_step`), and a job that would fail at once is never submitted. A collection that published
    nothing raises :class:`CollectFailedError` with the exit code ``ddslurm collect`` exits with: ``--local`` and
    the job fail alike, a write that fails (a full disk or quota) included."""
    said = Recording(err)
    code = EXIT_FAILED
    if _ready(layout, slurm, overwrite=overwrite, err=said):
        if local:
            code = collect_command(layout, overwrite=overwrite, out=io.StringIO(), err=said, progress=progress)
        else:
            code = _by_job(layout, slurm, overwrite=overwrite, err=said)
    if code != EXIT_OK:
        raise CollectFailedError(code, said.getvalue())
    return _result(layout)
