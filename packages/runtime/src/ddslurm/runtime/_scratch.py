"""Scratch directories on the node (each client step's Data Designer home) and the sweep of stale ones.

Where: the job's own temporary directory when Slurm gives one (``SLURM_JOB_TMP``, or a ``TMPDIR`` that a
job_container/tmpfs plugin or a prolog sets), otherwise the node's (``tempfile.gettempdir()``).

Name: ``ddslurm-scratch-<user>-<job>-<step>-<pid>-<random>``, owner-only; inside it ``ddslurm-scratch.json``
records who made it: uid and user, Slurm job id, step, pid and the pid's start time, host and node, attempt.

The process that made it removes it on every exit path that runs code (:func:`scratch_directory`): a normal
return, an exception, and each signal that would otherwise end the process without running any code (TERM
from ``scancel`` or the controller's teardown, HUP, USR1, USR2): the handler removes the directory, then the
process dies of that same signal, as it would have without the handler. A SIGKILL (``kill -9``, the
out-of-memory killer, the end of ``KillWait``) leaves it behind: the allocation's controller sweeps its own job's
when it ends (its clients are gone then), and the next client starting on the node sweeps any other user job's
that ended (:class:`Sweeper`, :func:`sweep_stale`). A directory is swept only when every one of these holds:

- its name starts with ``ddslurm-scratch-`` and it is a directory, not a symbolic link (nothing is followed);
- it belongs to this uid, and it holds a regular-file marker (not a link) that decodes and names this uid;
- its creator is gone: the marker was written on this host and its pid no longer runs here (or is a zombie, or
  is now another process: its start time differs); a marker from another host gives no pid evidence, so
  the directory must belong to a Slurm job;
- its Slurm job is no longer queued or running (one ``squeue`` call for every candidate, with a timeout), or
  it is this very job on this host (an earlier run of the client inside the same allocation). A marker
  without a Slurm job (a run outside Slurm) is decided by its pid alone, on its own host only.

If ``squeue`` fails or times out, nothing is swept. Removal deletes the marker last, so a sweep interrupted
half-way is finished by the next one.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import msgspec

PREFIX = "ddslurm-scratch-"
MARKER = "ddslurm-scratch.json"
MARKER_VERSION = 1
MAX_MARKER_BYTES = 64 * 1024
SQUEUE_TIMEOUT_S = 10.0
TERMINATING_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Signals whose default action ends the process without running code; handled only while that is so."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")

PidAlive = Callable[[int, int | None], bool]
"""``pid_alive(pid, start_time)``: does that process (started at that time, when known) still run here?"""
JobsRunning = Callable[[Sequence[str]], frozenset[str]]
"""``jobs_running(job_ids)``: those of the Slurm jobs that are still queued or running; raises JobQueryError."""
Clock = Callable[[], datetime]
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class JobQueryError(Exception):
    """The scheduler could not say which jobs run (squeue failed or timed out): sweep nothing."""


class ScratchMarker(msgspec.Struct, frozen=True, kw_only=True):
    """Who made a scratch directory (``ddslurm-scratch.json`` inside it)."""

    version: int = MARKER_VERSION
    uid: int
    user: str
    job_id: str | None
    """The Slurm job (``SLURM_JOB_ID``: an array task's own id), None outside Slurm."""
    step: str
    pid: int
    pid_start: int | None
    """The pid's start time (clock ticks after boot, ``/proc/<pid>/stat``), so that a reused pid is not it."""
    host: str
    node: str
    attempt: str
    created_at: str


@dataclass(frozen=True, slots=True)
class SweepEntry:
    path: Path
    action: Literal["removed", "kept"]
    why: str


@dataclass(frozen=True, slots=True)
class SweepReport:
    entries: tuple[SweepEntry, ...] = ()
    error: str | None = None
    """Why nothing was swept (the job query failed), else None."""

    @property
    def removed(self) -> tuple[Path, ...]:
        return tuple(e.path for e in self.entries if e.action == "removed")

    @property
    def kept(self) -> tuple[SweepEntry, ...]:
        return tuple(e for e in self.entries if e.action == "kept")


# --- naming and placement ---------------------------------------------------------------------------------


def _token(value: str) -> str:
    """A name part: letters, digits, ``_`` and ``.`` only (so ``-`` separates the parts), at most 40."""
    return _UNSAFE.sub("_", value)[:40] or "_"


def user_name(uid: int) -> str:
    """The account name of ``uid`` (its number if the account database does not know it)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def scratch_base(env: Mapping[str, str], default: Callable[[], str] = tempfile.gettempdir) -> Path:
    """The job's own temporary directory when Slurm provides one (``SLURM_JOB_TMP``, then ``TMPDIR``), otherwise
    the node's (``default``: Python's choice, which falls back when ``TMPDIR`` is unusable)."""
    for name in ("SLURM_JOB_TMP", "TMPDIR"):
        value = env.get(name, "")
        if value and Path(value).is_dir() and os.access(value, os.W_OK | os.X_OK):
            return Path(value)
    return Path(default())


def scratch_owner(
    env: Mapping[str, str],
    attempt: str,
    *,
    uid: int,
    user: str,
    pid: int,
    pid_start: int | None,
    host: str,
    now: datetime,
) -> ScratchMarker:
    """The marker of a scratch directory made by this process (``env``: its environment, inside a job step or not)."""
    job = env.get("SLURM_JOB_ID", "")
    step = env.get("SLURM_STEP_ID", "")
    return ScratchMarker(
        uid=uid,
        user=user,
        job_id=job if job.isdigit() else None,
        step=step if step.isdigit() else "local",
        pid=pid,
        pid_start=pid_start,
        host=host,
        node=env.get("SLURMD_NODENAME") or host,
        attempt=attempt,
        created_at=now.isoformat(),
    )


def own_scratch_owner(env: Mapping[str, str], attempt: str) -> ScratchMarker:
    """The marker of a scratch directory that this very process makes now (:func:`scratch_owner` with this
    process's uid, user, pid and start time, this host and the current time)."""
    uid, pid = os.getuid(), os.getpid()
    return scratch_owner(
        env,
        attempt,
        uid=uid,
        user=user_name(uid),
        pid=pid,
        pid_start=process_start_time(pid),
        host=socket.gethostname(),
        now=datetime.now(UTC),
    )


def scratch_prefix(owner: ScratchMarker) -> str:
    """``ddslurm-scratch-<user>-<job>-<step>-<pid>-``: the owner and the job at a glance (outside Slurm the job
    part is the attempt's)."""
    job = owner.job_id or owner.attempt.removeprefix("attempt-")
    return f"{PREFIX}{_token(owner.user)}-{_token(job)}-{_token(owner.step)}-{owner.pid}-"


# --- one process's own directory ---------------------------------------------------------------------------


def create_scratch(base: Path, owner: ScratchMarker) -> Path:
    """A new owner-only directory under ``base`` with its marker written (never through a link)."""
    path = Path(tempfile.mkdtemp(prefix=scratch_prefix(owner), dir=base))
    try:
        fd = os.open(path / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.encode(owner))
    except BaseException:
        remove_scratch(path)
        raise
    return path


def remove_scratch(path: Path, *, uid: int | None = None) -> bool:
    """Remove a scratch directory: its contents (symbolic links are removed, never followed), the marker last,
    then the directory. Refuses a link or a non-directory at ``path`` and, with ``uid``, a directory owned by
    another uid. True when nothing is left."""
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        return _remove_in(parent, path.name, uid)
    finally:
        os.close(parent)


def _remove_in(parent: int, name: str, uid: int | None) -> bool:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        return True
    except OSError:  # a symbolic link (ELOOP) or not a directory
        return False
    try:
        if uid is not None and os.fstat(fd).st_uid != uid:
            return False
        for _ in range(3):  # a process still writing may add an entry while the first pass runs
            if not _empty(fd):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(MARKER, dir_fd=fd)
            break
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _empty(fd: int) -> bool:
    """Remove every entry of the directory ``fd`` but the marker; True if none is left."""
    with os.scandir(fd) as entries:
        children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries if e.name != MARKER]
    for child, is_dir in children:
        try:
            if is_dir:
                shutil.rmtree(child, dir_fd=fd)
            else:
                os.unlink(child, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError:
            return False
    with os.scandir(fd) as entries:
        return all(e.name == MARKER for e in entries)


@contextlib.contextmanager
def scratch_directory(
    base: Path, owner: ScratchMarker, *, signals: Sequence[signal.Signals] = TERMINATING_SIGNALS
) -> Iterator[Path]:
    """Create the scratch directory and remove it however the block ends: return, exception, or one of
    ``signals`` while its disposition is the default (the handler removes the directory and the process then
    dies of that signal, exactly as it would have). Only for the main thread (signal handlers)."""
    path = create_scratch(base, owner)

    def on_signal(signum: int, _: FrameType | None) -> None:
        remove_scratch(path)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # only if the signal could not end the process

    previous: dict[signal.Signals, _Handler] = {}
    try:
        for sig in signals:
            if signal.getsignal(sig) == signal.SIG_DFL:
                previous[sig] = signal.signal(sig, on_signal)
        yield path
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        remove_scratch(path)


# --- is the creator gone? -----------------------------------------------------------------------------------


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks after boot (``/proc/<pid>/stat`` field 22); None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` still runs on this host and is the same process (start time ``start``, when known).
    Zombies count as gone. Anything uncertain counts as alive."""
    if pid <= 0:
        return False
    proc = Path("/proc")
    if (proc / "self" / "stat").is_file():
        try:
            text = (proc / str(pid) / "stat").read_text()
        except FileNotFoundError:
            return False
        except OSError:
            return True
        fields = text[text.rfind(")") + 2 :].split()
        if not fields or fields[0] in {"Z", "X", "x"}:
            return False
        return start is None or len(fields) < 20 or fields[19] == str(start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class SqueueJobs:
    """``JobsRunning`` through one ``squeue`` call: the ids it still lists (pending, running, completing...).

    A single id that the controller no longer knows makes squeue exit 1 with ``Invalid job id specified``:
    that job ended long ago. Any other failure, or no answer within ``timeout`` seconds, raises JobQueryError.
    """

    def __init__(
        self,
        *,
        run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
        timeout: float = SQUEUE_TIMEOUT_S,
    ) -> None:
        self._run = run
        self._timeout = timeout

    def __call__(self, job_ids: Sequence[str]) -> frozenset[str]:
        ids = sorted({j for j in job_ids if j.isdigit()})
        if not ids:
            return frozenset()
        argv = ["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%A"]
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=self._timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise JobQueryError(f"squeue did not answer within {self._timeout:g} s") from exc
        except OSError as exc:
            raise JobQueryError(f"squeue could not run: {exc}") from exc
        if done.returncode != 0:
            if "Invalid job id specified" in (done.stderr or ""):
                return frozenset()
            tail = (done.stderr or done.stdout or "").strip()[-300:]
            raise JobQueryError(f"squeue exited {done.returncode}: {tail}")
        listed = {line.strip() for line in (done.stdout or "").splitlines()}
        return frozenset(listed & set(ids))


# --- the sweep ----------------------------------------------------------------------------------------------


class Sweeper:
    """Removes the scratch directories of this uid whose creator and job are gone (see the module's rules)."""

    def __init__(
        self,
        *,
        uid: int,
        host: str,
        job_id: str | None,
        pid_alive: PidAlive,
        jobs_running: JobsRunning,
        clock: Clock,
    ) -> None:
        self._uid = uid
        self._host = host
        self._job_id = job_id
        self._pid_alive = pid_alive
        self._jobs_running = jobs_running
        self._clock = clock

    def sweep(self, base: Path) -> SweepReport:
        """Judge every ``ddslurm-scratch-*`` entry of ``base`` and remove the stale ones (none if the job query
        fails)."""
        entries: list[SweepEntry] = []
        stale: list[tuple[Path, ScratchMarker, str]] = []
        ask: dict[str, list[tuple[Path, ScratchMarker]]] = {}
        try:
            with os.scandir(base) as listing:
                names = sorted(e.name for e in listing if e.name.startswith(PREFIX))
        except OSError as exc:
            return SweepReport(error=f"cannot list {base}: {exc}")
        for name in names:
            path = base / name
            verdict = self._judge(path)
            if isinstance(verdict, str):
                entries.append(SweepEntry(path, "kept", verdict))
            elif verdict.job_id is None:
                stale.append((path, verdict, f"creator pid {verdict.pid} gone (made outside Slurm)"))
            elif verdict.host == self._host and verdict.job_id == self._job_id:
                stale.append((path, verdict, f"creator pid {verdict.pid} gone (an earlier run in this job)"))
            else:
                ask.setdefault(verdict.job_id, []).append((path, verdict))
        if ask:
            try:
                running = self._jobs_running(sorted(ask))
            except JobQueryError as exc:
                return SweepReport(tuple(entries), error=str(exc))
            for job, found in ask.items():
                for path, marker in found:
                    if job in running:
                        entries.append(SweepEntry(path, "kept", f"job {job} is still queued or running"))
                    else:
                        stale.append((path, marker, f"creator pid {marker.pid} gone and job {job} ended"))
        for path, marker, why in stale:
            age = self._age_s(marker)
            why = why if age is None else f"{why}; made {age:.0f} s ago"
            if remove_scratch(path, uid=self._uid):
                entries.append(SweepEntry(path, "removed", why))
            else:
                entries.append(SweepEntry(path, "kept", f"could not be removed ({why})"))
        return SweepReport(tuple(entries))

    def _judge(self, path: Path) -> ScratchMarker | str:
        """The marker of a directory whose creator is gone, or why the directory is kept."""
        try:
            st = path.lstat()
        except OSError:
            return "vanished"
        if stat.S_ISLNK(st.st_mode):
            return "a symbolic link (never followed)"
        if not stat.S_ISDIR(st.st_mode):
            return "not a directory"
        if st.st_uid != self._uid:
            return f"owned by uid {st.st_uid}"
        marker = self._read_marker(path)
        if marker is None:
            return "no readable marker: not known to be ddslurm's"
        if marker.uid != self._uid:
            return f"marker names uid {marker.uid}"
        if marker.host != self._host:
            if marker.job_id is None:
                return f"made outside Slurm on another host ({marker.host})"
            return marker
        if self._pid_alive(marker.pid, marker.pid_start):
            return f"creator pid {marker.pid} still runs"
        return marker

    def _read_marker(self, path: Path) -> ScratchMarker | None:
        try:
            fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self._uid or st.st_size > MAX_MARKER_BYTES:
                return None
            data = os.read(fd, MAX_MARKER_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return msgspec.json.decode(data, type=ScratchMarker)
        except msgspec.DecodeError:
            return None

    def _age_s(self, marker: ScratchMarker) -> float | None:
        try:
            return (self._clock() - datetime.fromisoformat(marker.created_at)).total_seconds()
        except (ValueError, TypeError):
            return None


def node_sweeper(env: Mapping[str, str], *, uid: int, host: str) -> Sweeper:
    """The :class:`Sweeper` a ddslurm step runs on its node: this process table, ``squeue`` and the clock; this very
    job is ``SLURM_JOB_ID`` of ``env`` (none outside Slurm)."""
    job = env.get("SLURM_JOB_ID", "")
    return Sweeper(
        uid=uid,
        host=host,
        job_id=job if job.isdigit() else None,
        pid_alive=pid_alive,
        jobs_running=SqueueJobs(),
        clock=lambda: datetime.now(UTC),
    )


def sweep_stale(base: Path, env: Mapping[str, str], *, uid: int, host: str, log: Any) -> None:
    """Remove this user's scratch directories under ``base`` whose creator and job are gone (those of this very
    job, ``SLURM_JOB_ID`` of ``env``, on this host: whose creator is gone); never fails, logs what it removed."""
    try:
        report = node_sweeper(env, uid=uid, host=host).sweep(base)
    except Exception as exc:  # node hygiene never fails an attempt
        log.warning("scratch.sweep_failed", base=str(base), error=repr(exc))
        return
    if report.error:
        log.warning("scratch.sweep_skipped", base=str(base), why=report.error)
    for entry in report.entries:
        if entry.action == "removed" or entry.why.startswith("could not"):
            log.info(f"scratch.{entry.action}", path=str(entry.path), why=entry.why)
