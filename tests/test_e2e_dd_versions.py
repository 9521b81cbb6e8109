"""Data Designer versions on the real local Slurm cluster: the submit host and the nodes may hold different
supported Data Designer versions (docs/cli.md#doctor).

One ``python_env`` holds Data Designer ``NODE_DD`` (the newest the runtime supports, ``DD_NEWEST`` of the Makefile;
``DDSLURM_NODE_DD`` chooses another) and all of ddslurm (this checkout, editable): it is the nodes' environment,
and a submit host's too. The mixed example (local generator on the vLLM stand-in, hosted judge), over 2 shards, is
submitted twice to those nodes at once: by the launcher installed beside ``NODE_DD`` (that environment's own
``ddslurm``), and by this workspace's launcher (its Data Designer, 0.9.7). Both succeed, their plans record
``NODE_DD``, and both datasets hold the rows of a plain local ``DataDesigner.create`` of the same recipe under
``NODE_DD`` (the oracle), value for value (the stand-ins reply as a function of the request).
"""

from __future__ import annotations

import json
import subprocess
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ddslurm.config import ProviderSnapshot, SnapshotProvider, read_json, read_plan
from tests.e2e import NODE_DD, REPO, dd_python_env, generator, one_draw_recipe, vllm_stand_in
from tests.e2e import cli_json as _cli

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

GENERATOR = generator(env={"FAKE_VLLM_LATENCY": "0.01", "FAKE_VLLM_STARTUP_DELAY": "1"})


@pytest.fixture(scope="module")
def dd_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``python_env`` of Data Designer ``NODE_DD`` and every ddslurm package of this checkout (editable)."""
    return dd_python_env(tmp_path_factory, NODE_DD)


# A plain local DataDesigner.create of the run's recipe (its model configs the snapshot's) over the same
# providers, written to a Parquet file: job {"run_dir", "endpoints": {provider: url}, "out", "parquet"}.
ORACLE = r"""
import json, os, sys, tempfile
from pathlib import Path
from ddslurm.runtime._engine import _estimate_tokens_offline, engine_environment, provider_key_env
home = Path(tempfile.mkdtemp()) / "dd-home"
os.environ.update(engine_environment(home))
import data_designer.config as dd
from data_designer.interface import DataDesigner
from ddslurm.config import RunLayout, recipe_with_models
from ddslurm.runtime import load_inputs
_estimate_tokens_offline()
job = json.loads(sys.argv[1])
inputs = load_inputs(RunLayout(Path(job["run_dir"])))
providers = [dd.ModelProvider(name=p.name, endpoint=job["endpoints"].get(p.name, p.endpoint), provider_type="openai",
                              api_key=provider_key_env(p)) for p in inputs.snapshot.providers]
designer = DataDesigner(artifact_path=Path(job["out"]), model_providers=providers,
                        managed_assets_path=home / "managed-assets")
designer.set_run_config(dd.RunConfig(buffer_size=inputs.plan.buffer_size, otel_metrics_port=None))
builder = dd.DataDesignerConfigBuilder.from_config(recipe_with_models(inputs.recipe, inputs.snapshot, None))
result = designer.create(builder, num_records=inputs.plan.num_records, dataset_name="oracle")
result.load_dataset().to_parquet(job["parquet"])
"""


def _submit(ddslurm: Path, files: Any) -> Path:
    """``ddslurm submit`` of ``files`` by the launcher ``ddslurm``; the run directory."""
    done = subprocess.run(
        [str(ddslurm), "submit", str(files.run_file), "--profile", str(files.profile), "--json"],
        capture_output=True, text=True, env=files.env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{ddslurm}: rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return Path(json.loads(done.stdout)["run_dir"])


def _rows(path: Path) -> list[dict[str, Any]]:
    return sorted(pq.read_table(path).to_pylist(), key=lambda row: json.dumps(row, sort_keys=True, default=str))


def test_a_mixed_run_under_other_data_designer_versions_has_the_laptops_rows(
    make_run_files: Any, dd_env: Path, tmp_path: Path
) -> None:
    recipe = one_draw_recipe(tmp_path)  # one draw of the recipe's sampler: every value is a function of the row
    common = {"num_records": 6, "shards": 2, "buffer_size": 3, "recipe": recipe, "extra_run": GENERATOR}
    runs = {}
    for name, ddslurm in (("beside", dd_env / "bin" / "ddslurm"), ("workspace", REPO / ".venv" / "bin" / "ddslurm")):
        files = make_run_files(name, vllm_executable=vllm_stand_in(tmp_path, name), **common)
        files.profile.write_text(
            files.profile.read_text().replace(f"python_env: {REPO / '.venv'}", f"python_env: {dd_env}")
        )
        runs[name] = (files, _submit(ddslurm, files))  # both at once: they share the cluster
    files = runs["workspace"][0]

    # doctor on this submit host accepts the nodes' other version, and says which each side has
    checks = _cli("doctor", "--profile", str(files.profile), "--json", env=files.env)["checks"]
    python_env = next(c for c in checks if c["name"] == "python_env")
    here = version("data-designer")
    assert python_env["status"] == "ok", python_env
    side = "on the nodes and the submit host" if here == NODE_DD else f"on the nodes, {here} on the submit host"
    assert f"data-designer {NODE_DD} {side}" in python_env["detail"], python_env

    datasets = {}
    for name, (files, run_dir) in runs.items():
        final = _cli("wait", str(run_dir), "--json", env=files.env)
        logs = "\n".join(p.read_text()[-2000:] for p in run_dir.glob("shards/*/**/client.out"))
        assert final["state"] == "succeeded", f"{name}: {final}\n{logs}"
        assert read_plan(run_dir / "run.json").data_designer_version == NODE_DD
        datasets[name] = Path(_cli("collect", str(run_dir), "--json", "--local", env=files.env)["dataset"])

    from fake_vllm.testing import start_server

    run_dir = runs["workspace"][1]
    parquet = tmp_path / "oracle.parquet"
    with start_server("qwen3-8b", log_path=tmp_path / "oracle-generator.log") as local:
        local_provider = next(p.name for p in _providers(run_dir) if p.local)
        job = {
            "run_dir": str(run_dir),
            "endpoints": {local_provider: local.base_url},
            "out": str(tmp_path / "oracle"),
            "parquet": str(parquet),
        }
        done = subprocess.run(
            [str(dd_env / "bin" / "python"), "-c", ORACLE, json.dumps(job)],
            env=files.env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    oracle = _rows(parquet)
    assert len(oracle) == 6
    for name, dataset in datasets.items():
        assert _rows(dataset) == oracle, name
        assert set(pq.read_table(dataset).column_names) == set(pq.read_table(parquet).column_names), name


def _providers(run_dir: Path) -> tuple[SnapshotProvider, ...]:
    """The providers of the run's snapshot."""
    return read_json(Path(read_plan(run_dir / "run.json").snapshot_file), ProviderSnapshot).providers
