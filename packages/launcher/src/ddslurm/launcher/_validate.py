"""Data Designer's own validation of a recipe, on the submit host, before anything is written or submitted.

A recipe that Data Designer refuses (a Jinja reference to a column that does not exist, a column config it
cannot read) would otherwise fail on the node after the allocation started. Data Designer prints the details of
what it refuses (a rich panel per problem) and raises a generic ``InvalidConfigError``; the details are taken
from its validation step itself, so the message names the column and the problem.

The check runs in a subprocess (``python -m ddslurm.launcher._validate``): Data Designer reads its home directory
and telemetry settings at import time and writes default settings files into its home when constructed, so it
gets a scratch home, telemetry and plugins off and the Hugging Face hub offline, and the submitting process
never imports it. It gets the recipe with the snapshot's model configs (as the node will run it), providers
without endpoints or keys (validation sends no request), and the recipe's directory as its working directory
(relative seed paths).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddslurm.config import ProviderSnapshot, ServingPlan, recipe_section, recipe_with_models

VALIDATE_TIMEOUT_S = 300
_PLACEHOLDER_ENDPOINT = "http://127.0.0.1:9/v1"  # never contacted: validation sends no request
_ACCEPTED: set[str] = set()


def dd_check_recipe(
    recipe: Mapping[str, Any], recipe_path: Path, snapshot: ProviderSnapshot, serving: ServingPlan | None
) -> list[str]:
    """What Data Designer refuses in ``recipe`` (one line per problem, its own words), or [] when it accepts it.
    ``serving``: the plan's deployments, which size the local aliases' ``max_parallel_requests`` as on the node."""
    payload: dict[str, Any] = {
        "recipe": recipe_with_models(recipe, snapshot, serving),  # the recipe exactly as the node builds it
        "providers": [{"name": p.name, "provider_type": p.provider_type} for p in snapshot.providers],
    }
    # An accepted recipe without a seed dataset (whose files may change) is accepted again without asking.
    key = None if recipe_section(payload["recipe"]).get("seed_config") else json.dumps(payload, sort_keys=True)
    if key is not None and key in _ACCEPTED:
        return []
    problems = _run_check(payload, recipe_path.parent, set(snapshot.secret_env_names()))
    if key is not None and not problems:
        _ACCEPTED.add(key)
    return problems


def _run_check(payload: dict[str, Any], cwd: Path, secrets: set[str]) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="ddslurm-validate-") as scratch:
        payload = {**payload, "scratch": scratch}
        env = {k: v for k, v in os.environ.items() if k not in secrets and not k.startswith("DATA_DESIGNER_")}
        env |= {
            "DATA_DESIGNER_HOME": scratch,
            "DATA_DESIGNER_MANAGED_ASSETS_PATH": str(Path(scratch) / "managed-assets"),
            "NEMO_TELEMETRY_ENABLED": "false",
            "HF_HUB_OFFLINE": "1",
            "DISABLE_DATA_DESIGNER_PLUGINS": "true",
        }
        try:
            done = subprocess.run(
                [sys.executable, "-m", "ddslurm.launcher._validate"],
                input=json.dumps(payload),
                capture_output=True,
                text=True,
                cwd=cwd,
                env=env,
                timeout=VALIDATE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return [f"Data Designer's validation did not finish within {VALIDATE_TIMEOUT_S} s"]
    try:
        problems = json.loads(done.stdout)["problems"]
    except (ValueError, KeyError, TypeError):
        tail = "\n".join(done.stderr.strip().splitlines()[-10:])
        return [f"Data Designer's validation could not run (exit code {done.returncode}):\n{tail}"]
    return [str(p) for p in problems]


def violation_lines(violations: list[Any]) -> list[str]:
    """Data Designer's error-level validation violations as lines: ``column 'q': <its message>``."""
    lines = []
    for v in violations:
        level = str(getattr(getattr(v, "level", ""), "value", getattr(v, "level", ""))).lower()
        if level != "error":
            continue
        column = getattr(v, "column", None)
        message = str(getattr(v, "message", v)).strip()
        lines.append(f"column {column!r}: {message}" if column else message)
    return lines


def _check(payload: dict[str, Any]) -> list[str]:
    import data_designer.config as dd
    from data_designer.interface import DataDesigner

    recorded: list[Any] = []
    try:  # where Data Designer reports the violations before it raises its generic error
        from data_designer.engine import compiler

        report = compiler.rich_print_violations

        def record(violations: list[Any]) -> None:
            recorded.extend(violations)
            report(violations)

        compiler.rich_print_violations = record
    except (ImportError, AttributeError):
        pass
    try:
        builder = dd.DataDesignerConfigBuilder.from_config(payload["recipe"])
    except Exception as exc:
        return [f"not a valid Data Designer config: {exc}"]
    home = Path(payload["scratch"])
    (home / "managed-assets").mkdir(parents=True, exist_ok=True)
    providers = [
        dd.ModelProvider(name=p["name"], endpoint=_PLACEHOLDER_ENDPOINT, provider_type=p["provider_type"], api_key=None)
        for p in payload["providers"]
    ] or [dd.ModelProvider(name="ddslurm-validate", endpoint=_PLACEHOLDER_ENDPOINT, api_key=None)]  # DD needs one
    designer = DataDesigner(
        artifact_path=home / "artifacts", model_providers=providers, managed_assets_path=home / "managed-assets"
    )
    try:
        designer.validate(builder)
    except Exception as exc:
        return violation_lines(recorded) or [f"{type(exc).__name__}: {exc}"]
    return []


def main() -> int:
    payload = json.load(sys.stdin)
    result = os.dup(1)
    os.dup2(2, 1)  # Data Designer prints its report to stdout: keep stdout for the result
    problems = _check(payload)
    with os.fdopen(result, "w") as out:
        json.dump({"problems": problems}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
