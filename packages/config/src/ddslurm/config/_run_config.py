"""The run file's ``run_config``: Data Designer's own ``RunConfig`` fields, set on every client step of the run.

Which fields exist, their types and their ranges are Data Designer's, and differ between its versions: they are
checked at submit by the Data Designer the nodes run (``ddslurm-runtime inspect`` in ``python_env``), never here.
What is decided here, without Data Designer, is which fields ddslurm sets itself (:data:`RUN_CONFIG_SET_BY_DDSLURM`,
refused with the reason) and that every value is plain data (it is stored in the plan's JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddslurm.config._base import Frozen

RUN_CONFIG_SET_BY_DDSLURM: Mapping[str, str] = {
    "buffer_size": (
        "the run file's own buffer_size sets it (records per batch, the unit a shard saves its work in; unset, the "
        "planner chooses it): set buffer_size at the top level of the run file instead"
    ),
    "display_tui": ("the client step has no terminal; its progress is in ddslurm status and the attempt's client log"),
    "progress_bar": (
        "Data Designer's old name of display_tui: the client step has no terminal; its progress is in "
        "ddslurm status and the attempt's client log"
    ),
    "otel_metrics_port": (
        "ddslurm turns Data Designer's metrics endpoint off: one fixed loopback port on a compute node that several "
        "clients (and other jobs) share would collide"
    ),
    "preserve_dropped_columns": (
        "ddslurm sets it: it keeps what drop processors remove only where a two-stage run needs it to make records "
        "again; the collected dataset never holds dropped columns"
    ),
    "async_trace": (
        "its traces stay in the client's memory, in create()'s results, which ddslurm does not keep: set "
        "write_scheduler_events for scheduler diagnostics on disk"
    ),
}
"""Data Designer ``RunConfig`` fields a run file's ``run_config`` may not set, with why (what to do instead)."""


class RunConfigProblem(Frozen, frozen=True, kw_only=True):
    """What the node's Data Designer refuses in a run file's ``run_config`` (its ``RunConfig``'s own validation, in
    ``python_env``): one field each."""

    field: str
    """The field below ``run_config`` (``shutdown_error_rate``, ``request_admission.cooldown_seconds``); "" for the
    whole mapping (a check of several fields together)."""
    message: str
    """Data Designer's own words."""


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def run_config_refusals(run_config: Mapping[str, Any], path: str = "run_config") -> list[tuple[str, str]]:
    """Each field of ``run_config`` (at ``path`` in the run file) that ddslurm refuses whatever the Data Designer:
    one it sets itself (:data:`RUN_CONFIG_SET_BY_DDSLURM`), or a value that is not plain data (numbers, strings,
    booleans, null, lists and mappings of them)."""
    refusals: list[tuple[str, str]] = []
    for name, value in run_config.items():
        why = RUN_CONFIG_SET_BY_DDSLURM.get(name)
        if why is not None:
            refusals.append((f"{path}.{name}", f"cannot be set in run_config: {why}"))
        elif not _plain(value):
            refusals.append(
                (f"{path}.{name}", f"{type(value).__name__} is not a value Data Designer's RunConfig reads: write a "
                 "number, a string, true/false, null, or a list or mapping of them")
            )  # fmt: skip
    return refusals
