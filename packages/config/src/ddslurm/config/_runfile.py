"""The run file: what a user writes to describe one run. It names no providers and no API keys."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Any, Literal

import msgspec

from ddslurm.config._base import Frozen
from ddslurm.config._convert import refuse_all
from ddslurm.config._run_config import run_config_refusals
from ddslurm.config._secret_policy import credential_shape

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
# msgspec matches patterns with re.search: anchored with \A and \Z, as ^ and $ would let "inj\n" through.
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")]
ResumeMode = Literal["never", "always", "if_possible"]
EnvName = Annotated[str, msgspec.Meta(pattern=r"\A[A-Za-z_][A-Za-z0-9_]*\Z")]

RESERVED_SERVER_ENV = frozenset({"VLLM_API_KEY", "APPTAINERENV_VLLM_API_KEY"})
"""Set by ddslurm on every server step (the attempt's own token); never taken from the run file."""

# server.env values are stored in the run's inputs and its plan, so a credential there would be written to disk.
_CREDENTIAL_WORDS = frozenset(
    {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY", "KEY",
     "AUTH", "AUTHORIZATION", "BEARER", "JWT", "COOKIE", "PAT"}
)  # fmt: skip
_NOT_A_CREDENTIAL_SUFFIXES = frozenset({"PATH", "FILE", "DIR"})
_MIN_NAMED_SECRET = 8


def server_env_secret(name: str, value: str) -> str | None:
    """Why ``name: value`` in ``server.env`` looks like a credential, or None.

    A name whose words say it holds one (``HF_TOKEN``, ``OPENAI_API_KEY``, ``DB_PASSWORD``; not
    ``TOKENIZERS_PARALLELISM`` or ``HF_TOKEN_PATH``) with a value of 8 characters or more that is not an absolute
    path, or a value that looks like a key whatever the name (the secret policy's
    :func:`~ddslurm.config.credential_shape`). The reason never repeats the value.
    """
    if named_credential(name, value):
        return "the variable's name says it holds a credential"
    return credential_shape(value, ids_ordinary=True)


def named_credential(name: str, value: str) -> bool:
    """Whether ``value``, given under ``name`` (a variable, a flag without its dashes, a header), is a credential by
    that name: a word of the name says it holds one (``HF_TOKEN``, ``--db-password``, ``auth=``; not
    ``TOKENIZERS_PARALLELISM`` or ``HF_TOKEN_PATH``) and the value has 8 characters or more and is not an absolute
    path."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.upper()) if w]
    return bool(
        len(value) >= _MIN_NAMED_SECRET
        and not PurePath(value.strip()).is_absolute()  # a place (a key file's path, a socket), not a key
        and _CREDENTIAL_WORDS.intersection(words)
        and words[-1] not in _NOT_A_CREDENTIAL_SUFFIXES
    )


RESERVED_SERVER_FLAGS = frozenset({"api-key"})
"""Engine flags that carry the attempt's own token, which ddslurm gives the server without a command line (vLLM:
``VLLM_API_KEY``); never in extra_args. The flags ddslurm sets from the deployment's fields are refused by
:func:`server_flag_set_by_ddslurm`."""


_ARG_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True, slots=True)
class ArgValue:
    """One value a command line's arguments give (:func:`arg_values`)."""

    index: int
    """The item that names the value (``--flag=value``, ``--flag``, ``name=value``), or holds it alone."""
    at: int
    """The item that holds the value (``index``, or the one after a ``--flag`` written apart from its value)."""
    flag: str
    """The flag or name as written (``--hf-token``, ``token``); "" for a value on its own."""
    value: str
    inline: bool = False
    """Written ``flag=value`` in one item."""

    @property
    def name(self) -> str:
        """The flag's name without its dashes, lower case, ``_`` read as ``-`` (``hf-token``)."""
        return self.flag.lstrip("-").replace("_", "-").lower()


