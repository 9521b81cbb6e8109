"""What every command of the ``ddslurm`` app works with: its :class:`Session` (environment, scheduler, streams,
clock) and the :class:`~ddslurm.launcher.api.Client` made of it, the guard that turns a closed stdout and Ctrl-C
into what ``main`` reports, and the options and arguments several commands share."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TextIO, TypeVar

import typer

from ddslurm.config import RunLayout, expand_ranges, read_plan
from ddslurm.launcher.api import Client
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.commands._output import (
    CommandFailed,
    ErrorCode,
    ErrorReport,
    ExitCode,
)
from ddslurm.launcher.errors import UsageError
from ddslurm.launcher.runs._find import open_run


@dataclass(slots=True)
class Session:
    """What every command works with: the environment, the scheduler, the output streams and the clock."""

    env: Mapping[str, str]
    slurm: Slurm
    out: TextIO
    err: TextIO
    sleep: Callable[[float], None]
    json: bool = False
    """``--json`` is on the command line (so an error of the command line itself is reported as JSON too)."""
    command: str | None = None


def command_session(ctx: typer.Context, as_json: bool) -> Session:
    """The session of the command ``ctx`` runs, with its ``--json``."""
    session = ctx.find_object(Session)
    if session is None:
        raise RuntimeError("the ddslurm app runs through ddslurm.launcher.cli.main")
    session.command = ctx.info_name
    session.json = session.json or as_json
    return session


def session_client(session: Session, profile: Path | None, *, notes: TextIO | None = None) -> Client:
    """The API's client of a command: its environment, scheduler and clock, ``--profile`` (else
    ``DDSLURM_PROFILE``), and notes on stderr (or ``notes``)."""
    return Client(
        profile=profile,
        env=session.env,
        slurm=session.slurm,
        notes=notes if notes is not None else session.err,
        sleep=session.sleep,
    )


class PipeClosed(Exception):
    """Whoever read stdout stopped (``| head``): ``main`` exits quietly."""


_F = TypeVar("_F", bound=Callable[..., Any])


def guarded(command: _F) -> _F:
    """A command whose closed stdout and Ctrl-C ``main`` handles: Typer would turn a BrokenPipeError into
    ``sys.exit(1)`` (rewrapping the process's streams) and Ctrl-C into a silent exit 130."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            raise PipeClosed from None
        except KeyboardInterrupt:
            raise CommandFailed(ErrorReport(ErrorCode.INTERRUPTED, "interrupted", ExitCode.INTERRUPTED)) from None

    return run  # type: ignore[return-value]


# --- the options several commands share ---

RunArg = Annotated[
    str,
    typer.Argument(
        metavar="RUN",
        help="The run: its directory, or its run id in the workspace of --profile.",
        show_default=False,
    ),
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        metavar="PROFILE.yaml",
        help="The cluster profile, whose workspace holds the runs. Default: the file DDSLURM_PROFILE names.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help='Print JSON instead of text; an error as {"error": {"code", "message", "exit_code"}}.'),
]
ShardsHelp = "Shards by number and range, such as 1,3,5-7."


def run_layout(session: Session, run: str, profile: Path | None) -> RunLayout:
    """RUN (with ``--profile``, else ``DDSLURM_PROFILE``, for a run id)."""
    return open_run(run, session.env, profile)


def write_lines(out: TextIO, lines: Iterable[str]) -> None:
    out.write("".join(f"{line}\n" for line in lines))


def parse_shards(value: str | None, layout: RunLayout) -> list[int] | None:
    """``1,3,5-7`` → [1, 3, 5, 6, 7]; None stays None. Checked against the run's shards before it is expanded
    (``0-999999999`` is a usage error naming what the run has, not a list of a billion numbers)."""
    if value is None:
        return None
    count = len(read_plan(layout.plan).shards)
    have = "shard 0 (1 shard)" if count == 1 else f"shards 0-{count - 1} ({count} shards)"

    def refused(message: str) -> UsageError:
        return UsageError(f"--shards {value!r}: {message}")

    try:
        return expand_ranges(value, below=count, what="shard", have=f"the run has {have}", error=refused)
    except ValueError:  # not numbers and ranges (the bounds are ``refused``)
        raise UsageError(f"--shards {value!r}: expected numbers and ranges such as 1,3,5-7") from None
