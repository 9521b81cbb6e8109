"""``ddslurm``: run Data Designer recipes on Slurm (a Typer app; ``docs/cli.md`` documents every command).

Commands: init (--dir, --force), submit (--dry-run, --continue), tune (--records), providers, doctor, status
(--watch), wait (--timeout), cancel (--shards), retry (--shards, --fresh, --resume-cancelled, --dry-run),
accept-partial, logs, collect (--local, --overwrite), report (--output), list. Every command takes --json (errors
included); exit codes are :class:`ddslurm.launcher.commands._output.ExitCode`. Rendering for people lives in
``commands._console``, JSON and errors in ``commands._output``. This module holds the app, registers its commands
in panels by job (:data:`PANELS`; each command's help is its docstring, ending with Examples that a test parses
against the app: ``ddslurm.config.cli.help_text``) and runs it (:func:`main`); the commands live in
``commands._start`` (submit, providers, doctor, init, list), ``commands._follow`` (status, wait, logs, report),
``commands._steer`` (cancel, retry, accept-partial, collect), ``commands._tune`` (tune) and ``commands._workflow``
(workflow), with what they share in ``commands._session``. A command only reads its options, takes the
:class:`Session`, calls one service of the launcher (the functions ``ddslurm.launcher`` exports: ``dry_run``,
``follow_run``, ``retry``, ``list_runs``, ...), renders what it returns and gives the exit code; what the command
does lives in the service.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TextIO

import typer
from typer.main import get_command

from ddslurm.config.cli import help_text, short_help, styled_app
from ddslurm.launcher.cluster._slurm import Slurm
from ddslurm.launcher.commands._follow import cmd_logs, cmd_report, cmd_status, cmd_wait
from ddslurm.launcher.commands._output import (
    CommandFailed,
    ExitCode,
    emit_error,
    error_report,
    reported,
    write_json,
)
from ddslurm.launcher.commands._session import PipeClosed, Session
from ddslurm.launcher.commands._start import cmd_doctor, cmd_init, cmd_list, cmd_providers, cmd_submit
from ddslurm.launcher.commands._steer import cmd_accept_partial, cmd_cancel, cmd_collect, cmd_retry
from ddslurm.launcher.commands._tune import cmd_tune
from ddslurm.launcher.commands._workflow import cmd_workflow
from ddslurm.launcher.errors import DISK_FULL, WriteError

DISTRIBUTIONS = (
    "ddslurm-launcher",
    "ddslurm-config",
    "ddslurm-providers",
    "ddslurm-planner",
    "ddslurm-collector",
    "ddslurm-runtime",
    "data-designer",
)
"""What ``--version`` reports (``ddslurm-runtime`` is what the nodes run; it may be absent on a submit host)."""


def _versions() -> dict[str, str | None]:
    from ddslurm.runtime import installed_versions

    return installed_versions(DISTRIBUTIONS)


def _show_version(ctx: typer.Context, value: bool) -> None:
    if not value:
        return
    session = ctx.find_object(Session)
    out = session.out if session is not None else sys.stdout
    found = _versions()
    if session is not None and session.json:
        write_json(found, out)
    else:
        out.write(f"ddslurm {found['ddslurm-launcher']}\n")
        out.write("".join(f"  {name} {v or '(not installed)'}\n" for name, v in found.items()))
    raise typer.Exit(int(ExitCode.OK))


app = styled_app(
    "ddslurm",
    "Run NVIDIA Data Designer recipes on Slurm: submit a run as job arrays, follow it, steer its shards, and collect "
    "one Parquet dataset. RUN is a run directory, or a run id with --profile or DDSLURM_PROFILE. Exit codes and "
    "the JSON of every command: docs/cli.md.",
    completion=True,
)


@app.callback()
def _top(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, as every command's own --json does.")] = False,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print the versions of the ddslurm distributions and Data Designer, and exit.",
        ),
    ] = False,
) -> None:
    """Run NVIDIA Data Designer recipes on Slurm."""
    session = ctx.find_object(Session)
    if session is not None:
        session.json = session.json or as_json


PANELS: tuple[tuple[str, tuple[tuple[str, Callable[..., Any]], ...]], ...] = (
    (
        "Start a run",
        (("init", cmd_init), ("doctor", cmd_doctor), ("providers", cmd_providers), ("tune", cmd_tune),
         ("submit", cmd_submit)),
    ),
    (
        "Follow a run",
        (("status", cmd_status), ("wait", cmd_wait), ("logs", cmd_logs), ("report", cmd_report), ("list", cmd_list)),
    ),
    (
        "Steer and collect",
        (("cancel", cmd_cancel), ("retry", cmd_retry), ("accept-partial", cmd_accept_partial),
         ("collect", cmd_collect), ("workflow", cmd_workflow)),
    ),
)  # fmt: skip
"""The commands by job, each job a panel of ``ddslurm --help`` (as Data Designer's CLI groups its commands), in the
order a newcomer meets them."""

COMMANDS: tuple[tuple[str, Callable[..., Any]], ...] = tuple(c for _, commands in PANELS for c in commands)
"""Every command of the app, in the order ``ddslurm --help`` lists them."""

for _panel, _commands in PANELS:
    for _name, _command in _commands:
        # the help as the docstring says it, prose reflowed to the terminal, its Examples kept as written
        app.command(
            _name, help=help_text(_command.__doc__), short_help=short_help(_command.__doc__), rich_help_panel=_panel
        )(_command)


# --- the entry point ---


def _wants_json(args: list[str]) -> bool:
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def _quiet_exit(out: TextIO) -> int:
    """stdout was closed by its reader: point it at /dev/null so that nothing fails again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError):
        pass
    return ExitCode.CLOSED_PIPE