def arg_values(args: Sequence[str]) -> Iterator[ArgValue]:
    """Every value the command-line arguments ``args`` give, with the flag or name it is given under: ``--flag=value``
    and ``name=value`` are split at the first ``=``; ``--flag value`` gives ``value`` to ``--flag`` (a flag followed by
    another flag or by nothing: the value ""), and ``value`` is also given on its own; any other item is a value on its
    own. Both ``server.extra_args`` and an MCP server's ``args`` are judged from these."""
    for index, item in enumerate(args):
        head, eq, tail = item.partition("=")
        if item.startswith("-"):
            if eq:
                yield ArgValue(index, index, head, tail, inline=True)
                continue
            following = args[index + 1] if index + 1 < len(args) else None
            if following is None or following.startswith("-"):
                yield ArgValue(index, index, item, "")
            else:
                yield ArgValue(index, index + 1, item, following)
        elif eq and _ARG_NAME.match(head):
            yield ArgValue(index, index, head, tail, inline=True)
        else:
            yield ArgValue(index, index, "", item)


def server_args_secret(args: Sequence[str]) -> tuple[int, str] | None:
    """The index of the first item of ``server.extra_args`` that carries a credential, and why; or None.

    ``--api-key`` in any form (:data:`RESERVED_SERVER_FLAGS`); a flag whose name says it takes a credential
    (``--hf-token``, ``--token``, ``--db-password``; the words of :func:`server_env_secret`) with a value of 8
    characters or more, inline (``--hf-token=...``) or as the next item; any value that looks like a key
    (:func:`~ddslurm.config.credential_shape`). A bare ``--hf-token`` (vLLM then reads ``HF_TOKEN`` or the node's
    login) is kept. The index is the item that holds the value, and the reason never repeats it."""
    stored = (
        "; server.extra_args is written to the run's inputs and plan, the server logs and the command lines every "
        "user of the node can read. "
    )
    advice = stored + "Pass it in a variable instead: export it in the shell you submit from and list it under "
    advice += "server.env_from (the server steps get it in their environment)"
    for arg in arg_values(args):
        if not arg.flag:
            why = credential_shape(arg.value, ids_ordinary=True)
            if why is not None:
                return arg.index, f"looks like a secret ({why}){advice}"
            continue
        flag, name = arg.flag, arg.name
        if name in RESERVED_SERVER_FLAGS and flag.startswith("-"):
            return arg.index, (
                f"{flag} is set by ddslurm itself (each attempt's own token, given to the server without a command "
                "line); remove it"
            )
        if named_credential(name, arg.value):
            named = f"the value of {flag} looks like a secret (the flag's name says it takes a credential)"
            if name == "hf-token":  # vLLM (huggingface_hub) reads HF_TOKEN from its environment
                hf = "Export HF_TOKEN in the shell you submit from; list it under server.env_from"
                return arg.at, f"{named}{stored}{hf}"
            return arg.at, named + advice
        why = credential_shape(arg.value, ids_ordinary=True) if arg.inline else None
        if why is not None:
            return arg.index, f"the value of {flag} looks like a secret ({why}){advice}"
    return None


_LISTEN = "where each replica listens: a socket or a loopback port; set server.port for fixed ports"
_RANKS = "on each rank of a replica that spans nodes, from tensor_parallel, pipeline_parallel and data_parallel"
_VLLM_SET_FLAGS: dict[tuple[str, ...], str] = {
    ("--tensor-parallel-size", "-tp"): "tensor_parallel",
    ("--pipeline-parallel-size", "-pp"): "pipeline_parallel",
    ("--data-parallel-size", "-dp"): "data_parallel",
    ("--data-parallel-size-local", "-dpl"): _RANKS,
    ("--data-parallel-start-rank", "-dpr"): _RANKS,
    ("--data-parallel-address", "-dpa"): _RANKS,
    ("--data-parallel-rpc-port", "-dpp"): _RANKS,
    ("--enable-expert-parallel", "-ep"): "expert_parallel",
    ("--nnodes", "-n"): _RANKS,
    ("--node-rank", "-r"): _RANKS,
    ("--master-addr",): _RANKS,
    ("--master-port",): _RANKS,
    ("--headless",): _RANKS,
    ("--uds",): _LISTEN,
    ("--host",): _LISTEN,
    ("--port",): _LISTEN,
    ("--served-model-name",): "served_model_name",
}
"""``vllm serve`` flags ddslurm sets itself, with their aliases (``add_cli_args`` of ``EngineArgs`` in
``vllm/engine/arg_utils.py`` and ``vllm/entrypoints/openai/cli_args.py`` of vllm-project/vllm), and the field to
set instead (or why none)."""
_SGLANG_SET_FLAGS: dict[tuple[str, ...], str] = {
    ("--tensor-parallel-size", "--tp-size"): "tensor_parallel",
    ("--pipeline-parallel-size", "--pp-size"): "pipeline_parallel",
    ("--data-parallel-size", "--dp-size"): "data_parallel",
    ("--expert-parallel-size", "--ep-size", "--ep"): "expert_parallel",
    ("--nnodes",): _RANKS,
    ("--node-rank",): _RANKS,
    ("--dist-init-addr", "--nccl-init-addr"): _RANKS,
    ("--host",): _LISTEN,
    ("--port",): _LISTEN,
    ("--model-path", "--model"): "model",
    ("--served-model-name",): "served_model_name",
    ("--api-key",): "each attempt's own token",
}
"""``python -m sglang.launch_server`` flags ddslurm sets itself, with their aliases (``ServerArgs.add_cli_args`` in
``python/sglang/srt/server_args.py`` of sgl-project/sglang), and the field to set instead (or why none)."""


