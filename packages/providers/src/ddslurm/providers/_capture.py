"""Capture: a run's recipe and Data Designer's settings resolved into a snapshot, by one function for every
command that resolves a run's aliases (:func:`describe_run_recipe`: ``ddslurm-providers``, ``ddslurm providers``,
``submit`` and its dry run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddslurm.config import ConfigFileError, RunFile, load_run_file, locate, parse_recipe_ref, read_yaml, to_builtins
from ddslurm.providers._native import Origin, load_settings, with_given_mcp_providers
from ddslurm.providers._resolve import Resolution, describe
from ddslurm.providers.discovery import settings_dir
from ddslurm.providers.errors import ResolutionError


def load_recipe(path: Path, *, text: str | None = None) -> dict[str, Any]:
    """A recipe as plain data (DD's own YAML or JSON config format); ``text``: the file's text, already read."""
    tree = to_builtins(read_yaml(path, text=text))
    if not isinstance(tree, dict):
        raise ConfigFileError(path, "the recipe must be a mapping (a Data Designer config)", line=1, col=1)
    return tree


def resolve_run(run_path: Path, env: Mapping[str, str]) -> Resolution:
    """Load a run file, its recipe and the native settings, and resolve every alias (ResolutionError if any
    problem)."""
    resolution = describe_run(run_path, env)
    if resolution.problems:
        raise ResolutionError(list(resolution.problems))
    return resolution


def describe_run_recipe(
    run: RunFile,
    run_path: Path,
    recipe: Mapping[str, Any],
    recipe_origin: Path | Origin,
    env: Mapping[str, str],
    dd_home: Path,
    *,
    given_mcp_providers: Sequence[tuple[Mapping[str, Any], Origin]] = (),
) -> Resolution:
    """Every alias of ``run``'s recipe (``recipe``, already loaded; ``recipe_origin`` names it in problems: its
    file, or an :class:`Origin` that places its entries in a builder script)
    resolved against ``run``'s deployments and Data Designer's settings in ``dd_home``, with the MCP providers a
    builder script gives Data Designer (``given_mcp_providers``) first: the one resolution of a run, whichever
    command asks. Problems are in the resolution, not raised (files that cannot be read still raise)."""
    settings = with_given_mcp_providers(load_settings(dd_home), given_mcp_providers)
    origin = recipe_origin if isinstance(recipe_origin, Origin) else Origin(recipe_origin)
    return describe(recipe, origin, settings, run.deployments, env, run_origin=Origin(run_path))


def describe_run(run_path: Path, env: Mapping[str, str]) -> Resolution:
    """Like :func:`resolve_run`, but problems are returned with the rows rather than raised (files that cannot
    be read still raise). A recipe built by a Python script is refused: the launcher runs the script and resolves
    what it returns with :func:`describe_run_recipe` (``ddslurm providers --profile``)."""
    run = load_run_file(run_path)
    ref = parse_recipe_ref(run.recipe)
    if ref.kind != "config":
        line, col = locate(read_yaml(run_path), ["recipe"])
        raise ConfigFileError(
            run_path,
            f"{ref} is built by Python, which this command does not run; `ddslurm providers RUN_FILE --profile "
            "PROFILE.yaml` runs it in the profile's python_env and shows how the aliases resolve",
            line=line,
            col=col,
            field="recipe",
        )
    recipe_path = (run_path.parent / ref.target).resolve()
    return describe_run_recipe(run, run_path, load_recipe(recipe_path), recipe_path, env, settings_dir(env))
