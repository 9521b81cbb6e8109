"""The oracle's reference: a plain local, unsharded ``DataDesigner.create`` of the scenario's recipe against a
fault-free stand-in (the same deterministic fake-vllm, serving every model name the recipes use), cached by the
recipe's hash and the number of records."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tools.chaos.draw import Scenario
from tools.chaos.oracle import Reference, build_reference
from tools.chaos.recipes import HOSTED_MODELS, LOCAL_MODEL, SAMPLER_KEYS, SEED_COLUMNS, UUID_COLUMN, write_recipe

DD_DEFAULT_BUFFER_SIZE = 1000  # a plain local DataDesigner.create's batches, where the run file sets none
SEEDLESS_REFERENCE_RECORDS = 72  # 6 sampler combinations: all drawn with probability 1 - 1e-5

# Imports Data Designer once (three seconds of CPU, a tenth of a compact scenario), then runs one reference per
# line on stdin: {"recipe", "records", "endpoint", "out", "cwd", "buffer_size"}; writes the rows to out (as
# collection reads them) and answers one line: {"ok": true} or {"error": "..."}.
ENGINE = r"""
import glob, json, os, sys, tempfile, traceback
home = tempfile.mkdtemp(); os.makedirs(home + "/managed-assets")
os.environ.update(DATA_DESIGNER_HOME=home, NEMO_TELEMETRY_ENABLED="false", HF_HUB_OFFLINE="1",
                  DISABLE_DATA_DESIGNER_PLUGINS="true")
import data_designer.config as dd
import pyarrow.parquet as pq
from data_designer.interface import DataDesigner
answer = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # the engine's own prints go to stderr, the answers alone to the answer pipe
for line in sys.stdin:
    job = json.loads(line)
    try:
        os.chdir(job["cwd"])
        providers = [dd.ModelProvider(name=n, endpoint=job["endpoint"], provider_type="openai")
                     for n in ("local", "chaos-hosted")]
        artifacts = tempfile.mkdtemp(dir=job["cwd"])
        designer = DataDesigner(artifact_path=artifacts, managed_assets_path=home + "/managed-assets",
                                model_providers=providers)
        designer.set_run_config(dd.RunConfig(buffer_size=job["buffer_size"], otel_metrics_port=None))
        builder = dd.DataDesignerConfigBuilder.from_config(job["recipe"])
        designer.create(builder, num_records=job["records"], dataset_name="reference")
        files = sorted(glob.glob(artifacts + "/**/parquet-files/*.parquet", recursive=True))
        rows = [row for f in files for row in pq.read_table(f).to_pylist()]
        with open(job["out"], "w") as fh:
            json.dump({"rows": rows, "columns": pq.read_table(files[0]).column_names}, fh, default=str)
        answer.write(json.dumps({"ok": True}) + "\n")
    except Exception:
        answer.write(json.dumps({"error": traceback.format_exc()[-2000:]}) + "\n")
    answer.flush()
"""

SERVED = (*HOSTED_MODELS, LOCAL_MODEL)


class ReferenceCache:
    """One fault-free stand-in for the campaign and the references computed so far (thread-safe)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._done: dict[str, tuple[Reference, list[str]]] = {}
        self._server: Any = None
        self._engine: subprocess.Popen[str] | None = None
        self._engine_lock = threading.Lock()

    def _endpoint(self) -> str:
        with self._lock:
            if self._server is None:
                from fake_vllm.testing import start_server

                self._cm = start_server(
                    "reference", args=["--served-model-name", *SERVED], log_path=self.root / "reference-server.log"
                )
                self._server = self._cm.__enter__()
            return str(self._server.base_url)

    def close(self) -> None:
        with self._engine_lock:
            if self._engine is not None:
                self._engine.kill()
                self._engine.wait()
                self._engine = None
        with self._lock:
            if self._server is not None:
                self._cm.__exit__(None, None, None)
                self._server = None

    def _ask_engine(self, job: dict[str, Any]) -> None:
        """One reference run by the long-lived engine process (started on first use, again if it died)."""
        with self._engine_lock:
            if self._engine is None or self._engine.poll() is not None:
                env = {k: v for k, v in os.environ.items() if not k.startswith(("DATA_DESIGNER", "FAKE_VLLM"))}
                self._engine = subprocess.Popen(
                    [sys.executable, "-c", ENGINE],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=(self.root / "reference-engine.log").open("a"),
                    text=True,
                    env=env,
                )
            engine = self._engine
            assert engine.stdin is not None and engine.stdout is not None
            engine.stdin.write(json.dumps(job) + "\n")
            engine.stdin.flush()
            line = engine.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the reference engine exited (code {engine.wait()}): see {self.root}/reference-engine.log"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the reference run failed: {answer['error']}")

    def get(self, scenario: Scenario) -> tuple[Reference, list[str]]:
        """The reference of the scenario's recipe and records, and the columns of the dataset it makes."""
        folder = Path(tempfile.mkdtemp(prefix=f"ref-{scenario.seed}-", dir=self.root))
        recipe_path = write_recipe(folder, scenario)
        digest = hashlib.sha256(recipe_path.read_bytes())
        seed = folder / "seed.parquet"
        if seed.exists():
            digest.update(seed.read_bytes())
        records = self._records(scenario)
        key = f"{digest.hexdigest()}-{records}-{scenario.records}"
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self._done:
                rows, columns = self._run(folder, recipe_path, records, scenario.buffer_size or DD_DEFAULT_BUFFER_SIZE)
                self._done[key] = (self._reference(scenario, rows), columns)
            return self._done[key]

    @staticmethod
    def _records(scenario: Scenario) -> int:
        if scenario.seeding == "seedless":
            return max(scenario.records, SEEDLESS_REFERENCE_RECORDS)
        return max(scenario.records, scenario.seed_rows)

    @staticmethod
    def _reference(scenario: Scenario, rows: list[dict[str, Any]]) -> Reference:
        if scenario.seeding == "seedless":
            return build_reference(
                rows, key_columns=SAMPLER_KEYS, records=scenario.records, mode="seedless", unique_column=UUID_COLUMN
            )
        return build_reference(rows, key_columns=SEED_COLUMNS, records=scenario.records, mode=scenario.seeding)

    def _run(
        self, folder: Path, recipe_path: Path, records: int, buffer_size: int
    ) -> tuple[list[dict[str, Any]], list[str]]:
        import yaml

        out = folder / "reference.json"
        job = {
            "recipe": yaml.safe_load(recipe_path.read_text()),
            "records": records,
            "endpoint": self._endpoint(),
            "out": str(out),
            "cwd": str(folder),
            "buffer_size": buffer_size,
        }
        self._ask_engine(job)
        data = json.loads(out.read_text())
        return data["rows"], data["columns"]