def server_flag_set_by_ddslurm(engine: str, args: Sequence[str]) -> tuple[int, str] | None:
    """The index of the first item of ``server.extra_args`` that is a flag ddslurm sets itself for ``engine``
    (``vllm`` or ``sglang``), and what to do instead; or None.

    Both engines parse with argparse, which takes a unique prefix of a long flag (``--tp`` for ``--tp-size``) and
    ``--flag=value``; vLLM's parser also reads ``_`` as ``-``. So a long flag is refused when it is one of these or
    an abbreviation of one (at least two letters after ``--``), a short alias (``-tp``) when it is exactly one."""
    table = _VLLM_SET_FLAGS if engine == "vllm" else _SGLANG_SET_FLAGS
    program = "vllm serve" if engine == "vllm" else "sglang.launch_server"
    for index, item in enumerate(args):
        if not item.startswith("-"):
            continue
        flag = item.partition("=")[0]
        name = flag.replace("_", "-") if engine == "vllm" else flag
        for aliases, instead in table.items():
            long_names = [a for a in aliases if a.startswith("--")]
            hit = name in aliases or (
                name.startswith("--") and len(name) >= 4 and any(a.startswith(name) for a in long_names)
            )
            if not hit:
                continue
            meant = aliases[0] if name in aliases else next(a for a in long_names if a.startswith(name))
            shown = flag if flag == meant else f"{flag} ({meant})"
            if " " in instead:
                return index, f"{shown}: ddslurm sets this {program} flag itself ({instead}); remove it"
            return (
                index,
                f"{shown}: ddslurm sets this {program} flag itself from the deployment's {instead}; "
                f"set {instead} instead",
            )
    return None


# --- values that reach Slurm and the batch script ---------------------------------------------------------------
# A newline in any of them ends its #SBATCH line and starts a shell command of the batch script; a space makes sbatch
# read another option. Each is checked as the value it is, at the line and column of its field.


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


DD_BUILDER_FUNCTION = "load_config_builder"
"""The function Data Designer's own CLI calls in a Python config module (``data-designer create build.py``;
``USER_MODULE_FUNC_NAME`` in ``data_designer/cli/utils/config_loader.py``): a run file's ``recipe: build.py`` means
this function of ``build.py``, as it does for Data Designer."""

RecipeKind = Literal["config", "script", "module"]
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class RecipeRef:
    """What a run file's ``recipe`` names: a Data Designer config file (``recipe.yaml``, YAML or JSON), a builder
    script and its function (``build.py``, ``build.py:make``), or an importable module's function
    (``package.module:make``). Paths are relative to the run file."""

    kind: RecipeKind
    target: str
    """The file (config, script) or the dotted module name."""
    function: str | None = None
    """The function that returns the config (scripts and modules); None for config files."""

    def __str__(self) -> str:
        return self.target if self.function is None else f"{self.target}:{self.function}"


