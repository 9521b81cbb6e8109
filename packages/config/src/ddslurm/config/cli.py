"""``ddslurm-config``: check a run file or a cluster profile, a Typer app rendered with Rich as ``ddslurm`` is.

``ddslurm-config check FILE [--kind run|profile] [--json]`` loads the file as ``ddslurm`` loads it and prints it
with every default filled in: YAML (the fields in the order the file has them), or JSON with ``--json`` (keys sorted,
as ddslurm's records are). Every problem of the file is one ``error: FILE:LINE:COL: field: message`` line on stderr,
and with ``--json`` also one ``{"error": {"code", "message", "exit_code", "problems"}}`` object on stdout (as
``ddslurm``'s errors are); the exit code is then 2, as it is for a command line that does not parse.

This is the one module of ``ddslurm.config`` that imports Typer (what importing the package loads stays light: the
nodes import it too; ``tests/test_architecture.py`` and the ``.importlinter`` contract check it).
"""

from __future__ import annotations

import inspect
import re
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from typer.main import get_command

from ddslurm.config._codec import encode_pretty, load_profile, load_run_file
from ddslurm.config._yaml import dump_yaml
from ddslurm.config.errors import ConfigError, ConfigFileError

INVALID = 2
"""The exit code of a file with a problem and of a command line that does not parse (``ddslurm``'s too)."""

EXAMPLES = "Examples:"
"""The heading of the last section of a command's help: command lines, each under a ``#`` comment saying what it
does (as Data Designer's CLI shows its examples)."""

_EXAMPLES_AT = re.compile(rf"^{EXAMPLES}$", re.M)


def help_text(doc: str | None) -> str:
    """A command's docstring as its ``--help`` shows it, in ``ddslurm``'s and ``ddslurm-config``'s apps: each
    paragraph of prose on one line, which Rich wraps to the terminal's width (Typer's "rich" mode keeps a
    docstring's line breaks), then the Examples section as written, its indentation and lines kept."""
    text = inspect.cleandoc(doc or "")
    found = _EXAMPLES_AT.search(text)
    prose, examples = (text[: found.start()], text[found.start() :]) if found else (text, "")
    paragraphs = [" ".join(line.strip() for line in p.splitlines()) for p in prose.split("\n\n") if p.strip()]
    if examples and len(paragraphs) == 1:
        # Typer renders what follows the first paragraph through inspect.cleandoc, which would take the examples'
        # indentation away were their heading its first line: a blank line first keeps it (cleandoc drops it)
        examples = "\n" + examples
    return "\n\n".join([*paragraphs, *([examples.rstrip()] if examples else [])])


def examples(help: str | None) -> list[str]:
    """The command lines of a help's Examples section, as written (its ``#`` comments left out)."""
    found = _EXAMPLES_AT.search(inspect.cleandoc(help or ""))
    if found is None:
        return []
    lines = (line.strip() for line in inspect.cleandoc(help or "")[found.end() :].splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def short_help(doc: str | None) -> str:
    """A command's line in its app's command panel: the first paragraph of its help, on one line."""
    return help_text(doc).split("\n\n", 1)[0]


class Kind(StrEnum):
    """What the file is."""

    run = "run"
    profile = "profile"


def styled_app(name: str, help: str, *, completion: bool = False) -> typer.Typer:
    """A Typer app in the style of ddslurm's command lines (``ddslurm``, ``ddslurm-config``): Rich help with
    Rich markup, ``-h`` as well as ``--help``, the help when run with no arguments, tracebacks left to the caller's
    ``main`` (which reports errors as ``error:`` lines); ``completion``: its ``--install-completion`` options."""
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=completion,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
        context_settings={"help_option_names": ["-h", "--help"]},
    )


app = styled_app(
    "ddslurm-config",
    "Check the files ddslurm reads: a run file or a cluster profile, validated as ddslurm loads them and printed "
    "with every default filled in. Every field: docs/reference.md.",
)


@app.callback()
def _top() -> None:
    """Check the files ddslurm reads (a group of its own, so that ``check`` stays a command by name)."""


def _write_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    sys.stdout.flush()


def _refuse(exc: ConfigError, *, as_json: bool) -> None:
    """The file's problems as ``error:`` lines (and, with ``as_json``, as one JSON error object on stdout)."""
    sys.stderr.write("".join(f"error: {line}\n" for line in str(exc).splitlines()))
    sys.stderr.flush()
    if as_json:
        problems = [p.as_dict() for p in exc.problems] if isinstance(exc, ConfigFileError) else []
        _write_json(
            {"error": {"code": "invalid_input", "message": str(exc), "exit_code": INVALID, "problems": problems}}
        )


def check(
    file: Annotated[
        Path,
        typer.Argument(metavar="FILE", help="The run file or cluster profile (YAML).", show_default=False),
    ],
    kind: Annotated[
        Kind, typer.Option("--kind", help="What FILE is: a run file (run) or a cluster profile (profile).")
    ] = Kind.run,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print the resolved file as JSON (keys sorted); an error also as {"error": {"code", "message", '
            '"exit_code", "problems"}}.',
        ),
    ] = False,
) -> None:
    """Validate a run file or a cluster profile as ddslurm loads it and print it with every default filled in.

    A profile's relative paths are printed absolute, as a run uses them. Every problem of the file is one line,
    error: FILE:LINE:COL: field: message, and the exit code is 2.

    Examples:
        # The run file with every default filled in (YAML)
        ddslurm-config check run.yaml

        # A cluster profile, its relative paths made absolute
        ddslurm-config check profile.yaml --kind profile

        # The same as JSON, for a script
        ddslurm-config check profile.yaml --kind profile --json
    """
    try:
        loaded = load_run_file(file) if kind is Kind.run else load_profile(file)
    except ConfigError as exc:
        _refuse(exc, as_json=as_json)
        raise typer.Exit(INVALID) from None
    if as_json:
        sys.stdout.write(encode_pretty(loaded).decode())
    else:
        sys.stdout.write(dump_yaml(loaded))
    sys.stdout.flush()


app.command("check", help=help_text(check.__doc__), short_help=short_help(check.__doc__))(check)


def _wants_json(args: list[str]) -> bool:
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def main(argv: list[str] | None = None) -> int:
    """``ddslurm-config ARGV``; returns the exit code (0, or 2 for a file with a problem or a bad command line)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = get_command(app).main(args=args, prog_name="ddslurm-config", standalone_mode=False)
    except typer.TyperException as exc:  # the command line itself; ``ddslurm-config`` alone printed the help
        if type(exc).__name__ == "NoArgsIsHelpError":
            return INVALID
        usage = getattr(exc, "ctx", None)
        if usage is not None:
            sys.stderr.write(f"{usage.get_usage()}\nTry '{usage.command_path} --help' for help.\n")
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        sys.stderr.write(f"error: {message}\n")
        if _wants_json(args):
            _write_json({"error": {"code": "usage", "message": message, "exit_code": INVALID}})
        return INVALID
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # ``python -m ddslurm.config.cli``
    sys.exit(main())
