"""``ddslurm logs``: the shard it shows by default, waiting for a log that does not exist yet, and following log
files as they grow (whole lines, printed as JSON or rendered for people by ``_console``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ddslurm.config import AttemptRecord, RunLayout, read_plan
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.commands._console import LogWriter, decode_record
from ddslurm.launcher.commands._output import write_json
from ddslurm.launcher.errors import LauncherError, SlurmError
from ddslurm.launcher.runs._status import run_status
from ddslurm.launcher.runs._status_model import TERMINAL, RunStatus
from ddslurm.launcher.runs._steer import check_shard, log_files, pick_attempt

SHOWN_FIRST = ("failed", "corrupt", "partial")
"""Without ``--shard``: the first shard in the first of these states, else shard 0."""


def default_shard(status: RunStatus) -> tuple[int, str | None]:
    """The shard ``logs`` shows without ``--shard``, and the state it was chosen for (None: shard 0 by default)."""
    for state in SHOWN_FIRST:
        found = next((s for s in status.shards if s.state == state), None)
        if found is not None:
            return found.shard, state
    return 0, None


def default_step(record: AttemptRecord | None) -> str:
    """The step ``logs`` shows without ``--step``: the servers' log for an attempt that failed because of its
    servers (a ``server_*`` reason), the proxies' for ``proxy_died``, else the client's."""
    reason = record.reason or "" if record is not None and record.state == "failed" else ""
    if reason.startswith("server_"):
        return "server"
    return "proxy" if reason == "proxy_died" else "client"


class LogPrinter:
    """Prints log lines: as JSON (``{"source", "text"}``, plus ``record`` for a structured line) or for people,
    under a ``==> file <==`` header once lines of more than one file are shown."""

    def __init__(self, out: TextIO, *, as_json: bool, several: bool) -> None:
        self.several = several
        self._out, self._as_json = out, as_json
        self._people = LogWriter(out)
        self._current: Path | None = None

    def __call__(self, source: Path, line: str) -> None:
        if self._as_json:
            record = decode_record(line)
            write_json({"source": str(source), "text": line, **({"record": record} if record else {})}, self._out)
            return
        if self.several and source != self._current:
            self._out.write(f"==> {source} <==\n")
        self._current = source
        self._people(line)


class Tail:
    """What each log file gained since it was last read, as whole lines (a partial last line waits for its end)."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def known(self, path: Path) -> bool:
        return path in self._offsets

    def read(self, path: Path) -> list[str]:
        offset = self._offsets.get(path, 0)
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
        self._offsets[path] = offset + len(data)
        *lines, rest = (self._partial.pop(path, b"") + data).split(b"\n")
        if rest:
            self._partial[path] = rest
        return [line.decode(errors="replace") for line in lines]


@dataclass(slots=True)
class LogFollower:
    """Shows one step's log of one attempt of a shard, and follows it (``-f``) until the run ends."""

    layout: RunLayout
    slurm: Slurm
    out: TextIO
    err: TextIO
    sleep: Callable[[float], None]

    def pick_shard(self, shard: int | None) -> int:
        """``shard`` if the run has it (else a UsageError naming the range), or the default, said on stderr."""
        if shard is not None:
            return check_shard(shard, read_plan(self.layout.plan))
        try:
            index, state = default_shard(run_status(self.layout, self.slurm))
        except SlurmError:
            return 0
        if state is not None:
            self.err.write(f"shard {index} ({state}); --shard N shows another\n")
            self.err.flush()
        return index

    def pick_step(self, shard: int, step: str | None, attempt: str | None) -> str:
        """``step``, or the attempt's :func:`default_step`, said on stderr when it is not the client's."""
        if step is not None:
            return step
        record = pick_attempt(self.layout, shard, attempt)
        chosen = default_step(record)
        if record is not None and chosen != "client":
            said = record.attempt.removeprefix("attempt-")
            self.err.write(
                f"the {chosen} log: attempt {said} failed with {record.reason}; --step client shows the client\n"
            )
            self.err.flush()
        return chosen

    def ended(self) -> bool:
        try:
            return run_status(self.layout, self.slurm).state in TERMINAL
        except SlurmError:
            return False

    def files(
        self, shard: int, step: str, attempt: str | None, *, wait: bool
    ) -> tuple[AttemptRecord | None, list[Path]]:
        """The attempt and its log files; with ``wait``, for a log that does not exist yet (the task is pending,
        or starting) until it appears, or the run ends without it."""
        record = pick_attempt(self.layout, shard, attempt)
        found = log_files(self.layout, shard, step, record)
        if found:
            return record, found
        if not wait:
            begun = "" if record is not None else " (no attempt has begun; -f waits for it)"
            raise LauncherError(f"shard {shard} has no {step} log yet{begun}")
        self.err.write(f"waiting for the {step} log of shard {shard} (Ctrl-C stops)\n")
        self.err.flush()
        while not found:
            if self.ended():
                raise LauncherError(f"shard {shard} has no {step} log: the run ended without one")
            self.sleep(1.0)
            record = pick_attempt(self.layout, shard, attempt)
            found = log_files(self.layout, shard, step, record)
        return record, found

    def show(self, shard: int, step: str, attempt: str | None, *, lines: int, follow: bool, as_json: bool) -> None:
        """The last ``lines`` lines of each log file; with ``follow``, then what they (and files of the step that
        appear later) gain, once a second, until the run ends."""
        record, found = self.files(shard, step, attempt, wait=follow)
        printer = LogPrinter(self.out, as_json=as_json, several=len(found) > 1)
        tail = Tail()
        for path in found:
            for line in tail.read(path)[-lines:] if lines > 0 else []:
                printer(path, line)
        self.out.flush()
        while follow:
            ended = self.ended()  # before reading: what was written before the end is shown
            for path in log_files(self.layout, shard, step, record):
                printer.several = printer.several or not tail.known(path)
                for line in tail.read(path):
                    printer(path, line)
            self.out.flush()
            if ended:
                return
            self.sleep(1.0)