def parse_recipe_ref(text: str) -> RecipeRef:
    """The reference a run file's ``recipe`` holds; ValueError says why a reference cannot be one.

    ``*.py`` is a builder script whose :data:`DD_BUILDER_FUNCTION` is called (Data Designer's convention);
    ``FILE.py:NAME`` calls ``NAME`` instead; ``a.b.c:NAME`` imports module ``a.b.c`` and calls ``NAME``;
    anything else is a config file."""
    value = text.strip()
    if not value:
        raise ValueError("names no recipe (a Data Designer config file, a builder script build.py, or module:function)")
    head, sep, function = value.rpartition(":")
    if sep and head and function.isidentifier():
        if head.lower().endswith(".py"):
            return RecipeRef("script", head, function)
        if head.lower().endswith(_CONFIG_SUFFIXES):
            raise ValueError(
                f"{value!r}: a ':{function}' suffix names the function of a Python builder script "
                f"(build.py:{function}) or module (package.module:{function}); a config file ({head}) has none"
            )
        if all(part.isidentifier() for part in head.split(".")):
            return RecipeRef("module", head, function)
    if value.lower().endswith(".py"):
        return RecipeRef("script", value, DD_BUILDER_FUNCTION)
    return RecipeRef("config", value)


class ServerSpec(Frozen, frozen=True, kw_only=True):
    """How each vLLM server process of a deployment is started."""

    port: Annotated[int, msgspec.Meta(ge=1024, le=65535)] | None = None
    """First port; replica i listens on port + i. None: planned per job, so jobs sharing a node never collide."""
    startup_timeout: PositiveInt = 1800
    """Seconds a replica may take to answer /health with 200 before the attempt fails."""
    restarts: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    """Times a replica that dies (on one node) is started again inside its allocation, on the same GPUs and
    listener, before its allocation gives up; meanwhile its proxy holds or routes around the requests, and the
    shards' clients resume their batches. Each restart loads the model again (GPU time the report counts)."""
    cpus: PositiveInt = 4
    """CPUs of each replica's step (tokenisation, scheduling, the API server)."""
    extra_args: tuple[str, ...] = ()
    """Passed to the engine (``vllm serve``, ``sglang.launch_server``) verbatim, after the arguments ddslurm sets;
    the flags ddslurm sets itself (parallel sizes, multi-node rendezvous, where it listens, the model and its
    served name) are refused, naming the field to set instead. Stored in the run's inputs and plan and
    on command lines, so credentials are refused (:func:`server_args_secret`: ``--api-key``, which ddslurm sets,
    ``--hf-token VALUE`` and the like, and any value the secret policy, ``credential_shape``, takes for a key):
    name them in ``env_from`` instead."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra environment for the server steps. Stored in the run's inputs and plan, so secrets are refused
    (:func:`server_env_secret`: a name that says it holds one, or a value the secret policy, ``credential_shape``,
    takes for a key): name them in ``env_from`` instead."""
    env_from: tuple[EnvName, ...] = ()
    """Variables of the submitting shell given to the server steps only (a gated model's ``HF_TOKEN``), by name:
    checked set at submit, exported to the job by name like API keys, never written to any file, never given to
    the proxy or the Data Designer client."""

    def __post_init__(self) -> None:
        for name, value in self.env.items():
            if name in RESERVED_SERVER_ENV:
                raise ValueError(f"env.{name}: set by ddslurm itself (each attempt's own token); remove it")
            why = server_env_secret(name, value)
            if why is not None:
                raise ValueError(
                    f"env.{name}: looks like a secret ({why}); server.env is written to the run's inputs and plan. "
                    f"Export {name} in the shell you submit from and list it under server.env_from instead"
                )
        seen: set[str] = set()
        for name in self.env_from:
            if name in RESERVED_SERVER_ENV:
                raise ValueError(f"env_from: {name} is set by ddslurm itself (each attempt's own token)")
            if name in seen:
                raise ValueError(f"env_from: {name} is listed twice")
            if name in self.env:
                raise ValueError(f"env_from: {name} is also set in env; keep one")
            seen.add(name)


