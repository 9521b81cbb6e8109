"""Values that reach Slurm and the batch script: sbatch option values (names, lists of names, constraints, memory
sizes), the paths written into ``#SBATCH`` lines, and ``extra_sbatch`` entries, each checked as the value it is.

A newline in any of them ends its #SBATCH line and starts a shell command of the batch script; a space makes sbatch
read another option. Each is checked as the value it is, at the line and column of its field."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal


def _shown(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(ch: str) -> str:
    if ch in "\n\r\x0b\x0c\x85\u2028\u2029":
        return "a newline (the rest would run as a command of the batch script)"
    if ch.isspace():
        return "whitespace (sbatch would read what follows as another option)"
    if not ch.isprintable():
        return f"a control character ({ch!r})"
    if ch == "`":
        return "a backquote"
    return repr(ch)


_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+-")
_SLURM_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]*"
SchedulerValue = Literal["name", "names", "constraint", "memory"]
_SCHEDULER_VALUES: dict[SchedulerValue, tuple[re.Pattern[str] | None, frozenset[str] | None, str]] = {
    # kind: (the whole value's form, the characters it may hold (None: any that fit in one option), the rule)
    "name": (
        re.compile(rf"\A{_SLURM_NAME}\Z"),
        _NAME_CHARS,
        "a Slurm name: letters, digits, '.', '_', '+' and '-', starting with a letter or digit",
    ),
    "names": (
        re.compile(rf"\A{_SLURM_NAME}(?:,{_SLURM_NAME})*\Z"),
        _NAME_CHARS | {","},
        "one Slurm name or several separated by commas (letters, digits, '.', '_', '+' and '-', each starting "
        "with a letter or digit)",
    ),
    "constraint": (
        re.compile(r"\A[A-Za-z0-9._+\-&|\[\]*:,()!]+\Z"),
        _NAME_CHARS | set("&|[]*:,()!"),
        "node features (letters, digits, '.', '_', '+', '-') joined by Slurm's constraint operators: & | , : ! *N, "
        "[...] and (...)",
    ),
    "memory": (None, None, "a size such as 16G or 500M"),  # the planner reads the size (parse_memory_mb)
}


def _in_one_option(ch: str) -> bool:
    return not ch.isspace() and ch.isprintable() and ch not in _SBATCH_SPECIAL


def scheduler_value_problem(value: str, kind: SchedulerValue) -> str | None:
    """Why ``value`` cannot be the sbatch option value ``kind`` (a name such as ``--account``; ``names``: a
    comma-separated list such as ``--partition``; a ``--constraint`` expression; a ``--mem`` size), or None."""
    pattern, allowed, rule = _SCHEDULER_VALUES[kind]
    if not value:
        return "is empty; leave the field out to take the default"
    bad = next((ch for ch in value if not (_in_one_option(ch) if allowed is None else ch in allowed)), None)
    if bad is not None:
        return f"{_shown(value)} has {_describe(bad)}; it must be {rule}"
    if pattern is not None and not pattern.match(value):
        return f"{_shown(value)} is not {rule}"
    return None


_PATH_REFUSED = {
    "'": "",
    '"': "",
    "\\": "",
    "#": ": sbatch reads the rest of a #SBATCH line after it as a comment",
    "%": ": sbatch expands it in log file names (%j, %A)",
    "$": ": the batch script is a shell script",
    "`": ": the batch script is a shell script",
}


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a path ddslurm writes into ``#SBATCH`` lines (``--chdir``, ``--output``) and the
    batch script, or None: sbatch splits those lines at whitespace, reads quotes, backslashes and ``#`` in them and
    expands ``%`` in log names; a newline would end the line."""
    if not value:
        return "is empty"
    bad = next((ch for ch in value if ch.isspace() or not ch.isprintable() or ch in _PATH_REFUSED), None)
    if bad is None:
        return None
    return (
        f"{_shown(value)} has {_describe(bad)}{_PATH_REFUSED.get(bad, '')}. ddslurm writes this path into #SBATCH "
        "lines and the batch script, which cannot take whitespace, control characters, quotes, backslashes, '#', "
        "'%', '$' or backquotes: choose a path without them"
    )


