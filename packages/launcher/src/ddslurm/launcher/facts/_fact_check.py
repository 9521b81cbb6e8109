"""Each fact a run was planned with beside what the run itself measured of it: the report's table of facts, so a
user sees how far the cost model's inputs were from this run (and how many runs each rests on)."""

from __future__ import annotations

import msgspec

from ddslurm.config import FactUse, Plan
from ddslurm.launcher.facts._measure import Measured, measure
from ddslurm.launcher.report._model import FactMeasured, RunReport
from ddslurm.launcher.report._read import RunFacts

_MODEL_NUMBERS = frozenset({"load_s", "requests_per_s"})


def fact_check(plan: Plan, found: Measured) -> list[FactMeasured]:
    """The prediction's facts (``Plan.prediction.facts``, in its order) beside ``found``; empty without one."""
    if plan.prediction is None:
        return []
    return [_row(use, found) for use in plan.prediction.facts]


def with_fact_check(facts: RunFacts, report: RunReport) -> RunReport:
    """``report`` with its :attr:`~ddslurm.launcher.report.RunReport.facts` filled from the run's measure."""
    return msgspec.structs.replace(report, facts=fact_check(facts.plan, measure(facts, report)))


def fact_line(fact: FactMeasured) -> str:
    """One fact beside its measure as ``report`` and ``tune`` print it."""
    rests = "a default" if fact.runs == 0 else f"{fact.origin}, {fact.runs} run{'s' if fact.runs != 1 else ''}"
    if fact.measured is None:
        seen = fact.note or "not measured"
    else:
        seen = f"{fact.measured:g}" + (f" (x{fact.ratio:g})" if fact.ratio is not None else "")
    return f"{fact.name} of {fact.subject}: {fact.used:g} ({rests}) / {seen}"


def beside(use: FactUse, measured: float | None, note: str = "") -> FactMeasured:
    """``use`` beside ``measured`` (None: not measured, ``note`` says why)."""
    ratio = round(measured / use.value, 3) if measured is not None and use.value > 0 else None
    return FactMeasured(
        name=use.name,
        subject=use.subject,
        used=use.value,
        origin=use.origin,
        runs=use.runs,
        measured=measured,
        ratio=ratio,
        note=note,
    )


def _row(use: FactUse, found: Measured) -> FactMeasured:
    return beside(use, *_measured(use, found))


def _measured(use: FactUse, found: Measured) -> tuple[float | None, str]:
    """This run's own measure of ``use``, or None and why not."""
    if use.name in _MODEL_NUMBERS:
        key = use.subject.partition(":")[2]
        model = next((m for m in found.models if m.shape.key() == key), None)
        if model is not None:
            return (model.load_s if use.name == "load_s" else model.requests_per_s), ""
        if found.unclean:
            return None, "not measured: attempts of the run did not end cleanly"
        return None, "not measured: no allocation of the run measured it"
    recipe = found.recipe
    if recipe is None:
        return None, "not measured: the run generated no row yet"
    value = (
        recipe.requests_per_record.get(use.subject)
        if use.name == "requests_per_record"
        else getattr(recipe, use.name, None)
    )
    if value is None:
        clean = found.unclean and use.name in ("allocation_overhead_s", "cpu_stage_records_per_s")
        return None, "not measured: attempts of the run did not end cleanly" if clean else "not measured"
    return float(value), ""
