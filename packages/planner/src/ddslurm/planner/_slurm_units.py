"""Slurm's time limits and memory sizes as the run file and the profile write them, read into minutes and
megabytes (or refused, naming the field)."""

from __future__ import annotations

import math
import re

from ddslurm.planner.errors import PlanError

_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


def parse_time_limit(value: str | int, field: str = "time_limit") -> int:
    """Slurm time formats to whole minutes (rounded up, as Slurm does): ``90``, ``1:30:00``, ``2-00:00:00``.
    ``field`` names the setting in error messages (``submission.time_limit``)."""
    if isinstance(value, int):
        if value < 1:
            raise PlanError(f"{field}: must be at least 1 minute, got {value}")
        return value
    match = _TIME.match(value.strip())
    if not match:
        raise PlanError(f"{field}: {value!r} is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)")
    days = int(match.group("days") or 0)
    parts = [int(p) for p in (match.group("a"), match.group("b"), match.group("c")) if p is not None]
    if match.group("days") is not None:
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = 0, parts[0], 0
    total = days * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)
    if total < 1:
        raise PlanError(f"{field}: {value!r} is shorter than one minute")
    return total


_MEM = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)
_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory_mb(value: str, field: str = "memory") -> int:
    """Slurm memory sizes (``500``, ``500M``, ``16G``, ``1T``; default unit MB) to whole megabytes. ``field`` names
    the setting in error messages (``submission.memory``)."""
    match = _MEM.match(value.strip())
    if not match:
        raise PlanError(f"{field}: {value!r} is not a Slurm size such as 16G or 500M")
    return max(1, math.ceil(float(match.group("n")) * _MB[match.group("unit").upper()]))


MIN_TIME_LIMIT_MINUTES = 2
SLURM_SIGNAL_SLACK_S = 60
"""Slurm may send the time-limit warning (``#SBATCH --signal=B:USR1@N``) up to this much earlier than asked."""


def check_time_limit(value: str | int) -> int:
    """The generation time limit in minutes, refused when it leaves no useful time: Slurm's time-limit warning
    may arrive up to a minute early, and the attempt stops generating when it does."""
    minutes = parse_time_limit(value, "submission.time_limit")
    if minutes < MIN_TIME_LIMIT_MINUTES:
        raise PlanError(
            f"submission.time_limit: {value!r} is {minutes} minute(s); at least {MIN_TIME_LIMIT_MINUTES} are "
            f"needed, because Slurm may send the time-limit warning up to {SLURM_SIGNAL_SLACK_S} s early and the "
            "attempt stops generating when it arrives"
        )
    return minutes