_SBATCH_SET_BY = {
    "account": "from submission.account (or the profile's account)",
    "array": "from shards and max_concurrent",
    "chdir": "by ddslurm (the run directory)",
    "constraint": "from submission.constraint",
    "cpus-per-task": "from submission.cpus and the deployments' server.cpus",
    "dependency": "by ddslurm (retries and the CPU stage start after the arrays before them)",
    "error": "by ddslurm (each job's log in the run's logs/ directory)",
    "gpus": "from the deployments and the profile's gpu_request",
    "gres": "from the deployments and the profile's gpu_request",
    "job-name": "from the run's name",
    "kill-on-invalid-dep": "by ddslurm (retries)",
    "mem": "from submission.memory (or the profile's memory_per_gpu)",
    "nodes": "by ddslurm (one node per allocation)",
    "ntasks": "by ddslurm (one batch task; every process is an srun step)",
    "open-mode": "by ddslurm (logs are appended to)",
    "output": "by ddslurm (each job's log in the run's logs/ directory)",
    "partition": "from submission.partition (or the profile's partition and cpu_partition)",
    "qos": "from submission.qos",
    "reservation": "from submission.reservation",
    "signal": "by ddslurm (the runtime's warning before the time limit)",
    "time": "from submission.time_limit",
}
_SBATCH_BREAKS = {
    "clusters": "status, wait and cancel ask this cluster's controller only",
    "export": "the job gets exactly the plan's variables, by name, from a scrubbed environment",
    "export-file": "the job gets exactly the plan's variables, by name, from a scrubbed environment",
    "get-user-env": "the job gets exactly the plan's variables, by name, from a scrubbed environment",
    "gid": "a job runs as the user who submits it",
    "help": "sbatch would submit nothing",
    "hold": "nothing would release the job, and wait would never return",
    "parsable": "ddslurm reads sbatch's answer itself",
    "test-only": "sbatch would submit nothing",
    "uid": "a job runs as the user who submits it",
    "usage": "sbatch would submit nothing",
    "version": "sbatch would submit nothing",
    "wait": "submit would wait until the job ends",
    "wrap": "the batch script is ddslurm's",
}
SBATCH_REFUSED = frozenset(_SBATCH_SET_BY) | frozenset(_SBATCH_BREAKS)
"""Long sbatch options an ``extra_sbatch`` item may not give (nor abbreviate, as sbatch allows): those ddslurm
sets itself, from its own fields or for the run's layout, and those that would break the run's isolation or what
ddslurm expects of sbatch."""
_SBATCH_OPTION = re.compile(r"\A--(?P<name>[A-Za-z0-9][A-Za-z0-9-]*)(?:=.*)?\Z", re.DOTALL)
_SBATCH_SPECIAL = frozenset("'\"\\#")


def sbatch_option_problem(item: str) -> str | None:
    """Why ``item`` cannot be one ``extra_sbatch`` entry, or None.

    Each entry is one long option, ``--name`` or ``--name=value``, written into its own ``#SBATCH`` line: no
    whitespace or control character (a space would add another option, a newline a shell command), no quote,
    backslash or ``#`` (sbatch reads them in ``#SBATCH`` lines), no short option (``-w NODE``: write
    ``--nodelist=NODE``), and none of :data:`SBATCH_REFUSED`, in full or abbreviated."""
    bad = next((ch for ch in item if ch.isspace() or not ch.isprintable() or ch in _SBATCH_SPECIAL), None)
    if bad is not None:
        return (
            f"{_shown(item)} has {_describe(bad)}; each extra_sbatch entry is one option, --name or --name=value, "
            "with no whitespace, control characters, quotes, backslashes or '#'"
        )
    found = _SBATCH_OPTION.match(item)
    if found is None:
        return (
            f"{_shown(item)} is not one long sbatch option: write --name or --name=value (a short option as its "
            "long form: -w NODE as --nodelist=NODE)"
        )
    name = found.group("name")
    refused = sorted(option for option in SBATCH_REFUSED if option.startswith(name))
    if not refused:
        return None
    option = name if name in SBATCH_REFUSED else refused[0]
    said = f"--{name}" if option == name else f"--{name} abbreviates --{option}, which"
    if option in _SBATCH_SET_BY:
        return f"{said} is set {_SBATCH_SET_BY[option]}; remove it"
    return f"{said} cannot be used: {_SBATCH_BREAKS[option]}"


def extra_sbatch_refusals(path: str, items: Iterable[str]) -> list[tuple[str, str]]:
    """Each entry of ``items`` (the field at ``path``) that :func:`sbatch_option_problem` refuses, with why."""
    refused = ((f"{path}[{index}]", sbatch_option_problem(item)) for index, item in enumerate(items))
    return [(at, problem) for at, problem in refused if problem is not None]


def scheduler_refusals(fields: Iterable[tuple[str, str | None, SchedulerValue]]) -> list[tuple[str, str]]:
    """Each ``(path, value, kind)`` whose value is set and :func:`scheduler_value_problem` refuses, with why."""
    refused = ((path, scheduler_value_problem(value, kind)) for path, value, kind in fields if value is not None)
    return [(path, problem) for path, problem in refused if problem is not None]
