"""ddslurm's Python API: submit a run, follow it, steer it and read its dataset from a program
(``docs/python-api.md``).

A :class:`Client` holds what every operation needs (the environment, whose variables hold the providers' keys by
the names Data Designer's settings give them; Data Designer's home; the cluster profile; a Slurm client; where
notes go), each read from this process when not given, and offers the operations of ``ddslurm``'s commands with
typed results and ddslurm's errors (every one a :class:`~ddslurm.config.DdslurmError`):

- :meth:`Client.submit` (:class:`Submission`; with ``dry_run``, :class:`Planned`), :meth:`Client.open`
  (:class:`Run`);
- :meth:`Client.status`, :meth:`Client.follow`, :meth:`Client.wait` (:class:`RunStatus`, raising
  :class:`WaitTimeout`);
- :meth:`Client.cancel` (:class:`Cancelled`), :meth:`Client.retry` (:class:`Retried`, :class:`RetryPreview`; raising
  :class:`RetryRefusedError`), :meth:`Client.accept_partial` (:class:`Accepted`);
- :meth:`Client.collect` (:class:`CollectResult`, raising :class:`CollectFailedError`), :meth:`Client.report`
  (:class:`Reported`).

The commands of ``ddslurm`` (``submit``, ``status``, ``wait``, ``cancel``, ``retry``, ``accept-partial``,
``collect``, ``report``, ``workflow``) call these methods and render what they return. Stable: the names in
``__all__``, the public fields of the result types and the client's methods and parameters
(``packages/launcher/tests/test_api.py`` pins them); every other name of ``ddslurm.launcher`` is internal.
Importing this module loads neither the planner, the collector (pyarrow) nor Data Designer: an operation imports
what its work needs (``CollectResult`` and ``PartialSubmitError`` are imported when first used).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO, TypeAlias, overload

from ddslurm.config import DdslurmError, RunLayout, lazy_exports
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.errors import (
    CollectFailedError,
    LauncherError,
    RetryRefusedError,
    RunNotFoundError,
    SlurmError,
    SubmitError,
    UsageError,
)
from ddslurm.launcher.runs._find import open_run, required_profile, resolve_profile, save_report
from ddslurm.launcher.runs._follow import SchedulerBusy, WaitTimeout, follow_run, wait_to_end
from ddslurm.launcher.runs._retry_why import RetryPreview
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.runs._status_model import KeyStatus, RunStatus, ShardStatus, StageProgress
from ddslurm.launcher.runs._steer import Accepted, AcceptedShard, Cancelled, Retried, accept_partial, cancel, retry

if TYPE_CHECKING:
    from ddslurm.collector import CollectResult
    from ddslurm.launcher.report import RunReport
    from ddslurm.launcher.submission._aliases import EndpointCheck
    from ddslurm.launcher.submission._arrays import PartialSubmitError


@dataclass(frozen=True, slots=True)
class Run:
    """A run: its id and its directory (``<workspace>/runs/<run_id>``). Every method that takes a run takes one of
    these, its directory, or its run id in the workspace of the client's profile."""

    run_id: str
    run_dir: Path


RunRef: TypeAlias = Run | str | os.PathLike[str]
"""A run as the methods take it: a :class:`Run`, its directory, or its run id (with the client's profile)."""


@dataclass(frozen=True, slots=True)
class Submission:
    """A run that :meth:`Client.submit` submitted: its arrays are in Slurm's queue."""

    run: Run
    job_ids: tuple[str, ...]
    """The Slurm array jobs submitted, in order (automatic retries' arrays included)."""
    shards: int
    records: int
    """The records the run makes (the run file's ``num_records``)."""
    warnings: tuple[str, ...]
    """What the run should know of (``submit`` prints them as ``warning:``)."""
    notes: tuple[str, ...]
    """What the plan notes (``submit`` prints them as ``note:``)."""
    secret_env_unscanned: tuple[str, ...]
    """Key variables whose values are placeholders (not secrets): the attempts do not scan their files for them."""


