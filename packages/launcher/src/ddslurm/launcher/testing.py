"""Helpers for tests of the launcher and of tools built on it (like ``ddslurm.config.testing``).

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

from pathlib import Path

UNIT_RECIPE = """data_designer:
  columns:
  - {name: topic, column_type: sampler, sampler_type: category, params: {sampler_type: category, values: [a, b]}}
  - {name: q, column_type: llm-text, model_alias: writer, prompt: "Say {{ topic }}"}
  model_configs:
  - {alias: writer, model: m-1, provider: hosted, inference_parameters: {temperature: 0.3, max_parallel_requests: 8}}
"""
HOSTED_PROVIDER = "- {name: hosted, endpoint: 'http://127.0.0.1:9/v1', api_key: HOSTED_KEY}\n"


def write_unit_run(
    root: Path,
    key: str,
    *,
    recipe: str = UNIT_RECIPE,
    providers: str = HOSTED_PROVIDER,
    name: str = "unit",
    num_records: int = 10,
    shards: int = 3,
    run_extra: str = "",
) -> tuple[Path, Path, dict[str, str]]:
    """A run file, recipe, Data Designer home (``providers``: the ``providers:`` list) and cluster profile under
    ``root``, with a stand-in ``python_env``; returns (run file, profile, environment holding ``key`` as
    ``HOSTED_KEY``). Submits nothing: pass a fake Slurm to ``submit``."""
    home = root / "dd"
    home.mkdir()
    (home / "model_providers.yaml").write_text("providers:\n" + providers)
    (root / "recipe.yaml").write_text(recipe)
    run = root / "run.yaml"
    run.write_text(f"name: {name}\nrecipe: recipe.yaml\nnum_records: {num_records}\nshards: {shards}\n{run_extra}")
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "ddslurm-runtime").write_text("#!/bin/sh\n")
    profile = root / "profile.yaml"
    profile.write_text("workspace: work\npython_env: venv\npartition: gpu\ncpu_partition: cpu\n")
    return run, profile, {"DATA_DESIGNER_HOME": str(home), "HOSTED_KEY": key, "PATH": "/usr/bin:/bin"}
