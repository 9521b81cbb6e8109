"""Helpers for tests of the node-side runtime and of tools built on it (like ``ddslurm.launcher.testing``): a
run's inputs as ``ddslurm submit`` writes them, an attempt runner and a controller with their logs kept out of the
way.

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from ddslurm.config import (
    Plan,
    ProviderSnapshot,
    RunLayout,
    SnapshotModel,
    SnapshotProvider,
    atomic_write,
    digest,
    encode,
    encode_pretty,
    make_private_dir,
    sha256_bytes,
)
from ddslurm.config.testing import make_plan
from ddslurm.runtime._attempt import AttemptRunner, Engine
from ddslurm.runtime._controller import Controller
from ddslurm.runtime._engine import EngineRequest, EngineResult
from ddslurm.runtime._inputs import Inputs
from ddslurm.runtime._log import new_logger
from ddslurm.runtime._steps import StepLauncher
from ddslurm.runtime._stop import StopSignal

SAMPLER_RECIPE = b"data_designer:\n  columns:\n  - {name: x, column_type: sampler}\n  model_configs: []\n"
"""A recipe of one sampler column and no model."""
PROVIDER = SnapshotProvider(name="p", endpoint="http://127.0.0.1:9/v1", api_key_env="T_KEY")
"""A hosted provider that nothing answers for (port 9: discard), its key in ``T_KEY``."""
MODEL = SnapshotModel(alias="gen", model="m", provider="p")
"""A model (alias ``gen``) of :data:`PROVIDER`."""
RUNTIME_EXE = Path("/x/ddslurm-runtime")
"""The ``ddslurm-runtime`` a controller puts in its steps' command lines (stand-in launchers never run it)."""


def write_run(
    root: Path,
    shard_records: tuple[int, ...] = (4,),
    *,
    recipe: bytes = SAMPLER_RECIPE,
    providers: tuple[SnapshotProvider, ...] = (PROVIDER,),
    models: tuple[SnapshotModel, ...] = (MODEL,),
    **plan: Any,
) -> RunLayout:
    """The inputs ``ddslurm submit`` writes for the run in ``root`` (its run id: the folder's name): ``recipe``, the
    provider snapshot of ``providers`` and ``models``, and the plan that names both with their sha256: shards of
    ``shard_records`` records, buffers of 2, ``T_KEY`` its secret; ``plan``: any other field. Read them back with
    ``load_inputs``."""
    layout = RunLayout(root)
    make_private_dir(layout.inputs)
    snapshot = encode_pretty(ProviderSnapshot(providers=providers, models=models))
    atomic_write(layout.recipe, recipe)
    atomic_write(layout.snapshot, snapshot)
    written = make_plan(
        root.name,
        shard_records,
        recipe_file=str(layout.recipe),
        recipe_sha256=sha256_bytes(recipe),
        snapshot_file=str(layout.snapshot),
        snapshot_sha256=sha256_bytes(snapshot),
        **{"buffer_size": 2, "secret_env": ("T_KEY",), **plan},
    )
    atomic_write(layout.plan, encode(written))
    return layout


def write_plan(root: Path, plan: Plan, *, snapshot: ProviderSnapshot | None = None) -> tuple[RunLayout, Inputs]:
    """``plan`` written in the run folder ``root``, and the inputs an allocation holds of it: no recipe, ``snapshot``
    (else an empty one). For a controller, whose client steps, not the controller, read the recipe."""
    layout = RunLayout(root)
    make_private_dir(layout.root, exist_ok=True)
    atomic_write(layout.plan, encode(plan))
    if snapshot is None:
        snapshot = ProviderSnapshot()
    return layout, Inputs(plan=plan, plan_sha256=digest(plan), recipe={}, snapshot=snapshot)


def no_engine(request: EngineRequest) -> EngineResult:
    """The engine of a controller's runner: the controller's client steps generate, the controller never does."""
    raise AssertionError(f"no engine here (asked for {request.num_records} records)")


def attempt_runner(
    layout: RunLayout,
    engine: Engine = no_engine,
    *,
    env: Mapping[str, str] | None = None,
    scratch_home: Path | None = None,
    stage: int | None = None,
    **options: Any,
) -> AttemptRunner:
    """A runner of the attempts of ``layout``'s shards (of its ``stage``) that generate with ``engine`` in ``env``
    (else an empty one); each attempt's log goes to the attempt's own file only. ``options``: any other argument
    of :class:`AttemptRunner` (``sleep``, ``jitter``, ...)."""
    return AttemptRunner(
        layout, engine=engine, env={} if env is None else env, scratch_home=scratch_home, make_logger=new_logger,
        stage=stage, **options,
    )  # fmt: skip


def make_controller(
    layout: RunLayout,
    launcher: StepLauncher,
    *,
    env: Mapping[str, str] | None = None,
    scratch_home: Path | None = None,
    stop: StopSignal | None = None,
    **options: Any,
) -> Controller:
    """The controller of an allocation of ``layout``'s run that starts its steps with ``launcher``, in ``env`` (else
    an empty one), and stops on ``stop`` (else a signal of its own); its log is discarded and its runner's attempts
    are generated by the client steps alone. ``options``: the controller's others (``grace``, ``poll``...)."""
    return Controller(
        attempt_runner(layout, scratch_home=scratch_home),
        launcher=launcher,
        env={} if env is None else env,
        runtime_exe=RUNTIME_EXE,
        run_dir=layout.root,
        logger=new_logger(io.BytesIO()),
        http=httpx.Client(),
        stop=StopSignal() if stop is None else stop,
        **options,
    )


def script_answer(
    script: str, *args: str, env: Mapping[str, str], input: str | None = None, timeout: float = 300
) -> Any:
    """Run ``script`` (Python source: the real engine, in a process of its own, whose environment Data Designer
    reads at import) with ``args`` and ``env``, and return the JSON its last line of output holds; the test fails
    with the end of its stderr when it exits with an error."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        input=input,
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
