"""``fake-vllm serve MODEL [vLLM flags] [--fake-* flags]`` and SGLang's ``launch_server`` flags: parse an engine
command line into ``Settings``.

Both parsers are argparse parsers built from the engines' real flag lists (``fake_vllm.flags``): a flag the
engine does not have is refused as the engine refuses it (``error: unrecognized arguments: ...``, exit status
2); a real flag the stand-in does not model is accepted, with its values, and logged once as ignored. vLLM's
parser takes ``--flag_name`` for ``--flag-name`` and no abbreviations (its ``FlexibleArgumentParser``);
SGLang's, a plain ``argparse.ArgumentParser``, takes unambiguous prefixes (``--tp``, ``--dp``). Every
``--fake-*`` flag can also be set by its ``FAKE_VLLM_*`` environment variable; the flag wins over the variable.
``FAKE_VLLM_AS_VLLM``/``FAKE_VLLM_AS_SGLANG`` make it an older release, without the flags that came later
(``fake_vllm.settings.ACT_AS_ENV``).
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

from fake_vllm.flags import BOOL, SGLANG_FLAGS, VLLM_SERVE_FLAGS, Arity, has_flag
from fake_vllm.settings import Engine, Group, Settings, engine_version


@dataclass(frozen=True)
class FakeOption:
    """One stand-in behaviour: a ``--fake-*`` flag, its environment variable, its type and default."""

    flag: str
    env: str
    dest: str
    kind: str  # "seconds", "count", "rate", "int", "bool", "path", "regex", "text", "headers", "compile-cache"
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
        "answer the first N chat requests, then exit with status 1 abruptly (those in flight die with it)",
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
    FakeOption(
        "--fake-gate", "FAKE_VLLM_GATE", "gate", "path", None,
        "chat requests wait until this file lets them through: empty or absent, all pass; a number N, the first "
        "N pass; 'hold', none more (a test's event, never a clock)",
    ),
    FakeOption(
        "--fake-gate-model", "FAKE_VLLM_GATE_MODEL", "gate_model", "text", None,
        "only chat requests for this served model name wait at --fake-gate (the others pass)",
    ),
    FakeOption(
        "--fake-outage", "FAKE_VLLM_OUTAGE", "outage", "path", None,
        "while this file holds 500 or 429, every chat request is answered so (429 with Retry-After: 1), as a "
        "provider in an outage or over its rate limit; empty or absent, none (a test's event, never a clock)",
    ),
    FakeOption(
        "--fake-rate-limit-rpm", "FAKE_VLLM_RATE_LIMIT_RPM", "rate_limit_rpm", "count", None,
        "the key admits N chat requests a minute (a bucket of N refilled continuously); above, 429 with "
        "Retry-After and the rate headers (--fake-rate-headers)",
    ),
    FakeOption(
        "--fake-rate-limit-tpm", "FAKE_VLLM_RATE_LIMIT_TPM", "rate_limit_tpm", "count", None,
        "the key admits N tokens a minute (a request counts its prompt and its max_tokens)",
    ),
    FakeOption(
        "--fake-rate-limit-in-flight", "FAKE_VLLM_RATE_LIMIT_IN_FLIGHT", "rate_limit_in_flight", "count", None,
        "the key admits N chat requests at once; above, 429",
    ),
    FakeOption(
        "--fake-rate-headers", "FAKE_VLLM_RATE_HEADERS", "rate_headers", "headers", "openai",
        "how a rate-limited key says so on every answer: openai (x-ratelimit-*), anthropic "
        "(anthropic-ratelimit-*) or none (not even Retry-After on a 429)",
    ),
    FakeOption(
        "--fake-compile-cache", "FAKE_VLLM_COMPILE_CACHE", "compile_cache", "compile-cache", "off",
        "vLLM mode: keep a torch.compile cache under VLLM_CACHE_ROOT (fake_vllm.compile_cache): off (none), old "
        "(a vLLM before vllm-project/vllm#52523: VLLM_API_KEY is one of its hashed factors) or fixed",
    ),
    FakeOption(
        "--fake-join-timeout", "FAKE_VLLM_JOIN_TIMEOUT", "join_timeout", "seconds", 120.0,
        "a follower rank retries reaching its leader's rendezvous address this long, then exits with status 1",
    ),
    FakeOption(
        "--fake-engine-process", "FAKE_VLLM_ENGINE_PROCESS", "engine_process", "bool", False,
        "run the engine as a child process titled VLLM::EngineCore, as vLLM does: once it dies, /health "
        "answers 503 and the server exits with status 1",
    ),
    FakeOption(
        "--fake-metrics-auth", "FAKE_VLLM_METRICS_AUTH", "metrics_auth", "bool", False,
        "/metrics wants the API key too (401 without it), as a proposed vLLM change would have it",
    ),
    FakeOption(
        "--fake-follower-health", "FAKE_VLLM_FOLLOWER_HEALTH", "follower_health", "bool", False,
        "an SGLang follower (--node-rank > 0) serves a dummy /health on --host --port once it joined, as SGLang's "
        "do; a port in use there ends it with status 1 (off: the local cluster's nodes share one host)",
    ),
)  # fmt: skip


_CAPACITY_ENV = next(option.env for option in FAKE_OPTIONS if option.dest == "capacity")


class UsageError(ValueError):
    """A bad command line or environment value (exit status 2)."""


class EngineError(ValueError):
    """A command line the engine parses but then refuses at start-up, as its config checks do (exit status 1)."""


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


def _headers(text: str) -> str:
    if text not in ("openai", "anthropic", "none"):
        raise ValueError(f"expected openai, anthropic or none, got {text!r}")
    return text


def _compile_cache(text: str) -> str:
    if text not in ("off", "old", "fixed"):
        raise ValueError(f"expected off, old or fixed, got {text!r}")
    return text


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
    "text": str,
    "headers": _headers,
    "compile-cache": _compile_cache,
}


class _Ignored(argparse.Action):
    """A real engine flag the stand-in does not model: record it and its values (in ``ignored_args``)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        recorded = list(getattr(namespace, "ignored_args", None) or [])
        recorded.append(option_string or self.dest)
        if isinstance(values, str):
            recorded.append(values)
        elif values is not None:
            recorded.extend(str(value) for value in values)
        namespace.ignored_args = recorded


