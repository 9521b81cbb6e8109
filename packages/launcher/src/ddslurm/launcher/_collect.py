"""Collection as a CPU Slurm job (no secrets travel with it), or in-process."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from ddslurm.collector import MANIFEST, CollectResult, collect, read_manifest
from ddslurm.config import RunLayout, atomic_write, make_private_dir, read_plan
from ddslurm.launcher._render import render_collection
from ddslurm.launcher._slurm import Slurm
from ddslurm.launcher.errors import LauncherError

_LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def collect_local(
    layout: RunLayout, *, overwrite: bool, progress: Callable[[int, int], None] | None = None
) -> CollectResult:
    return collect(layout, overwrite=overwrite, progress=progress)


def wait_for_job(
    slurm: Slurm, job_id: str, *, sleep: Callable[[float], None] = time.sleep, timeout: float | None = None
) -> str:
    """Poll until the job has a final accounting state; returns it (e.g. COMPLETED, FAILED)."""
    start = time.monotonic()
    delay = 0.5
    while True:
        live = slurm.squeue([job_id])
        if not any(t.state in _LIVE for t in live):
            final = [t for t in slurm.sacct([job_id]) if t.state not in _LIVE]
            if final:
                return final[0].state
        if timeout is not None and time.monotonic() - start > timeout:
            raise LauncherError(f"job {job_id} did not finish within {timeout:.0f} s")
        sleep(delay)
        delay = min(delay * 1.5, 5.0)


def collect_with_slurm(layout: RunLayout, slurm: Slurm, *, overwrite: bool) -> CollectResult:
    plan = read_plan(layout.plan)
    make_private_dir(layout.logs, exist_ok=True)  # Slurm cannot start a job whose output file it cannot open
    script = render_collection(plan, layout, overwrite=overwrite)
    path = layout.root / f"collect-{datetime.now(UTC).strftime('%Y%m%d%H%M%S')}.sbatch"
    atomic_write(path, script.encode(), mode=0o700)
    job_id = slurm.sbatch(str(path), export=())
    state = wait_for_job(slurm, job_id)
    log = layout.logs / f"collect-{job_id}.out"
    if state != "COMPLETED":
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.is_file() else "(no log)"
        raise LauncherError(f"collection job {job_id} ended {state}; last lines of {log}:\n{tail}")
    manifest = read_manifest(layout.dataset)
    return CollectResult(
        dataset=layout.dataset,
        rows=manifest.rows,
        files=tuple(layout.dataset / f.path for f in manifest.files),
        manifest=layout.dataset / MANIFEST,
    )
