"""Data Designer's ``RunConfig`` of a run: the run file's ``run_config`` (``Plan.run_config``) as this environment's
Data Designer reads it, with the fields ddslurm sets itself over it.

The same Data Designer judges the fields at submit (``ddslurm-runtime inspect``'s check, :func:`run_config_problems`)
and applies them on the node (:func:`engine_run_config`), so a field, a range or an enum value of one version is
never judged by another's rules."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ddslurm.config import RunConfigProblem, did_you_mean
from ddslurm.runtime.errors import RecipeError


def _dd_version() -> str:
    try:
        return version("data-designer")
    except PackageNotFoundError:  # pragma: no cover - Data Designer imports, so it is installed
        return "?"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def run_config_problems(fields: Mapping[str, Any]) -> list[RunConfigProblem]:
    """What this environment's Data Designer refuses in ``fields`` (a run file's ``run_config``): its ``RunConfig``'s
    own validation, one problem per field in its own words (an unknown field with the fields it has, the closest
    first); none when it takes them all."""
    import pydantic
    from data_designer.config.run_config import RunConfig

    try:
        RunConfig.model_validate(dict(fields))
    except pydantic.ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = [str(step) for step in error.get("loc", ())]
            message = str(error.get("msg", "invalid"))
            if error.get("type") == "extra_forbidden":
                known = _known_fields(RunConfig, loc[:-1])
                hint = did_you_mean(loc[-1], known) if loc else ""
                message += f" (Data Designer {_dd_version()}'s RunConfig has no such field{hint})"
            elif loc:
                message += f" (got {_shown(error.get('input'))})"
            problems.append(RunConfigProblem(field=".".join(loc), message=message))
        return problems
    return []


def _known_fields(model: Any, path: list[str]) -> list[str]:
    """The field names of ``model`` (a pydantic model) or of the nested model at ``path`` below it."""
    for step in path:
        field = getattr(model, "model_fields", {}).get(step)
        inner = getattr(field, "annotation", None)
        members = [inner, *getattr(inner, "__args__", ())]
        model = next((m for m in members if hasattr(m, "model_fields")), None)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def engine_run_config(fields: Mapping[str, Any], **owned: Any) -> Any:
    """Data Designer's ``RunConfig`` of ``fields`` (the plan's ``run_config``) with ``owned`` (what ddslurm sets
    itself: ``buffer_size``, ``otel_metrics_port``, ``preserve_dropped_columns``) over them. :class:`RecipeError`
    when this Data Designer refuses them (``python_env`` changed since submit: the check there took them)."""
    import pydantic
    from data_designer.config.run_config import RunConfig

    try:
        return RunConfig.model_validate({**fields, **owned})
    except pydantic.ValidationError:
        lines = [f"{p.field or 'run_config'}: {p.message}" for p in run_config_problems(fields)]
        detail = "; ".join(lines) or "its RunConfig refuses ddslurm's own settings"
        raise RecipeError(f"the Data Designer here refuses the run file's run_config: {detail}") from None


def applied_run_config(config: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The values ``config`` (the ``RunConfig`` a ``DataDesigner`` holds) has for the run file's ``fields``, as Data
    Designer reads them (its enums as their values, nested settings as mappings): what the client log reports."""
    dumped: dict[str, Any] = config.model_dump(mode="json")
    return {name: dumped[name] for name in fields if name in dumped}