_NARGS: dict[Any, Any] = {0: 0, 1: None, "?": "?", "+": "+", "*": "*"}


def _add_engine_flags(
    parser: argparse.ArgumentParser,
    table: Sequence[tuple[tuple[str, ...], Arity]],
    modeled: Mapping[str, dict[str, Any]],
    has: Callable[[str], bool] = lambda flag: True,
) -> None:
    """Every flag of ``table`` the release ``has``: the ``modeled`` ones (by first option string) with their own
    argparse keywords, the others recorded as ignored. A modeled flag the release lacks keeps its default, so that
    the rest of the stand-in reads it as unset (and argparse refuses it on a command line)."""
    for names, arity in table:
        if not has(names[0]):
            keywords = modeled.get(names[0])
            if keywords is not None:
                dest = keywords.get("dest") or names[0][2:].replace("-", "_")
                unset = False if keywords.get("action") == "store_true" else None
                parser.set_defaults(**{dest: keywords.get("default", unset)})
            continue
        if names[0] in modeled:
            parser.add_argument(*names, **modeled[names[0]])
            continue
        strings = list(names)
        if arity == BOOL:
            strings += [f"--no-{name[2:]}" for name in names if name.startswith("--")]
        nargs = 0 if arity == BOOL else _NARGS[arity]
        parser.add_argument(*strings, dest="ignored_args", action=_Ignored, nargs=nargs, help=argparse.SUPPRESS)


def _add_fake_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("stand-in behaviours (fake-vllm)")
    for option in FAKE_OPTIONS:
        if option.kind == "bool":
            group.add_argument(option.flag, dest=option.dest, action="store_const", const=True, help=option.help)
        else:
            group.add_argument(option.flag, dest=option.dest, metavar="VALUE", help=f"{option.help} [{option.env}]")


