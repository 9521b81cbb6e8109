"""The ``tune`` command: a calibration run, its progress on stderr, then what it measured as a table (or JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from ddslurm.launcher.commands._output import ExitCode, write_json
from ddslurm.launcher.commands._session import JsonOpt, ProfileOpt, command_session, guarded
from ddslurm.launcher.errors import UsageError
from ddslurm.launcher.runs._find import resolve_profile
from ddslurm.launcher.runs._follow import SchedulerBusy
from ddslurm.launcher.runs._status_model import RunStatus

if TYPE_CHECKING:
    from ddslurm.config import Facts
    from ddslurm.launcher.facts._tune_facts import TuneResult


def tune_json(result: TuneResult, facts: Facts) -> dict[str, Any]:
    """What ``tune --json`` prints: the run, each alias's model fact, the recipe's fact, the facts file's size."""
    from msgspec import to_builtins

    return {
        "run_id": result.run_id,
        "run_dir": result.run_dir,
        "models": [{"alias": alias, **to_builtins(fact)} for alias, fact in result.models],
        "recipe": to_builtins(result.recipe),
        "compared": to_builtins(result.compared),
        "facts": {"models": len(facts.models), "recipes": len(facts.recipes)},
    }


def tune_lines(result: TuneResult) -> list[str]:
    """The table: per alias its model shape, load seconds and requests per second at each level; then the
    recipe's requests per record and the client's CPU per request."""
    from ddslurm.launcher.facts._fact_check import fact_line

    levels = sorted({p.in_flight for _, f in result.models for p in f.sweep})
    head = ["alias", "model (tp/pp/dp, gpu)", "load s", *(f"@{n} req/s" for n in levels)]
    rows = []
    for alias, fact in result.models:
        shape = fact.shape
        rates = {p.in_flight: f"{p.requests_per_s:.2f}" for p in fact.sweep}
        where = f"{shape.model} ({shape.tensor_parallel}/{shape.pipeline_parallel}/{shape.data_parallel}, " \
                f"{shape.gpu_type or '-'})"  # fmt: skip
        rows.append([alias, where, f"{fact.load_s:.1f}", *(rates.get(n, "") for n in levels)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [f"calibration run {result.run_id} ({result.run_dir})"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    recipe = result.recipe
    per_record = ", ".join(f"{a} {n:g}" for a, n in recipe.requests_per_record.items()) or "none counted"
    cpu = "not measured" if recipe.client_cpu_s_per_request is None else f"{recipe.client_cpu_s_per_request:.4f} s"
    lines.append(f"recipe: requests per record: {per_record}; client CPU per request: {cpu}")
    if result.compared:
        lines.append("planned with before this calibration / measured (ratio):")
        lines += [f"  {fact_line(f)}" for f in result.compared]
    lines.append("recorded in the workspace's facts.json (measured_by: tune)")
    return lines


def _progress(err: TextIO) -> Any:
    said: list[str] = []

    def update(polled: RunStatus | SchedulerBusy) -> None:
        if isinstance(polled, SchedulerBusy):
            line = f"tune: scheduler query failed ({polled.error}); retrying in {polled.retry_in:.0f} s"
        else:
            line = f"tune: {polled.state}, {polled.records_done}/{polled.records_requested} records"
        if not said or said[-1] != line:
            said.append(line)
            err.write(line + "\n")
            err.flush()

    return update


@guarded
def cmd_tune(
    ctx: typer.Context,
    run_file: Annotated[
        Path, typer.Argument(metavar="RUN_FILE", help="The run file to calibrate.", show_default=False)
    ],
    profile: ProfileOpt = None,
    records: Annotated[
        int | None,
        typer.Option(
            "--records",
            metavar="N",
            help="Records of the calibration run (default 64, at most the run file's num_records).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> int:
    """Measure the run's model shapes and recipe in a short calibration run; record them in the workspace's facts.

    Examples:
        # Calibrate the run's models and recipe with a short run (64 records)
        ddslurm tune run.yaml --profile profile.yaml

        # A shorter calibration run, its measurements as JSON
        ddslurm tune run.yaml --profile profile.yaml --records 16 --json
    """
    from ddslurm.launcher.facts._tune import tune

    session = command_session(ctx, as_json)
    profile_path = resolve_profile(profile, session.env)
    if profile_path is None:
        raise UsageError("tune needs --profile PROFILE.yaml (the cluster profile), or DDSLURM_PROFILE naming it")
    err = session.err

    def submitted(run_dir: Path) -> None:
        err.write(f"tune: submitted the calibration run {run_dir.name} ({run_dir})\n")
        err.flush()

    result, facts = tune(
        run_file,
        profile_path,
        slurm=session.slurm,
        env=session.env,
        records=records,
        on_update=_progress(err),
        on_submitted=submitted,
        sleep=session.sleep,
    )
    if session.json:
        write_json(tune_json(result, facts), session.out)
    else:
        session.out.write("\n".join(tune_lines(result)) + "\n")
    return ExitCode.OK
