"""What a run will spend, predicted (``Plan.spend``): its records times what earlier runs of the same recipe
measured per record of each hosted alias (requests, input and output tokens: the workspace's recipe facts, the
median of their latest runs), priced by the run's price file; and the money of the GPU-hours the cost model
predicts. Nothing here is guessed: a number no run measured stays None, and the bill says so."""

from __future__ import annotations

from ddslurm.config import (
    AliasSpend,
    Prediction,
    Prices,
    ProviderSnapshot,
    RecipeFact,
    Resources,
    SpendForecast,
)


def _times(records: int, per_record: dict[str, float], alias: str) -> int | None:
    value = per_record.get(alias)
    return None if value is None else round(records * value)


def forecast_spend(
    records: int,
    snapshot: ProviderSnapshot,
    fact: RecipeFact | None,
    prices: Prices | None,
    *,
    prediction: Prediction | None,
    generation: Resources,
    gpus: int,
) -> SpendForecast:
    """``records`` of the recipe ``fact`` measured (None: never run here), each hosted alias of ``snapshot``
    priced by ``prices``; ``gpus``: the GPUs of one generation allocation (0: no deployments), whose predicted
    hours ``prediction`` holds (None: the run file fixed the layout)."""
    local = {p.name for p in snapshot.providers if p.local}
    hosted = []
    for model in snapshot.models:
        if model.provider in local:
            continue
        requests = input_tokens = output_tokens = None
        runs = 0
        if fact is not None:
            requests = _times(records, fact.requests_per_record, model.alias)
            input_tokens = _times(records, fact.input_tokens_per_record, model.alias)
            output_tokens = _times(records, fact.output_tokens_per_record, model.alias)
            number = "requests_per_record" if input_tokens is None else "input_tokens_per_record"
            runs = fact.runs(number, model.alias) if requests is not None else 0
        cost = None
        if prices is not None and input_tokens is not None and output_tokens is not None:
            cost = prices.tokens_cost(model.model, input_tokens, output_tokens)
        hosted.append(
            AliasSpend(
                alias=model.alias,
                model=model.model,
                provider=model.provider,
                requests=requests,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cost=cost,
                runs=runs,
            )
        )
    gpu_hours = cpu_hours = hours_cost = None
    if gpus == 0:
        gpu_hours = cpu_hours = 0.0
    elif prediction is not None:
        gpu_hours = prediction.chosen.gpu_hours
        cpu_hours = gpu_hours / gpus * generation.cpus_per_task * generation.nodes
        if prices is not None:
            hours_cost = prices.hours_cost(generation.partition, gpu_hours, cpu_hours)
    return SpendForecast(
        records=records,
        hosted=tuple(hosted),
        gpu_hours=gpu_hours,
        cpu_hours=cpu_hours,
        hours_cost=hours_cost,
        currency=None if prices is None else prices.currency,
    )