_VLLM_MODELED: dict[str, dict[str, Any]] = {
    "--model": {"dest": "model_flag", "metavar": "MODEL", "help": "alternative to the positional MODEL"},
    "--host": {"default": "127.0.0.1", "help": "address to bind (default 127.0.0.1)"},
    "--port": {"type": int, "default": 8000, "help": "port to bind (default 8000)"},
    "--uds": {
        "metavar": "PATH",
        "help": "Unix domain socket path. If set, host and port arguments are ignored. (as in vLLM: the path must "
        "not exist; nothing removes the socket file afterwards)",
    },
    "--served-model-name": {"nargs": "+", "metavar": "NAME", "help": "names the API answers to"},
    "--tensor-parallel-size": {"type": int, "default": 1, "metavar": "N"},
    "--pipeline-parallel-size": {"type": int, "default": 1, "metavar": "N"},
    "--data-parallel-size": {"type": int, "default": 1, "metavar": "N"},
    "--data-parallel-size-local": {"type": int, "metavar": "N", "help": "data-parallel ranks on this node"},
    "--data-parallel-start-rank": {"type": int, "metavar": "N", "help": "the first data-parallel rank here"},
    "--data-parallel-address": {"metavar": "HOST", "help": "the data-parallel leader's address"},
    "--data-parallel-rpc-port": {"type": int, "metavar": "PORT", "help": "the data-parallel rendezvous port"},
    "--enable-expert-parallel": {"action": argparse.BooleanOptionalAction, "default": False},
    "--nnodes": {"type": int, "default": 1, "metavar": "N", "help": "nodes of a tensor x pipeline parallel replica"},
    "--node-rank": {"type": int, "default": 0, "metavar": "K"},
    "--master-addr": {"default": "127.0.0.1", "metavar": "HOST", "help": "node rank 0's rendezvous address"},
    "--master-port": {"type": int, "default": 29501, "metavar": "PORT", "help": "node rank 0's rendezvous port"},
    "--headless": {"action": "store_true", "help": "a follower rank: no API server"},
    "--max-num-seqs": {
        "metavar": "N",
        "help": "sequences run at once per data-parallel rank, the rest queue (as in vLLM): times the data-parallel "
        "size, the capacity unless --fake-capacity is given",
    },
    "--api-key": {
        "nargs": "+",
        "metavar": "KEY",
        "help": "require 'Authorization: Bearer KEY' on /v1/* (or VLLM_API_KEY)",
    },
}

_SGLANG_MODELED: dict[str, dict[str, Any]] = {
    "--model-path": {"dest": "model_path", "required": True, "metavar": "PATH"},
    "--host": {"default": "127.0.0.1"},
    "--port": {"type": int, "default": 30000},
    "--served-model-name": {"metavar": "NAME"},
    "--tensor-parallel-size": {"dest": "tp_size", "type": int, "default": 1},
    "--pipeline-parallel-size": {"dest": "pp_size", "type": int, "default": 1},
    "--data-parallel-size": {"dest": "dp_size", "type": int, "default": 1},
    "--expert-parallel-size": {"dest": "ep_size", "type": int, "default": 1},
    "--enable-ep-moe": {"action": "store_true"},
    "--enable-dp-attention": {"action": "store_true"},
    "--dist-init-addr": {"dest": "dist_init_addr", "metavar": "HOST:PORT"},
    "--nnodes": {"type": int, "default": 1},
    "--node-rank": {"type": int, "default": 0},
    "--max-running-requests": {"metavar": "N", "help": "running requests per data-parallel rank (the capacity)"},
    "--api-key": {
        "metavar": "KEY",
        "help": "require 'Authorization: Bearer KEY' on every route but /health*, /metrics*",
    },
    "--enable-metrics": {"action": "store_true", "help": "serve /metrics (sglang:* names)"},
}