Engine = Literal["vllm", "sglang"]
"""The serving engines ddslurm starts: vLLM (``vllm serve``) and SGLang (``python -m sglang.launch_server``)."""


class Deployment(Frozen, frozen=True, kw_only=True):
    """A model deployment started inside the job (vLLM or SGLang), serving one model alias of the recipe.

    One replica holds ``tensor_parallel x pipeline_parallel x data_parallel`` GPUs. A replica that needs more GPUs
    than a node has spans ``GPUs / gpus_per_node`` whole nodes (one server step per node: the leader, which serves
    the API, and headless followers); tensor parallel never crosses a node."""

    model_alias: str
    """An alias the recipe's columns use; each alias is deployed at most once."""
    model: str
    """What the engine loads: a Hugging Face hub id or a path on the nodes."""
    served_model_name: str | None = None
    """The model name requests use. None: ``model``."""
    engine: Engine = "vllm"
    """``vllm`` or ``sglang`` (the profile's ``vllm_executable``/``vllm_image`` or ``sglang_executable``/
    ``sglang_image``)."""
    replicas: PositiveInt | Literal["auto"] = "auto"
    """Server processes (each a whole engine: its ranks, its API) behind the alias's one endpoint, the balancing
    proxy, in each allocation. ``auto``: 1, or with the run file's ``gpus`` as many as the planner's cost model
    chooses."""
    tensor_parallel: PositiveInt = 1
    """GPUs of one tensor-parallel group (vLLM ``--tensor-parallel-size``, SGLang ``--tp-size``); at most a node's
    GPUs."""
    pipeline_parallel: PositiveInt = 1
    """Pipeline stages of one replica (vLLM ``--pipeline-parallel-size``, SGLang ``--pp-size``), each a
    tensor-parallel group; the stages of a replica bigger than a node run on several nodes."""
    data_parallel: PositiveInt = 1
    """The engine's own data-parallel ranks inside one replica (vLLM ``--data-parallel-size``, SGLang
    ``--dp-size``): one API, requests spread over the ranks by the engine; ``--max-num-seqs`` applies per rank."""
    expert_parallel: bool = False
    """Shard a mixture-of-experts model's experts over the replica's ranks instead of its tensor-parallel groups
    (vLLM ``--enable-expert-parallel``, SGLang ``--ep-size`` = ``tensor_parallel``)."""
    server: ServerSpec = msgspec.field(default_factory=ServerSpec)
    """How each replica is started (below)."""

    @property
    def served_name(self) -> str:
        """The model name the servers answer to and the alias's requests name: ``served_model_name``, else
        ``model`` (the plan's ``served_model_name``, the snapshot's model of the alias)."""
        return self.served_model_name or self.model


