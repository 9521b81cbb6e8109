"""What Data Designer's own output (an attempt's ``client.out``) says about models: the usage summary each
generation step prints, its health checks, and the model-config lines that name each model's alias and provider."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_USAGE_HEAD = "Model usage summary:"
_ITEM = re.compile(r"\|-- (?P<key>model|tokens|requests|model alias|model provider): (?P<value>.*)$")
_PAIRS = re.compile(r"(\w+)=([0-9.]+)")
_CHECK = re.compile(
    r"Checking '(?P<model>[^']+)' in provider named '(?P<provider>[^']+)' for model alias '(?P<alias>[^']+)'"
)


@dataclass(slots=True)
class UsageSummary:
    """One model's part of one usage summary."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    tps: float = 0.0
    successful: int = 0
    failed: int = 0
    requests: int = 0


@dataclass(slots=True)
class ClientOut:
    """What ``client.out`` says about models: the usage summaries and which alias and provider name each model."""

    usage: list[UsageSummary] = field(default_factory=list)
    aliases: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """Model name → (alias, provider), from the model-config lines Data Designer prints before generating."""
    health_checks: dict[str, int] = field(default_factory=dict)
    """Model name → health-check requests (``👀 Checking 'M' in provider named 'P' for model alias 'A'...``)."""


def _message(line: str) -> str:
    """A Data Designer log line without its ``[12:00:00] [INFO] `` prefix."""
    return re.sub(r"^\[[^\]]*\] \[[A-Z]+\] ", "", line.rstrip())


def _count(pairs: dict[str, str], key: str) -> int:
    return int(float(pairs.get(key, "0")))


def parse_client_out(text: str) -> ClientOut:
    """Data Designer's usage summaries (``📊 Model usage summary:`` then, per model, ``|-- model: NAME``,
    ``|-- tokens: input=N, output=N[, reasoning=N], total=N, tps=N``, ``|-- requests: success=N, failed=N,
    total=N, rpm=N``) and its model-config lines (``|-- model: 'NAME'``, ``|-- model alias: 'A'``,
    ``|-- model provider: 'P'``)."""
    found = ClientOut()
    in_summary = False
    current: UsageSummary | None = None
    config_model: str | None = None
    config_alias: str | None = None
    for raw in text.splitlines():
        line = _message(raw)
        if check := _CHECK.search(line):
            model = check.group("model")
            found.health_checks[model] = found.health_checks.get(model, 0) + 1
            found.aliases.setdefault(model, (check.group("alias"), check.group("provider")))
            continue
        if line.endswith(_USAGE_HEAD):
            in_summary, current = True, None
            continue
        m = _ITEM.search(line)
        if m is None:
            if in_summary and not line.rstrip().endswith("|--"):
                in_summary, current = False, None
            continue
        key, value = m.group("key"), m.group("value").strip()
        if in_summary:
            pairs = dict(_PAIRS.findall(value))
            if key == "model":
                current = UsageSummary(model=value)
                found.usage.append(current)
            elif key == "tokens" and current is not None:
                current.input_tokens = _count(pairs, "input")
                current.output_tokens = _count(pairs, "output")
                current.total_tokens = _count(pairs, "total")
                current.tps = float(pairs.get("tps", "0"))
            elif key == "requests" and current is not None:
                current.successful = _count(pairs, "success")
                current.failed = _count(pairs, "failed")
                current.requests = _count(pairs, "total")
            continue
        name = value.strip("'\"")
        if key == "model":
            config_model, config_alias = name, None
        elif key == "model alias" and config_model is not None:
            config_alias = name
            found.aliases[config_model] = (name, None)
        elif key == "model provider" and config_model is not None and config_alias is not None:
            found.aliases[config_model] = (config_alias, name)
    return found
