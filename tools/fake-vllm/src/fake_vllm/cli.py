"""``fake-vllm serve MODEL [vLLM flags] [--fake-* flags]``: parse a ``vllm serve`` command line.

vLLM flags the stand-in does not model are accepted and ignored (logged once). An unknown ``--flag`` takes the
next token as its value unless that token starts with ``-`` or the flag looks boolean (``--enable-*``,
``--disable-*``, ``--no-*`` and a few known switches such as ``--trust-remote-code``); so, as with
``vllm serve``, put MODEL first. Every ``--fake-*`` flag can also be set by its ``FAKE_VLLM_*`` environment
variable; the flag wins over the variable.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fake_vllm.settings import Settings
from fake_vllm.version import version_string

_BOOLEAN_SWITCHES = frozenset(
    {
        "--trust-remote-code",
        "--enforce-eager",
        "--skip-tokenizer-init",
        "--uvicorn-access-log",
        "--headless",
        "--async-scheduling",
        "--use-v2-block-manager",
        "--worker-use-ray",
        "--allow-credentials",
        "--return-tokens-as-token-ids",
    }
)
_BOOLEAN_PREFIXES = ("--enable-", "--disable-", "--no-")


@dataclass(frozen=True)
class FakeOption:
    """One stand-in behaviour: a ``--fake-*`` flag, its environment variable, its type and default."""

    flag: str
    env: str
    dest: str
    kind: str  # "seconds", "count", "rate", "int", "bool", "path", "regex"
    default: Any
    help: str


FAKE_OPTIONS: tuple[FakeOption, ...] = (
    FakeOption(
        "--fake-startup-delay", "FAKE_VLLM_STARTUP_DELAY", "startup_delay", "seconds", 0.0,
        "seconds before /health turns 200 (503 until then, like a loading server)",
    ),
    FakeOption(
        "--fake-latency", "FAKE_VLLM_LATENCY", "latency", "seconds", 0.0,
        "base seconds per chat request (see --fake-capacity for how it grows with load)",
    ),
    FakeOption(
        "--fake-capacity", "FAKE_VLLM_CAPACITY", "capacity", "count", 0,
        "at most N chat requests processed at once, the rest queue; latency*(1+k/N) with k others running; "
        "0 = unlimited",
    ),
    FakeOption(
        "--fake-crash-after", "FAKE_VLLM_CRASH_AFTER", "crash_after", "count", None,
        "serve N chat requests, then exit with status 1 abruptly when request N+1 arrives",
    ),
    FakeOption(
        "--fake-error-rate", "FAKE_VLLM_ERROR_RATE", "error_rate", "rate", 0.0,
        "fraction of chat requests answered with HTTP 500",
    ),
    FakeOption(
        "--fake-429-rate", "FAKE_VLLM_429_RATE", "rate_429", "rate", 0.0,
        "fraction of chat requests answered with HTTP 429",
    ),
    FakeOption(
        "--fake-no-choices-rate", "FAKE_VLLM_NO_CHOICES_RATE", "no_choices_rate", "rate", 0.0,
        "fraction of chat requests answered with HTTP 200 and a body without 'choices'",
    ),
    FakeOption(
        "--fake-seed", "FAKE_VLLM_SEED", "seed", "int", 0,
        "seed of the 500/429/no-choices draws (one draw per chat request, in arrival order)",
    ),
    FakeOption(
        "--fake-never-healthy", "FAKE_VLLM_NEVER_HEALTHY", "never_healthy", "bool", False,
        "never finish loading: /health and /v1/* stay 503",
    ),
    FakeOption(
        "--fake-fail-start", "FAKE_VLLM_FAIL_START", "fail_start", "bool", False,
        "exit with status 1 after the start-up delay, without ever listening",
    ),
    FakeOption(
        "--fake-request-log", "FAKE_VLLM_REQUEST_LOG", "request_log", "path", None,
        "append one JSON line per request (never the key or the Authorization header)",
    ),
    FakeOption(
        "--fake-log-match", "FAKE_VLLM_LOG_MATCH", "log_match", "regex", None,
        "the request log records, as 'match', the first match of this regex (its group 1 if any) in a chat "
        "request's messages: which record (or shard) a request came from",
    ),
)  # fmt: skip


_CAPACITY_ENV = next(option.env for option in FAKE_OPTIONS if option.dest == "capacity")


class UsageError(ValueError):
    """A bad command line or environment value."""


def _regex(text: str) -> str:
    re.compile(text)  # re.error is a ValueError: reported like any bad value
    return text


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected seconds >= 0, got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected an integer >= 0, got {text!r}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a rate between 0 and 1, got {text!r}")
    return value


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {text!r}")


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "seconds": _seconds,
    "count": _count,
    "rate": _rate,
    "int": int,
    "bool": _boolean,
    "path": Path,
    "regex": _regex,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser for the arguments after ``serve`` (unknown vLLM flags are removed beforehand)."""
    parser = argparse.ArgumentParser(
        prog="fake-vllm serve",
        description="A vLLM stand-in speaking the OpenAI API. Unknown vLLM flags are accepted and ignored.",
        allow_abbrev=False,
    )
    parser.add_argument("model_tag", nargs="?", metavar="MODEL", help="model name or path, as for vllm serve")
    parser.add_argument("--model", dest="model_flag", metavar="MODEL", help="alternative to the positional MODEL")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--uds",
        metavar="PATH",
        help="Unix domain socket path. If set, host and port arguments are ignored. (as in vLLM: the path must not "
        "exist; nothing removes the socket file afterwards)",
    )
    parser.add_argument("--served-model-name", nargs="+", metavar="NAME", help="names the API answers to")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N")
    parser.add_argument(
        "--max-num-seqs",
        metavar="N",
        help="sequences run at once, the rest queue (as in vLLM): the capacity unless --fake-capacity is given",
    )
    parser.add_argument(
        "--api-key", nargs="+", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/* (or VLLM_API_KEY)"
    )
    for option in FAKE_OPTIONS:
        if option.kind == "bool":
            parser.add_argument(option.flag, dest=option.dest, action="store_const", const=True, help=option.help)
        else:
            parser.add_argument(option.flag, dest=option.dest, metavar="VALUE", help=f"{option.help} [{option.env}]")
    return parser


def _known_arity(parser: argparse.ArgumentParser) -> dict[str, int]:
    """How many values each known option string takes: 0, 1, or -1 for one or more."""
    arity: dict[str, int] = {}
    for action in parser._actions:  # the public API has no way to list option strings
        for name in action.option_strings:
            if action.nargs == 0:
                arity[name] = 0
            elif action.nargs == "+":
                arity[name] = -1
            else:
                arity[name] = 1
    return arity


def _is_value(token: str) -> bool:
    if not token.startswith("-"):
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def _looks_boolean(flag: str) -> bool:
    return flag in _BOOLEAN_SWITCHES or flag.startswith(_BOOLEAN_PREFIXES)


def split_known(args: Sequence[str], arity: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """Split ``args`` into what the parser knows and the unknown vLLM flags (with their values)."""
    known: list[str] = []
    ignored: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if token == "--":
            known.extend(args[index - 1 :])
            break
        if _is_value(token) or token in ("-h", "--help"):
            known.append(token)
            continue
        name, has_inline_value, _ = token.partition("=")
        if name in arity:
            known.append(token)
            wanted = 0 if has_inline_value else arity[name]
            while wanted != 0 and index < len(args) and _is_value(args[index]):
                known.append(args[index])
                index += 1
                wanted -= 1
            continue
        ignored.append(token)
        if not has_inline_value and not _looks_boolean(name) and index < len(args) and _is_value(args[index]):
            ignored.append(args[index])
            index += 1
    return known, ignored


def _fake_value(option: FakeOption, given: Any, environ: Mapping[str, str]) -> Any:
    raw: str | None
    if given is True and option.kind == "bool":
        return True
    if given is not None:
        raw, source = str(given), option.flag
    elif environ.get(option.env) is not None:
        raw, source = environ[option.env], option.env
    else:
        return option.default
    try:
        return _CONVERTERS[option.kind](raw)
    except ValueError as exc:
        raise UsageError(f"{source}: {exc}") from None


def parse_serve_args(args: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Build the settings from the arguments after ``serve`` and the environment (for ``FAKE_VLLM_*`` and
    ``VLLM_API_KEY``). Raises ``UsageError``; ``-h`` and argparse's own errors raise ``SystemExit``."""
    parser = build_parser()
    known, ignored = split_known(args, _known_arity(parser))
    namespace = parser.parse_args(known)
    model = namespace.model_flag or namespace.model_tag
    if not model:
        raise UsageError("a MODEL is required: fake-vllm serve MODEL [options]")
    if namespace.model_flag and namespace.model_tag and namespace.model_flag != namespace.model_tag:
        raise UsageError(f"MODEL given twice: {namespace.model_tag!r} and --model {namespace.model_flag!r}")
    if namespace.uds is not None and not namespace.uds:
        raise UsageError("--uds: expected a socket path, got ''")
    if namespace.uds is None and not 0 < namespace.port < 65536:
        raise UsageError(f"--port: {namespace.port} is not a valid port")
    if namespace.tensor_parallel_size < 1:
        raise UsageError("--tensor-parallel-size must be at least 1")
    api_keys = tuple(namespace.api_key or ())
    if not api_keys and environ.get("VLLM_API_KEY"):
        api_keys = (environ["VLLM_API_KEY"],)
    fake = {option.dest: _fake_value(option, getattr(namespace, option.dest), environ) for option in FAKE_OPTIONS}
    max_num_seqs = None
    if namespace.max_num_seqs is not None:
        try:
            max_num_seqs = int(namespace.max_num_seqs)
        except ValueError:
            max_num_seqs = 0
        if max_num_seqs < 1:
            raise UsageError(f"--max-num-seqs: expected an integer >= 1, got {namespace.max_num_seqs!r}")
        # vLLM runs at most max_num_seqs sequences at once and queues the rest: that is the stand-in's capacity,
        # unless --fake-capacity (or its variable) says otherwise.
        if namespace.capacity is None and environ.get(_CAPACITY_ENV) is None:
            fake["capacity"] = max_num_seqs
    if fake["error_rate"] + fake["rate_429"] + fake["no_choices_rate"] > 1.0:
        raise UsageError("--fake-error-rate, --fake-429-rate and --fake-no-choices-rate must not sum above 1")
    return Settings(
        model=model,
        served_model_names=tuple(namespace.served_model_name or (model,)),
        host=namespace.host,
        port=namespace.port,
        uds=None if namespace.uds is None else Path(namespace.uds),
        api_keys=api_keys,
        tensor_parallel_size=namespace.tensor_parallel_size,
        max_num_seqs=max_num_seqs,
        ignored_args=tuple(ignored),
        **fake,
    )


_USAGE = """usage: fake-vllm serve MODEL [--host HOST] [--port PORT | --uds PATH] [--served-model-name NAME ...]
                       [--tensor-parallel-size N] [--max-num-seqs N] [--api-key KEY] [--fake-* ...]
                       [other vLLM flags, ignored]
       fake-vllm --version
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fake-vllm`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("--version", "-v", "version"):
        print(version_string())
        return 0
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_USAGE)
        return 0 if args else 2
    if args[0] != "serve":
        sys.stderr.write(_USAGE + f"fake-vllm: error: unknown command {args[0]!r} (only 'serve' exists)\n")
        return 2
    try:
        settings = parse_serve_args(args[1:], os.environ)
    except UsageError as exc:
        sys.stderr.write(f"fake-vllm serve: error: {exc}\n")
        return 2
    from fake_vllm.server import serve  # deferred: uvicorn and starlette load only to serve

    return serve(settings)
