"""What a deployment's ``server.env`` and ``server.extra_args`` may hold: no credential (stored in the run's
inputs and plan, and on command lines every user of the node can read), nothing ddslurm sets itself (the
attempt's token, the flags it sets from the deployment's fields); and the command-line reading both judge by."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from ddslurm.config._secret_policy import credential_shape

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