def _report(exc: BaseException, session: Session) -> int:
    """Print an error as ``error: ...`` (and, with --json, as a JSON object on stdout); its exit code."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # ``ddslurm`` alone: the help was printed
        return ExitCode.USAGE
    report = error_report(exc, session.command)
    usage = getattr(exc, "ctx", None)
    if isinstance(exc, typer.TyperException) and usage is not None:
        session.err.write(f"{usage.get_usage()}\nTry '{usage.command_path} --help' for help.\n")
    said = isinstance(exc, CommandFailed) and exc.said
    emit_error(report, out=session.out, err=session.err, as_json=session.json, said=said)
    return report.exit_code


def main(
    argv: list[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    slurm: Slurm | None = None,
    sleep: Callable[[float], None] = time.sleep,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """``ddslurm ARGV``; returns the exit code. ``env``, ``slurm``, ``sleep`` and the streams default to this
    process's (tests pass fakes)."""
    args = sys.argv[1:] if argv is None else list(argv)
    environ = os.environ if env is None else env
    session = Session(
        env=environ,
        slurm=slurm if slurm is not None else Slurm(env=environ),
        out=stdout if stdout is not None else sys.stdout,
        err=stderr if stderr is not None else sys.stderr,
        sleep=sleep,
        json=_wants_json(args),
    )
    command = get_command(app)
    try:
        try:
            code = command.main(args=args, prog_name="ddslurm", standalone_mode=False, obj=session)
            session.out.flush()
        except Exception as exc:
            if reported(exc):
                code = _report(exc, session)
            elif isinstance(exc, OSError) and exc.errno in DISK_FULL:  # wherever a command writes: an error
                code = _report(WriteError(f"what {session.command or 'the command'} writes", exc), session)
            else:
                raise
    except (PipeClosed, BrokenPipeError):
        return _quiet_exit(session.out)
    except SystemExit as exc:  # shell completion (--show-completion, --install-completion) exits by itself
        return exc.code if isinstance(exc.code, int) else ExitCode.OK
    return int(code) if isinstance(code, int) else ExitCode.OK
