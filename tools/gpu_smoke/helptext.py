"""The flags a ``vllm serve`` accepts, read from its own help, whichever shape its version prints.

- vLLM up to 0.10: ``vllm serve --help`` prints every option, grouped by config (``ModelConfig:``,
  ``ParallelConfig:``, ...), each option's invocation on a line indented by two spaces
  (``  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE``; a boolean as
  ``  --enable-expert-parallel, --no-enable-expert-parallel``), its help text indented further. ``--help=WORD``
  there is a keyword search (``show_filtered_argument_or_group_from_help`` in ``vllm/entrypoints/utils.py``):
  ``--help=all`` lists only the options whose names contain "all".
- Later versions (``FlexibleArgumentParser.format_help`` in ``vllm/utils``): plain ``--help`` prints a summary,
  one line per config group under ``Config Groups:`` and no option at all; ``--help=all`` prints every option as
  above (``"Use `--help=all` to show all available flags at once"``, ``vllm/entrypoints/cli/serve.py``).

So :func:`collect_help` asks for both and :func:`help_flags` takes the union of the options each answer lists:
an option line is one indented by two (or four) spaces that starts with ``-`` (:data:`_LINE`); its
invocations are separated by ``", "`` (a ``{a,b}`` choice list has no space after its commas) before the help
text, which starts after two spaces or on the next line.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_OPTION = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.+-]*")
_LINE = re.compile(r"^(  |    )(-\S.*)$")
"""An option's line: argparse indents invocations by 2 in a section (4 in a nested one), help text by 24 or more;
vLLM's epilog (the JSON tip, ``   --json-arg '{...}'``) by 3."""


def help_flags(text: str) -> set[str]:
    """Every option string an argparse help ``text`` lists (``--tensor-parallel-size``, ``-tp``,
    ``--no-enable-expert-parallel``), not the flags its prose mentions."""
    flags: set[str] = set()
    for line in text.splitlines():
        match = _LINE.match(line.rstrip())
        if match is None:
            continue
        invocation = re.split(r"\s{2,}", match.group(2), maxsplit=1)[0]
        for part in invocation.split(", "):
            token = part.split(" ", 1)[0].split("=", 1)[0]
            if _OPTION.fullmatch(token):
                flags.add(token)
    return flags


def normalise(flag: str) -> str:
    """A flag as vLLM's ``FlexibleArgumentParser`` reads it: ``--max_num_seqs=8`` is ``--max-num-seqs`` (the
    underscores of a long name before any ``.`` are dashes, the value after ``=`` is not part of it)."""
    name = flag.split("=", 1)[0]
    if name.startswith("--"):
        head, dot, tail = name[2:].partition(".")
        name = "--" + head.replace("_", "-") + dot + tail
    return name


def flags_of(argv: Sequence[str]) -> list[str]:
    """The option strings of a command line's arguments, in order, each once (``normalise``\\ d): the items that
    start with ``-`` and are not negative numbers."""
    seen: dict[str, None] = {}
    for item in argv:
        if item.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", item):
            seen.setdefault(normalise(item), None)
    return list(seen)


def missing(rendered: Iterable[str], known: set[str]) -> list[str]:
    """The rendered flags the help does not list. A ``--json-arg.key`` is vLLM's dotted form of ``--json-arg``;
    ``-O3`` is ``-O``'s attached value."""
    out = []
    for flag in rendered:
        base = flag.split(".", 1)[0]
        if flag.startswith("-O") and not flag.startswith("--"):
            base = "-O"
        if flag not in known and base not in known:
            out.append(flag)
    return out


@dataclass(frozen=True, slots=True)
class HelpAnswer:
    """What one ``vllm serve --help...`` answered: the argument, its exit status and its output."""

    argument: str
    returncode: int
    text: str


def collect_help(vllm: str, env: dict[str, str], timeout: float) -> tuple[set[str], list[HelpAnswer]]:
    """``vllm serve --help=all`` and ``vllm serve --help`` (see the module's docstring), the union of the options
    the answers that exited 0 list, and every answer (to say what went wrong when nothing was found). Building
    vLLM's parser imports torch: the first call may take half a minute."""
    answers = []
    for argument in ("--help=all", "--help"):
        try:
            done = subprocess.run(
                [vllm, "serve", argument], env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            answers.append(HelpAnswer(argument, -1, f"timed out after {exc.timeout:.0f} s"))
            continue
        answers.append(HelpAnswer(argument, done.returncode, done.stdout + done.stderr))
    flags: set[str] = set()
    for answer in answers:
        if answer.returncode == 0:
            flags |= help_flags(answer.text)
    return flags, answers