class Submission(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the generation jobs. ``None`` means "take the profile's default"."""

    account: str | None = None
    """``--account``: a Slurm name (letters, digits, ``.``, ``_``, ``+``, ``-``). None: the profile's."""
    partition: str | None = None
    """``--partition``: a Slurm name, or several separated by commas. None: the profile's ``partition`` (its
    ``cpu_partition`` for hosted-only runs)."""
    qos: str | None = None
    """``--qos``: a Slurm name."""
    time_limit: str | int = "01:00:00"
    """``--time`` of each generation job: ``MM``, ``HH:MM:SS`` or ``D-HH:MM:SS`` (a bare number is minutes;
    rounded up to whole minutes); at least 2 minutes."""
    memory: str | None = None
    """``--mem`` per node (``16G``). None: the profile's ``memory_per_gpu`` x GPUs, else the site default."""
    cpus: PositiveInt = 2
    """CPUs of the Data Designer client step; server and proxy CPUs are added to the job's request."""
    constraint: str | None = None
    """``--constraint``: node features joined by Slurm's operators (``intel&gpu``, ``[rack1|rack2]``,
    ``[a*2&b*4]``); no whitespace."""
    reservation: str | None = None
    """``--reservation``: a Slurm name, or several separated by commas."""
    extra_sbatch: tuple[str, ...] = ()
    """Added to the batch script as ``#SBATCH`` lines, one long option each: ``--name`` or ``--name=value``, without
    whitespace, quotes, backslashes or ``#``. Options ddslurm sets itself or that would break the run (``--output``,
    ``--chdir``, ``--export``, ``--array``, ``--hold``, ...: the list is in the run-file guide) are refused, abbreviated
    too."""


class HostedLimit(Frozen, frozen=True, kw_only=True):
    """What the run may use of one hosted provider's key (``hosted_limits.<provider>``): a cap for a key shared with
    other work, below what the provider admits. The run's clients share one budget of each key and learn its
    limits from the provider's answers (docs/providers.md#one-rate-budget-per-key); a stated cap bounds what they
    learn. Unset fields: learned only."""

    in_flight: PositiveInt | None = None
    """Requests at once, all the run's clients together."""
    requests_per_minute: PositiveInt | None = None
    """Requests a minute, all the run's clients together."""
    tokens_per_minute: PositiveInt | None = None
    """Input and output tokens a minute, all the run's clients together (turned into requests a minute by what an
    answer has cost so far)."""


class Collection(Frozen, frozen=True, kw_only=True):
    """Scheduler settings of the collection job."""

    partition: str | None = None
    """``--partition`` of the collection job (as ``submission.partition``). None: the profile's ``cpu_partition``."""
    memory: str | None = None
    """``--mem`` of the collection job. None: the site default."""
    time_limit: str | int = "00:30:00"
    """``--time`` of the collection job (as ``submission.time_limit``)."""
    cpus: PositiveInt = 1
    """``--cpus-per-task`` of the collection job."""


class RunFile(Frozen, frozen=True, kw_only=True):
    """Top level of ``run.yaml``."""

    name: Name
    """Letters, digits, ``.``, ``_`` and ``-``; prefixes the run id."""
    recipe: str
    """A Data Designer config file (YAML or JSON, as ``DataDesignerConfigBuilder.write_config`` writes it), a
    builder script (``build.py``, ``build.py:make``) or a module's function (``package.module:make``) that returns
    one. Paths are relative to the run file."""
    num_records: PositiveInt
    """Records in the final dataset."""
    shards: PositiveInt = 1
    """Contiguous record ranges, each generated and published on its own (one array task each by default)."""
    resume: ResumeMode = "if_possible"
    """How a new attempt reuses an earlier attempt's completed batches: ``if_possible`` (when there are any),
    ``always`` or ``never``."""
    buffer_size: PositiveInt | None = None
    """Records per Data Designer batch: one Parquet file each, and the unit a shard saves its work in (a cancel, a
    time limit or a crash loses at most the batch in progress). Unset: the planner chooses it, so that each shard
    saves its work at least 5 times and at least every 5 minutes of its predicted generation, at most Data
    Designer's default 1000 (docs/run-files.md#checkpoints)."""
    max_concurrent: PositiveInt | None = None
    """At most this many array tasks run at once (the array's ``%N`` throttle)."""
    allocations: PositiveInt | Literal["auto"] = "auto"
    """Jobs that generate the shards. Fewer allocations than shards makes each one pull shards from the run until
    none is left, its model servers started once and kept warm across them. ``auto``: one task per shard for
    hosted-only runs; with deployments, the planner's cost model chooses (the fewest GPU-hours within ``gpus`` and
    ``deadline``; docs/run-files.md)."""
    client_workers: PositiveInt | Literal["auto"] = "auto"
    """Data Designer client processes per allocation, each on its own shard (runs with deployments). ``auto``: the
    planner's cost model chooses, at most the allocation's replicas and ``submission.cpus`` (the client CPUs are
    shared among them)."""
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 0
    """Retry arrays submitted with the run, each after the previous one if any of its shards failed."""
    client_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 1
    """Inside an allocation: rerun a failed generation step this often, servers kept, resuming its batches."""
    provider_wait: Annotated[int, msgspec.Meta(ge=0, le=3600)] = 300
    """Seconds a provider that answers 429 or 5xx, refuses connections or times out (an outage, a rate limit) is
    waited out inside an attempt, with backoff and jitter, before the attempt fails ``provider_unavailable``."""
    max_empty_outputs: Annotated[int, msgspec.Meta(ge=0)] | None = 0
    """Empty or null values each LLM column of a shard may hold before the shard's attempt fails with
    ``empty_outputs`` (an endpoint that answered HTTP 200 without content). None: not checked."""
    gpus: PositiveInt | None = None
    """The most GPUs the run may hold at once. With it, the planner's cost model picks the allocations, the
    replicas of each ``replicas: auto`` deployment, the client workers and the stages that cost the fewest
    GPU-hours within it (and within ``deadline``); fields set to numbers stay as set. None: the run's own fields
    (``allocations: auto`` chooses by the same cost model, within the GPUs the old rule of one allocation per
    ``client_workers`` shards would hold)."""
    deadline: str | int | None = None
    """The latest the run's generation should end after its first allocation starts, as ``submission.time_limit``
    (``HH:MM:SS``, minutes, ``D-HH``...): the cost model keeps layouts predicted to end by then. None: none."""
    stages: Literal["auto", "single"] = "auto"
    """``auto``: a run with deployments whose recipe splits into a GPU stage (the local models' columns and what
    they read) and a CPU stage (the hosted-only columns) runs the CPU stage in CPU-only allocations after the GPU
    stage, so the GPUs are released when their columns are done. ``single``: one stage in the GPU allocations."""
    deployments: tuple[Deployment, ...] = ()
    """vLLM servers started inside each job, one entry per model alias. Empty: a hosted-only run (CPU jobs)."""
    hosted_limits: dict[Name, HostedLimit] = msgspec.field(default_factory=dict)
    """Per hosted provider (its name in Data Designer's ``model_providers.yaml`` or the recipe), a cap on what the
    run uses of its key (:class:`HostedLimit`); the provider must be one the run's hosted aliases use."""
    prices: str | None = None
    """A price file (docs/providers.md#prices), relative to the run file: dollars per million input and output
    tokens of hosted models and per GPU-hour of partitions, for the bill, status and report. None: no dollars."""
    submission: Submission = msgspec.field(default_factory=Submission)
    """Scheduler settings of the generation jobs."""
    collection: Collection = msgspec.field(default_factory=Collection)
    """Scheduler settings of the collection job."""
    run_config: dict[str, Any] = msgspec.field(default_factory=dict)
    """Data Designer's own ``RunConfig`` fields (``shutdown_error_rate``, ``max_in_flight_tasks``,
    ``jinja_rendering_engine``, ``request_admission``, ...), set on every client step of the run; checked at submit by
    the Data Designer of ``python_env``, which the nodes run. The fields ddslurm sets itself (``buffer_size``: the run
    file's own; ``display_tui``, ``otel_metrics_port``, ``preserve_dropped_columns``, ``async_trace``) are refused,
    saying why (docs/run-files.md#data-designers-runconfig-run_config)."""

    def __post_init__(self) -> None:
        # Here rather than in Submission or ServerSpec: only the top level knows each field's path in the file.
        sub, col = self.submission, self.collection
        refusals: list[tuple[str, str]] = []
        try:
            parse_recipe_ref(self.recipe)
        except ValueError as exc:
            refusals.append(("recipe", str(exc)))
        refusals += scheduler_refusals(
            (
                ("submission.account", sub.account, "name"),
                ("submission.partition", sub.partition, "names"),
                ("submission.qos", sub.qos, "name"),
                ("submission.memory", sub.memory, "memory"),
                ("submission.constraint", sub.constraint, "constraint"),
                ("submission.reservation", sub.reservation, "names"),
                ("collection.partition", col.partition, "names"),
                ("collection.memory", col.memory, "memory"),
            )
        )
        refusals += extra_sbatch_refusals("submission.extra_sbatch", sub.extra_sbatch)
        for index, deployment in enumerate(self.deployments):
            found = server_args_secret(deployment.server.extra_args)
            if found is not None:
                refusals.append((f"deployments[{index}].server.extra_args[{found[0]}]", found[1]))
            set_here = server_flag_set_by_ddslurm(deployment.engine, deployment.server.extra_args)
            if set_here is not None and (found is None or found[0] != set_here[0]):
                refusals.append((f"deployments[{index}].server.extra_args[{set_here[0]}]", set_here[1]))
        refusals += run_config_refusals(self.run_config)
        refuse_all(refusals)
