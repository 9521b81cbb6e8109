"""The run's model aliases as ``submit`` resolves them, and what their hosted endpoints answer.

One path for ``submit`` (and its dry run) and ``ddslurm providers``: the recipe is loaded by
:func:`~ddslurm.launcher.submission._recipe.load_run_recipe` (a builder script runs in the profile's ``python_env``),
and every alias it uses is resolved by the providers' one resolution of a run
(:func:`ddslurm.providers.describe_run_recipe`, which ``ddslurm-providers`` uses too, with the MCP providers the
script gives), its problems listed rather than raised (``providers`` shows them in its table; ``submit`` refuses
them).

``submit --check-endpoints`` asks each hosted provider's ``/models`` with the key
(:func:`ddslurm.providers.check_endpoints`, as ``providers --check`` does) before anything is written, and refuses
the run, one line per alias, when an endpoint refuses the key, does not list the model, or does not answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from ddslurm.config import RunFile, load_profile, load_run_file
from ddslurm.launcher.cluster._doctor_checks import field_place
from ddslurm.launcher.cluster._engine_host import RUNTIME_PROCESS, EngineHost
from ddslurm.launcher.cluster._python_env import python_env_problem, runtime_command
from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.submission._recipe import LoadedRecipe, StageRequest, load_run_recipe
from ddslurm.providers import AliasRow, Resolution, describe_run_recipe
from ddslurm.providers.discovery import settings_dir

EndpointCheck = Callable[[Resolution, Mapping[str, str]], Resolution]
"""(the resolution, the shell's environment) -> the resolution with every hosted row's ``check`` filled in
(:func:`ddslurm.providers.check_endpoints`)."""

NOT_CHECKED = "not checked"
"""How a check result that asked nothing begins (a literal key, an endpoint that carries credentials)."""


def run_aliases(
    run: RunFile,
    run_path: Path,
    env: Mapping[str, str],
    dd_home: Path,
    *,
    runtime: Path | None,
    host: EngineHost = RUNTIME_PROCESS,
    stage: StageRequest | None = None,
    run_text: str | None = None,
) -> tuple[LoadedRecipe, Resolution]:
    """The run's recipe, loaded as ``submit`` loads it (``runtime``: ``<python_env>/bin/ddslurm-runtime``, which runs
    a builder script, asked through ``host``), and every alias it uses resolved against Data Designer's settings in
    ``dd_home`` and the MCP providers the script gives; the problems that would stop a submission are in the
    resolution. ``run_text``: the run file's text as read (``submit`` reads it once), else read here."""
    loaded = load_run_recipe(run, run_path, env, dd_home, runtime=runtime, host=host, stage=stage, run_text=run_text)
    resolution = describe_run_recipe(
        run,
        run_path,
        loaded.data,
        loaded.content_origin(),
        env,
        dd_home,
        given_mcp_providers=loaded.given_mcp_providers(),
    )
    return loaded, resolution


def describe_aliases(
    run_path: Path, env: Mapping[str, str], profile_path: Path | None, *, home: Path | None = None
) -> Resolution:
    """``ddslurm providers``: how the aliases of ``run_path`` resolve, exactly as ``submit`` with ``profile_path``
    resolves them. A recipe built by Python runs in the profile's ``python_env``, so it needs the profile; a config
    file does not."""
    run = load_run_file(run_path)
    runtime = None
    if profile_path is not None:
        python_env = load_profile(profile_path).python_env
        untrusted = python_env_problem(python_env)  # before a builder script runs in it
        if untrusted is not None:
            where, field = field_place("profile.python_env", None, profile_path)
            raise SubmitError(f"{where}: {field}: {untrusted}")
        runtime = runtime_command(python_env)
    return run_aliases(run, run_path, env, settings_dir(env, home), runtime=runtime)[1]


def _alias_line(row: AliasRow) -> str:
    key = f", key {row.key_env}" if row.key_env else ""
    return f"  {row.alias}: {row.check} (provider {row.provider}, {row.endpoint}, model {row.model}{key})"


def refuse_failed_endpoints(resolution: Resolution, env: Mapping[str, str], check: EndpointCheck) -> Resolution:
    """``resolution`` checked (``check``); a :class:`SubmitError` naming each alias whose endpoint refused the key,
    does not list the model, answered something else or could not be reached. Rows that could not be checked (a
    literal key, credentials in the endpoint) are not a refusal: their result is in the rows."""
    checked = check(resolution, env)
    failed = [r for r in checked.rows if r.check not in (None, "ok") and not str(r.check).startswith(NOT_CHECKED)]
    if failed:
        lines = "\n".join(_alias_line(row) for row in failed)
        raise SubmitError(
            f"--check-endpoints: {len(failed)} hosted model alias(es) would fail on the nodes; nothing was written "
            f"or submitted:\n{lines}\n  Export the right key (or fix the model or the provider in Data Designer's "
            "settings) and submit again; `ddslurm providers RUN_FILE --check` shows every alias"
        )
    return checked
