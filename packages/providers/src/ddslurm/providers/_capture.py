"""Capture: load a run's recipe and Data Designer's settings and resolve them into a snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddslurm.config import ConfigFileError, load_run_file, locate, parse_recipe_ref, read_yaml, to_builtins
from ddslurm.providers._native import Origin, load_settings
from ddslurm.providers._resolve import Resolution, describe
from ddslurm.providers.discovery import settings_dir
from ddslurm.providers.errors import ResolutionError


def load_recipe(path: Path) -> dict[str, Any]:
    """A recipe as plain data (DD's own YAML or JSON config format)."""
    tree = to_builtins(read_yaml(path))
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


def describe_run(
    run_path: Path, env: Mapping[str, str], *, recipe: tuple[Mapping[str, Any], Path] | None = None
) -> Resolution:
    """Like :func:`resolve_run`, but problems are returned with the rows rather than raised (files that cannot
    be read still raise). ``recipe``: the run's recipe already loaded, and how errors name it (a recipe built by
    a Python script is loaded by the launcher, which runs the script); otherwise the run file's config file."""
    run = load_run_file(run_path)
    if recipe is not None:
        data, origin = recipe
        settings = load_settings(settings_dir(env))
        return describe(data, Origin(origin), settings, run.deployments, env, run_origin=Origin(run_path))
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
    recipe_path = (run_path.parent / run.recipe).resolve()
    loaded = load_recipe(recipe_path)
    settings = load_settings(settings_dir(env))
    return describe(loaded, Origin(recipe_path), settings, run.deployments, env, run_origin=Origin(run_path))
