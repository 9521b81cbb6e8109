"""Capture: load a run's recipe and Data Designer's settings and resolve them into a snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddslurm.config import ConfigFileError, load_run_file, read_yaml, to_builtins
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


def describe_run(run_path: Path, env: Mapping[str, str]) -> Resolution:
    """Like :func:`resolve_run`, but problems are returned with the rows rather than raised (files that cannot
    be read still raise)."""
    run = load_run_file(run_path)
    recipe_path = (run_path.parent / run.recipe).resolve()
    recipe = load_recipe(recipe_path)
    settings = load_settings(settings_dir(env))
    return describe(recipe, Origin(recipe_path), settings, run.deployments, env, run_origin=Origin(run_path))
