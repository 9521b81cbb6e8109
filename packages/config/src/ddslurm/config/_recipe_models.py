"""The model configs a recipe runs with: the snapshot's, each local alias's ``max_parallel_requests`` sized from the
plan's deployments. Pure functions of the recipe, the snapshot and the plan (the node and the submit-time
validation build the recipe with them; the bill shows the sizes)."""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import Any

from ddslurm.config._plan import ServingPlan
from ddslurm.config._recipe import recipe_section
from ddslurm.config._snapshot import ProviderSnapshot

DD_DEFAULT_REQUEST_TIMEOUT_S = 60
"""Data Designer's request timeout when a model config sets none (``inference_parameters.timeout: null``: its HTTP
client's ``timeout_s``, 60 s, in 0.9.x and 1.0)."""
DD_DEFAULT_MAX_PARALLEL_REQUESTS = 4
"""Data Designer's default ``inference_parameters.max_parallel_requests`` (``BaseInferenceParams`` in
``data_designer/config/models.py``: ``Field(default=4, ge=1)``, 0.9.7): what an alias whose model config does not
set the field runs with (``tests`` check it against the installed Data Designer, which this module does not import
on the submit host)."""


def chosen_parallel_requests(params: Mapping[str, Any] | None) -> Any:
    """The ``max_parallel_requests`` a model config's ``inference_parameters`` chose: the field's value when it is
    there, Data Designer's default of 4 included; None when the model config leaves it out (a builder script's YAML
    carries only the fields the script set: ``ddslurm.runtime._builder``)."""
    return (params or {}).get("max_parallel_requests")


def sized_parallel_requests(snapshot: ProviderSnapshot, serving: ServingPlan | None) -> dict[str, int]:
    """The aliases whose ``max_parallel_requests`` ddslurm chooses, with the value: every locally deployed alias
    whose model config chose none (:func:`chosen_parallel_requests`) gets its deployment's replicas x capacity from
    the plan. Hosted aliases, and a recipe's own value (4 as much as any other), are never changed."""
    if serving is None:
        return {}
    local = {p.name for p in snapshot.providers if p.local}
    planned = {d.alias: d.max_parallel_requests for d in serving.deployments if d.max_parallel_requests is not None}
    return {
        m.alias: planned[m.alias]
        for m in snapshot.models
        if m.provider in local and m.alias in planned and chosen_parallel_requests(m.inference_parameters) is None
    }


def parallel_requests(snapshot: ProviderSnapshot, serving: ServingPlan | None) -> dict[str, Any]:
    """The ``max_parallel_requests`` Data Designer runs each alias with (what the client logs): the plan's value
    for sized local aliases, else the model config's own, else Data Designer's default."""
    sized = sized_parallel_requests(snapshot, serving)
    out: dict[str, Any] = {}
    for m in snapshot.models:
        chosen = chosen_parallel_requests(m.inference_parameters)
        out[m.alias] = sized.get(m.alias, DD_DEFAULT_MAX_PARALLEL_REQUESTS if chosen is None else chosen)
    return out


def request_timeout_s(params: Mapping[str, Any] | None) -> int:
    """The seconds Data Designer waits for a model config's answer."""
    return int((params or {}).get("timeout") or DD_DEFAULT_REQUEST_TIMEOUT_S)


def recipe_with_models(
    recipe: Mapping[str, Any],
    snapshot: ProviderSnapshot,
    serving: ServingPlan | None,
    *,
    hosted_wait_s: int = 0,
    checked: Collection[str] = (),
) -> dict[str, Any]:
    """The recipe with its model configs replaced by the snapshot's (hosted ones kept exactly), and each local
    alias's ``max_parallel_requests`` sized from the plan's deployments unless its model config chose one
    (:func:`sized_parallel_requests`). A deployed alias skips Data Designer's health check (a request to the model
    before generating, seconds per shard): the controller has already checked that each replica answers and serves
    the model's name before any client may run. ``hosted_wait_s``: how long the client's gate may hold a hosted
    request for its key's budget (``ddslurm.runtime._hosted_gate``), added to each hosted alias's request timeout
    (the gate applies the alias's own to the provider's answer). ``checked``: hosted aliases the gate has checked
    as Data Designer's health check would, under the key's budget (Data Designer's own is bounded at 180 s); they
    skip Data Designer's. The node and the submit-time validation build the recipe here."""
    out = copy.deepcopy(dict(recipe))
    sized = sized_parallel_requests(snapshot, serving)
    local = {p.name for p in snapshot.providers if p.local}
    deployed = {d.alias for d in serving.deployments} if serving is not None else set()
    models: list[dict[str, Any]] = []
    for m in snapshot.models:
        entry: dict[str, Any] = {"alias": m.alias, "model": m.model, "provider": m.provider}
        params = m.inference_parameters
        if m.alias in sized:
            params = {**(params or {}), "max_parallel_requests": sized[m.alias]}
        if hosted_wait_s and m.provider not in local:
            params = {**(params or {}), "timeout": request_timeout_s(params) + hosted_wait_s}
        if params is not None:
            entry["inference_parameters"] = params
        entry["skip_health_check"] = (
            m.skip_health_check or m.alias in checked or (m.alias in deployed and m.provider in local)
        )
        models.append(entry)
    recipe_section(out)["model_configs"] = models
    return out