def build_parser(engine: Engine = "vllm", version: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``vllm serve`` (the arguments after ``serve``) or of SGLang's ``launch_server``: every real
    flag of the engine (``fake_vllm.flags``) that its release ``version`` has (None: every one) plus the
    ``--fake-*`` ones."""

    def has(flag: str) -> bool:
        return version is None or has_flag(engine, flag, version)

    if engine == "sglang":
        parser = argparse.ArgumentParser(prog="launch_server.py", description="An SGLang stand-in (fake-vllm).")
        _add_engine_flags(parser, SGLANG_FLAGS, _SGLANG_MODELED, has)
    else:
        parser = argparse.ArgumentParser(
            prog="vllm serve",
            usage="vllm serve [model_tag] [options]",
            description="A vLLM stand-in (fake-vllm) speaking the OpenAI API.",
            allow_abbrev=False,
        )
        parser.add_argument("model_tag", nargs="?", metavar="MODEL", help="model name or path, as for vllm serve")
        _add_engine_flags(parser, VLLM_SERVE_FLAGS, _VLLM_MODELED, has)
    _add_fake_flags(parser)
    return parser


def _vllm_spelling(args: Sequence[str]) -> list[str]:
    """vLLM's ``FlexibleArgumentParser`` reads ``--max_num_seqs`` as ``--max-num-seqs`` (up to any ``=``)."""
    spelled: list[str] = []
    for token in args:
        if token == "--":
            spelled.extend(args[len(spelled) :])
            break
        if token.startswith("--"):
            key, sep, value = token.partition("=")
            token = key.replace("_", "-") + sep + value
        spelled.append(token)
    return spelled


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


def _fake_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    fake = {option.dest: _fake_value(option, getattr(namespace, option.dest), environ) for option in FAKE_OPTIONS}
    if fake["error_rate"] + fake["rate_429"] + fake["no_choices_rate"] > 1.0:
        raise UsageError("--fake-error-rate, --fake-429-rate and --fake-no-choices-rate must not sum above 1")
    return fake


def _per_rank_capacity(raw: str | None, flag: str) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{flag}: expected an integer >= 1, got {raw!r}")
    return value


def _capacity(
    fake: dict[str, Any], per_rank: int | None, dp: int, namespace: argparse.Namespace, environ: Mapping[str, str]
) -> None:
    """The engine runs at most ``per_rank`` sequences at once on each data-parallel rank and queues the rest: the
    replica's capacity is ``per_rank * dp``, unless ``--fake-capacity`` (or its variable) says otherwise."""
    if per_rank is not None and namespace.capacity is None and environ.get(_CAPACITY_ENV) is None:
        fake["capacity"] = per_rank * dp


def _at_least_one(**sizes: int) -> None:
    for flag, value in sizes.items():
        if value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")


def _vllm_group(ns: argparse.Namespace) -> tuple[Group | None, int]:
    """The multi-node form of a vLLM command line and the GPUs this node's ranks need (vLLM's config checks)."""
    tp, pp, dp = ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size
    local = ns.data_parallel_size_local
    if ns.nnodes < 1:
        raise UsageError(f"--nnodes must be at least 1, got {ns.nnodes}")
    if ns.nnodes > 1:
        if local is not None and local != dp:
            raise UsageError(
                "the stand-in models --nnodes (tensor x pipeline parallel over nodes) or data parallel "
                "over nodes (--data-parallel-size-local), not both at once"
            )
        if not 0 <= ns.node_rank < ns.nnodes:
            raise EngineError(f"node_rank ({ns.node_rank}) must be in [0, nnodes={ns.nnodes})")
        world = tp * pp
        if world % ns.nnodes != 0:
            raise EngineError(
                f"world_size ({world} = tensor_parallel_size {tp} x pipeline_parallel_size {pp}) "
                f"must be divisible by nnodes ({ns.nnodes})"
            )
        group = Group(form="nodes", nodes=ns.nnodes, rank=ns.node_rank, address=ns.master_addr, port=ns.master_port)
        return group, world // ns.nnodes * dp
    if local is not None and local != dp:
        if local < 1 or dp % local != 0:
            raise EngineError(f"data_parallel_size ({dp}) must be a multiple of data_parallel_size_local ({local})")
        start = ns.data_parallel_start_rank or 0
        if start % local != 0 or not 0 <= start < dp:
            raise EngineError(
                f"data_parallel_start_rank ({start}) must be a multiple of data_parallel_size_local "
                f"({local}) below data_parallel_size ({dp})"
            )
        address = ns.data_parallel_address or "127.0.0.1"
        port = ns.data_parallel_rpc_port if ns.data_parallel_rpc_port is not None else 29550
        group = Group(form="data-parallel", nodes=dp // local, rank=start // local, address=address, port=port)
        return group, tp * pp * local
    return None, tp * pp * dp


def _check_roles(group: Group | None, headless: bool) -> None:
    if group is None:
        if headless:
            raise UsageError(
                "--headless: the stand-in models headless ranks of a multi-node replica only "
                "(--nnodes N --node-rank K > 0, or --data-parallel-start-rank K > 0)"
            )
        return
    if group.leader and headless:
        raise UsageError("--headless on rank 0: the stand-in's rank 0 leads the replica and serves its API")
    if not group.leader and not headless:
        what = "node rank" if group.form == "nodes" else "data-parallel start rank"
        raise UsageError(
            f"{what} {group.rank} > 0 serves no API: run it with --headless (the stand-in does not "
            "model an API server on every node)"
        )


def parse_serve_args(args: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Build the settings from the arguments after ``serve`` and the environment (for ``FAKE_VLLM_*`` and
    ``VLLM_API_KEY``). Raises ``UsageError`` and ``EngineError``; ``-h``, an unknown flag and argparse's own errors
    raise ``SystemExit`` (status 2), as with ``vllm serve``."""
    ns = build_parser("vllm", engine_version("vllm", environ)).parse_args(_vllm_spelling(args))
    model = ns.model_flag or ns.model_tag
    if not model:
        raise UsageError("a MODEL is required: fake-vllm serve MODEL [options]")
    if ns.model_flag and ns.model_tag and ns.model_flag != ns.model_tag:
        raise UsageError(f"MODEL given twice: {ns.model_tag!r} and --model {ns.model_flag!r}")
    if ns.uds is not None and not ns.uds:
        raise UsageError("--uds: expected a socket path, got ''")
    if ns.uds is None and not 0 < ns.port < 65536:
        raise UsageError(f"--port: {ns.port} is not a valid port")
    _at_least_one(
        tensor_parallel_size=ns.tensor_parallel_size,
        pipeline_parallel_size=ns.pipeline_parallel_size,
        data_parallel_size=ns.data_parallel_size,
    )
    group, gpus = _vllm_group(ns)
    _check_roles(group, ns.headless)
    api_keys = tuple(ns.api_key or ())
    if not api_keys and environ.get("VLLM_API_KEY"):
        api_keys = (environ["VLLM_API_KEY"],)
    fake = _fake_settings(ns, environ)
    max_num_seqs = _per_rank_capacity(ns.max_num_seqs, "--max-num-seqs")
    _capacity(fake, max_num_seqs, ns.data_parallel_size, ns, environ)
    ep = ns.tensor_parallel_size * ns.data_parallel_size if ns.enable_expert_parallel else 1
    return Settings(
        model=model,
        served_model_names=tuple(ns.served_model_name or (model,)),
        host=ns.host,
        port=ns.port,
        uds=None if ns.uds is None else Path(ns.uds),
        api_keys=api_keys,
        engine="vllm",
        tensor_parallel_size=ns.tensor_parallel_size,
        pipeline_parallel_size=ns.pipeline_parallel_size,
        data_parallel_size=ns.data_parallel_size,
        expert_parallel=ns.enable_expert_parallel,
        expert_parallel_size=ep,
        group=group,
        headless=ns.headless,
        gpus_per_node=gpus,
        max_num_seqs=max_num_seqs,
        ignored_args=tuple(ns.ignored_args or ()),
        **fake,
    )


def _sglang_group(ns: argparse.Namespace) -> tuple[Group | None, int]:
    """The multi-node form of an SGLang command line and this node's GPUs (``ServerArgs.check_server_args``)."""
    tp, pp, dp = ns.tp_size, ns.pp_size, ns.dp_size
    per_replica = tp * pp if ns.enable_dp_attention else tp * pp * dp
    if ns.nnodes < 1:
        raise UsageError(f"--nnodes must be at least 1, got {ns.nnodes}")
    if ns.nnodes == 1:
        return None, per_replica
    if (tp * pp) % ns.nnodes != 0:
        raise EngineError("tp_size must be divisible by number of nodes")
    if dp > 1 and not ns.enable_dp_attention:
        raise EngineError("multi-node data parallel is not supported unless dp attention!")
    if not 0 <= ns.node_rank < ns.nnodes:
        raise EngineError(f"node_rank ({ns.node_rank}) must be in [0, nnodes={ns.nnodes})")
    if not ns.dist_init_addr:
        raise EngineError("--dist-init-addr (HOST:PORT of node rank 0) is required with --nnodes > 1")
    host, sep, port = ns.dist_init_addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EngineError(f"please provide --dist-init-addr as host:port of head node, got {ns.dist_init_addr!r}")
    group = Group(form="nodes", nodes=ns.nnodes, rank=ns.node_rank, address=host.strip("[]"), port=int(port))
    return group, per_replica // ns.nnodes


def _sglang_health(environ: Mapping[str, str]) -> dict[str, Any]:
    """SGLang's own variables for its generating /health (``fake_vllm.sglang_health``): whether ``/health``
    generates (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``, default true) and how long it waits for output
    (``SGLANG_HEALTH_CHECK_TIMEOUT``, default 20 s)."""
    generates = environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").strip().lower()
    try:
        timeout = float(environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
    except ValueError:
        raise UsageError("SGLANG_HEALTH_CHECK_TIMEOUT: expected seconds") from None
    return {"health_generates": generates not in ("0", "false", "no", "off"), "health_check_timeout": timeout}


def parse_sglang_args(args: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Build the settings from SGLang's ``launch_server`` arguments (and ``FAKE_VLLM_*``; SGLang reads no key from
    the environment: ``--api-key`` only). Raises like ``parse_serve_args``."""
    ns = build_parser("sglang", engine_version("sglang", environ)).parse_args(list(args))
    if not 0 < ns.port < 65536:
        raise UsageError(f"--port: {ns.port} is not a valid port")
    _at_least_one(tp_size=ns.tp_size, pp_size=ns.pp_size, dp_size=ns.dp_size, ep_size=ns.ep_size)
    group, gpus = _sglang_group(ns)
    fake = _fake_settings(ns, environ)
    running = _per_rank_capacity(ns.max_running_requests, "--max-running-requests")
    _capacity(fake, running, ns.dp_size, ns, environ)
    return Settings(
        model=ns.model_path,
        served_model_names=(ns.served_model_name or ns.model_path,),
        host=ns.host,
        port=ns.port,
        api_keys=(ns.api_key,) if ns.api_key else (),
        engine="sglang",
        tensor_parallel_size=ns.tp_size,
        pipeline_parallel_size=ns.pp_size,
        data_parallel_size=ns.dp_size,
        expert_parallel=ns.enable_ep_moe or ns.ep_size > 1,
        expert_parallel_size=ns.tp_size if ns.enable_ep_moe else ns.ep_size,
        group=group,
        headless=group is not None and not group.leader,
        gpus_per_node=gpus,
        enable_metrics=ns.enable_metrics,
        **_sglang_health(environ),
        max_num_seqs=running,
        ignored_args=tuple(ns.ignored_args or ()),
        **fake,
    )


_USAGE = """usage: fake-vllm serve MODEL [--host HOST] [--port PORT | --uds PATH] [--served-model-name NAME ...]
                       [--tensor-parallel-size N] [--pipeline-parallel-size N] [--data-parallel-size N]
                       [--nnodes N --node-rank K --master-addr A --master-port P] [--headless]
                       [--max-num-seqs N] [--api-key KEY] [--fake-* ...] [other vLLM flags, ignored]
       fake-vllm --version
"""


def _run(settings_of: Callable[[], Settings], prog: str) -> int:
    try:
        settings = settings_of()
    except UsageError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    except EngineError as exc:
        from fake_vllm.log import log

        log(f"ValueError: {exc}", level="ERROR")
        return 1
    from fake_vllm.server import serve  # deferred: uvicorn and starlette load only to serve

    return serve(settings)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fake-vllm`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("--version", "-v", "version"):
        print(engine_version("vllm", os.environ))  # as `vllm --version`: the release alone
        return 0
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_USAGE)
        return 0 if args else 2
    if args[0] != "serve":
        sys.stderr.write(_USAGE + f"fake-vllm: error: unknown command {args[0]!r} (only 'serve' exists)\n")
        return 2
    return _run(lambda: parse_serve_args(args[1:], os.environ), "vllm serve")


def sglang_main(argv: Sequence[str] | None = None) -> int:
    """``python -m sglang.launch_server ARGS`` under ``fake-sglang-python`` (the shim's ``launch_server``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return _run(lambda: parse_sglang_args(args, os.environ), "launch_server.py")
