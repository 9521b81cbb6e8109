"""Finding runs: the cluster profile a command uses, its workspace, one run by directory or id, every run of the
workspace (``ddslurm list``), and where a run's report page goes (``ddslurm report``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from ddslurm.config import RunLayout, atomic_write, load_profile
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import LauncherError, UsageError
from ddslurm.launcher.runs._records import find_run
from ddslurm.launcher.runs._status import run_statuses
from ddslurm.launcher.runs._status_model import RunStatus, Unreadable

PROFILE_ENV = "DDSLURM_PROFILE"
"""The variable that names the cluster profile when a command is given none."""
REPORT_PAGE = "report.html"
"""The report's page in the run directory (next to the dataset), unless another path is given."""


def resolve_profile(profile: Path | None, env: Mapping[str, str]) -> Path | None:
    """``profile``, else the file ``DDSLURM_PROFILE`` names; None when neither names one."""
    if profile is not None:
        return profile
    named = env.get(PROFILE_ENV)
    return Path(named) if named else None


def required_profile(profile: Path | None, env: Mapping[str, str], command: str) -> Path:
    """The profile :func:`resolve_profile` finds, which ``command`` (``submit``, ``doctor``) cannot do without: a
    :class:`UsageError` when neither names one."""
    path = resolve_profile(profile, env)
    if path is None:
        raise UsageError(f"{command} needs --profile PROFILE.yaml (the cluster profile), or {PROFILE_ENV} naming it")
    return path


def workspace_of(profile: Path | None, env: Mapping[str, str]) -> Path | None:
    """The workspace of the profile :func:`resolve_profile` finds (None without a profile)."""
    path = resolve_profile(profile, env)
    return Path(load_profile(path).workspace) if path is not None else None


def open_run(ref: str, env: Mapping[str, str], profile: Path | None = None) -> RunLayout:
    """The run ``ref`` names: its directory, or its run id in the workspace of the profile (``find_run``)."""
    return find_run(ref, workspace_of(profile, env))


class ListedRun(msgspec.Struct, kw_only=True):
    """One run as ``ddslurm list`` shows it (``--json``: one object a run, these fields in this order)."""

    run_id: str
    name: str
    state: str
    """The run's state (:data:`~ddslurm.launcher.runs._status_model.RunState`); ``unreadable`` for a run whose records
    this ddslurm cannot read."""
    records: int
    records_done: int
    submitted_at: str | None
    created: str
    """When the run directory's plan was written (ISO 8601, UTC)."""
    run_dir: str


def _listed(found: RunStatus | Unreadable) -> ListedRun:
    if isinstance(found, Unreadable):  # a run written by another ddslurm version: listed, never fatal
        layout, state, name, records, done, submitted = found.layout, "unreadable", "?", 0, 0, None
    else:
        layout, state, name = RunLayout(Path(found.run_dir)), found.state, found.name
        records, done, submitted = found.records_requested, found.records_done, found.submitted_at
    return ListedRun(
        run_id=layout.run_id,
        name=name,
        state=state,
        records=records,
        records_done=done,
        submitted_at=submitted,
        created=datetime.fromtimestamp(layout.plan.stat().st_mtime, UTC).isoformat(),
        run_dir=str(layout.root),
    )


def list_runs(workspace: Path, slurm: Slurm) -> list[ListedRun]:
    """Every run of the workspace, newest first (by its first submission, else by its directory), from one
    ``squeue`` and one ``sacct`` call for all of them."""
    # not the hidden .RUN_ID.partial-* of a submit still writing (or killed while it wrote)
    layouts = [RunLayout(p.parent) for p in sorted((workspace / "runs").glob("[!.]*/run.json"))]
    runs = [_listed(found) for found in run_statuses(layouts, slurm)]
    runs.sort(key=lambda r: r.submitted_at or r.created, reverse=True)
    return runs


def save_report(layout: RunLayout, page: str, output: Path | None = None) -> Path:
    """Write a run's report page to ``output`` (default: :data:`REPORT_PAGE` in the run directory), atomically;
    returns where. A page that cannot be written is a :class:`LauncherError` naming the path."""
    target = output if output is not None else layout.root / REPORT_PAGE
    try:
        atomic_write(target, page.encode())
    except OSError as exc:
        raise LauncherError(f"{target}: cannot write the report: {exc}") from exc
    return target