@dataclass(frozen=True, slots=True)
class Planned:
    """What :meth:`Client.submit` with ``dry_run`` found a submission would do: nothing written, nothing
    submitted."""

    run: Run
    """Where the run would be written (the directory does not exist)."""
    shards: int
    records: int
    arrays: int
    """The ``sbatch`` calls the submission would make."""
    tasks: int
    """The array tasks of those arrays."""
    script: str
    """The batch script of the first array."""
    warnings: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reported:
    """What :meth:`Client.report` wrote: the page, and the numbers on it (``ddslurm report --json``'s)."""

    page: Path
    report: RunReport


class Client:
    """The operations on runs, with their dependencies. Each argument defaults to this process's:

    - ``env``: the environment (``os.environ``): the providers' keys, by the names Data Designer's settings give
      them; ``DDSLURM_PROFILE``; ``DATA_DESIGNER_HOME``;
    - ``data_designer_home``: Data Designer's home (default: ``DATA_DESIGNER_HOME`` of ``env``, else
      ``~/.data-designer``, as Data Designer decides);
    - ``profile``: the cluster profile (default: the file ``DDSLURM_PROFILE`` names), whose workspace holds the
      runs; :meth:`submit` may name another;
    - ``slurm``: the Slurm client (:class:`ddslurm.launcher.Slurm` over ``env``);
    - ``notes``: where notes and warnings go, a line each (``sys.stderr``): a busy scheduler, leftover tasks
      cancelled, facts not recorded, the collector's progress;
    - ``sleep``: how waits wait (``time.sleep``); ``engine_host``: how the profile's ``python_env`` is asked about
      Data Designer (a ``ddslurm-runtime inspect`` process; tests pass ``ddslurm.launcher.testing.InProcessHost``).
    """

    def __init__(
        self,
        *,
        profile: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        data_designer_home: str | os.PathLike[str] | None = None,
        slurm: Slurm | None = None,
        notes: TextIO | None = None,
        sleep: Callable[[float], None] = time.sleep,
        engine_host: EngineHost | None = None,
    ) -> None:
        environ: Mapping[str, str] = os.environ if env is None else env
        if data_designer_home is not None:  # where Data Designer (and so every check of ddslurm's) looks
            from ddslurm.providers.discovery import DD_HOME_ENV

            environ = {**environ, DD_HOME_ENV: os.fspath(data_designer_home)}
        self.env = environ
        self.profile = resolve_profile(None if profile is None else Path(profile), environ)
        self.slurm = slurm if slurm is not None else Slurm(env=environ)
        self.notes = notes if notes is not None else sys.stderr
        self.sleep = sleep
        self.engine_host = engine_host if engine_host is not None else RUNTIME_PROCESS

    def _layout(self, run: RunRef) -> RunLayout:
        return open_run(os.fspath(run.run_dir if isinstance(run, Run) else run), self.env, self.profile)

    def open(self, run: RunRef) -> Run:
        """The run ``run`` names (:class:`RunNotFoundError` when none; a run directory another user could change is
        refused)."""
        return _run_at(self._layout(run))

    # --- submitting ---

    @overload
    def submit(
        self,
        run_file: str | os.PathLike[str],
        profile: str | os.PathLike[str] | None = None,
        *,
        dry_run: Literal[False] = False,
        check_endpoints: bool = False,
        accept_overrun: bool = False,
    ) -> Submission: ...

    @overload
    def submit(
        self,
        run_file: str | os.PathLike[str],
        profile: str | os.PathLike[str] | None = None,
        *,
        dry_run: Literal[True],
        check_endpoints: bool = False,
        accept_overrun: bool = False,
    ) -> Planned: ...

    def submit(
        self,
        run_file: str | os.PathLike[str],
        profile: str | os.PathLike[str] | None = None,
        *,
        dry_run: bool = False,
        check_endpoints: bool = False,
        accept_overrun: bool = False,
    ) -> Submission | Planned:
        """``ddslurm submit RUN_FILE --profile PROFILE``: validate and compile the run, check it against the
        cluster, write its run directory and submit its arrays. ``profile``: the cluster profile (default: the
        client's). ``dry_run``: everything up to the first ``sbatch``, nothing written (:class:`Planned`).
        ``check_endpoints``: first ask each hosted endpoint with the key. ``accept_overrun``: submit a run whose
        prediction says it will not fit its time limit (``Planned.warnings`` says how), which is otherwise refused
        (``--accept-overrun``). Refused inputs raise :class:`SubmitError` (or the configuration's, the providers' or
        the planner's errors) with nothing left behind; a submission that stopped part-way raises
        :class:`PartialSubmitError` (``ddslurm submit --continue`` submits the rest)."""
        from ddslurm.launcher.commands._console import plan_notes

        profile_path = required_profile(self.profile if profile is None else Path(profile), self.env, "submit")
        endpoints = _endpoint_check() if check_endpoints else None
        if dry_run:
            from ddslurm.launcher.submission._dry_run import dry_run as plan_dry_run

            planned = plan_dry_run(
                Path(run_file),
                profile_path,
                slurm=self.slurm,
                env=self.env,
                check_endpoints=endpoints,
                host=self.engine_host,
            )
            return Planned(
                run=_run_at(planned.layout),
                shards=len(planned.plan.shards),
                records=planned.plan.num_records,
                arrays=len(planned.planned.arrays),
                tasks=planned.planned.tasks,
                script=planned.script,
                warnings=planned.warnings,
                notes=tuple(plan_notes(planned.plan)),
            )
        from ddslurm.launcher.submission._submit import submit

        done = submit(
            Path(run_file),
            profile_path,
            slurm=self.slurm,
            env=self.env,
            check_endpoints=endpoints,
            host=self.engine_host,
            accept_overrun=accept_overrun,
        )
        return Submission(
            run=_run_at(done.layout),
            job_ids=done.job_ids,
            shards=len(done.plan.shards),
            records=done.plan.num_records,
            warnings=done.warnings,
            notes=tuple(plan_notes(done.plan)),
            secret_env_unscanned=tuple(done.plan.secret_env_unscanned),
        )

    # --- following ---

    def status(self, run: RunRef) -> RunStatus:
        """``ddslurm status RUN``: the run and every shard, from its directory and one ``squeue`` and one ``sacct``."""
        return run_status(self._layout(run), self.slurm)

    def follow(self, run: RunRef) -> Iterator[RunStatus]:
        """``ddslurm status --watch``: the run's status every 2 s, up to and including the first that has ended (a
        scheduler query that failed is a note, then asked again later)."""
        for polled in follow_run(self._layout(run), self.slurm, sleep=self.sleep):
            if isinstance(polled, SchedulerBusy):
                self.notes.write(f"{polled.note()}\n")
                self.notes.flush()
            else:
                yield polled

    def wait(
        self, run: RunRef, timeout: float | None = None, *, on_update: Callable[[RunStatus], None] | None = None
    ) -> RunStatus:
        """``ddslurm wait RUN``: follow the run until it ends and return its final status (``state`` is
        ``succeeded`` only when every shard has its result); cancel what a succeeded run left queued and record its
        facts for the next dry runs. :class:`WaitTimeout` (with the last status) after ``timeout`` seconds;
        ``on_update``: told of every status on the way."""
        return wait_to_end(
            self._layout(run), self.slurm, notes=self.notes, timeout=timeout, sleep=self.sleep, on_update=on_update
        )

    # --- steering ---

    def cancel(self, run: RunRef, shards: Sequence[int] | None = None) -> Cancelled:
        """``ddslurm cancel RUN [--shards]``: the whole run (every array, pending retries included; no later attempt
        generates), or the queued and running tasks of ``shards``."""
        return cancel(self._layout(run), self.slurm, None if shards is None else list(shards))

    def retry(
        self,
        run: RunRef,
        shards: Sequence[int] | None = None,
        *,
        fresh: bool = False,
        resume_cancelled: bool = False,
        dry_run: bool = False,
        force: bool = False,
    ) -> Retried:
        """``ddslurm retry RUN``: new attempts, as one array, for ``shards`` (default: every shard without a result
        and without a task), resuming their saved batches unless ``fresh``; a run cancelled as a whole only with
        ``resume_cancelled``. ``dry_run``: the shards, each one's attempt and the rows it would resume
        (``Retried.preview``) and the arrays a retry would submit (``Retried.planned``), nothing changed.

        After ``key_refused`` each hosted provider is asked with the client's key first: :class:`RetryRefusedError`
        while one still refuses it. Shards whose failure the frozen plan would repeat (``server_start_failed``, ...)
        are refused when they are all there is to retry, unless ``force``; named in ``Retried.warnings`` otherwise."""
        return retry(
            self._layout(run),
            self.slurm,
            self.env,
            None if shards is None else list(shards),
            resume_cancelled=resume_cancelled,
            fresh=fresh,
            dry_run=dry_run,
            force=force,
            check_keys=_endpoint_check(),
        )

    def accept_partial(self, run: RunRef, shards: Sequence[int]) -> Accepted:
        """``ddslurm accept-partial RUN --shards``: publish the best short result of each shard as its result
        (marked partial); a two-stage shard short at its GPU stage gets its CPU stage submitted."""
        return accept_partial(self._layout(run), list(shards), self.slurm, self.env)

    # --- the dataset ---

    def collect(
        self,
        run: RunRef,
        *,
        local: bool = False,
        overwrite: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> CollectResult:
        """``ddslurm collect RUN``: merge the shards' results into one Parquet dataset (``RUN/dataset``), by a CPU
        Slurm job (no secrets travel with it) or, ``local``, in this process (``progress``: called with (batch files
        done, total); without it, the collector's lines go to the notes); then record a succeeded run's facts.
        A collection that published nothing raises :class:`CollectFailedError` (its ``exit_code`` is
        ``ddslurm collect``'s)."""
        from ddslurm.launcher.facts._workspace import record_after
        from ddslurm.launcher.runs._collect import collect_run

        layout = self._layout(run)
        result = collect_run(layout, self.slurm, local=local, overwrite=overwrite, err=self.notes, progress=progress)
        record_after(layout, self.slurm, self.notes)
        return result

    def report(self, run: RunRef, output: str | os.PathLike[str] | None = None) -> Reported:
        """``ddslurm report RUN``: write the run's self-contained HTML page (default: ``RUN/report.html``) and
        return it with its numbers; record a succeeded run's facts."""
        from ddslurm.launcher.facts._fact_check import with_fact_check
        from ddslurm.launcher.facts._workspace import record_after
        from ddslurm.launcher.report import numbers, read_run, render_html

        layout = self._layout(run)
        facts = read_run(layout, self.slurm)  # the run and its accounting, read once for the page and the facts
        made = with_fact_check(facts, numbers(facts))
        page = save_report(layout, render_html(made), None if output is None else Path(output))
        record_after(layout, self.slurm, self.notes, reading=(facts, made))
        return Reported(page, made)


def _run_at(layout: RunLayout) -> Run:
    return Run(layout.run_id, layout.root)


def _endpoint_check() -> EndpointCheck:
    """``--check-endpoints``: each hosted endpoint asked with the key (the providers' check, imported for it)."""
    from ddslurm.providers import check_endpoints

    return check_endpoints


_LAZY_IMPORTS: dict[str, str] = {
    "CollectResult": "ddslurm.collector",
    "PartialSubmitError": "ddslurm.launcher.submission._arrays",
}
"""The names whose modules load what only their operation needs (the collector: pyarrow; submit: the planner)."""

__all__ = [
    "Accepted",
    "AcceptedShard",
    "Cancelled",
    "Client",
    "CollectFailedError",
    "CollectResult",
    "DdslurmError",
    "KeyStatus",
    "LauncherError",
    "PartialSubmitError",
    "Planned",
    "Reported",
    "Retried",
    "RetryPreview",
    "RetryRefusedError",
    "Run",
    "RunNotFoundError",
    "RunRef",
    "RunStatus",
    "ShardStatus",
    "SlurmError",
    "StageProgress",
    "SubmitError",
    "Submission",
    "UsageError",
    "WaitTimeout",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY_IMPORTS, __all__)
