"""The CPU-seconds of a client-like process: Data Designer imported as the client step imports it, then ``create()``.

Each process imports :data:`ddslurm.runtime._engine.PRELOAD_MODULES` and runs one ``DataDesigner.create`` of a
sampler and an LLM column against one vLLM stand-in, then exits; the benchmark reads its CPU-seconds (user + system,
``getrusage`` of the waited-for child, so the interpreter's exit counts). Two variants, alternated in the same run:

- ``plain``: the modules imported one by one (the baseline: the client before ``frozen_imports``);
- ``frozen``: :func:`ddslurm.runtime._engine.preload_engine`, which imports them with the collector off and freezes
  what they built (:func:`ddslurm.config.frozen_imports`).

    uv run python bench/client_cpu.py [--records 60] [--repeat 5]

Prints one JSON line per process and a summary line: each variant's median CPU-seconds (import, ``create()`` and
the exit) and the ratio frozen / plain. The CPUs of the benchmark machine may be shared: compare the ratio, which
both variants measured minutes apart under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fake_vllm.testing import start_server

CLIENT = """
import json, os, resource, sys, time
os.environ["NEMO_TELEMETRY_ENABLED"] = "false"
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
from ddslurm.runtime._engine import PRELOAD_MODULES, preload_engine
start = cpu()
if sys.argv[1] == "frozen":
    preload_engine()
else:
    import importlib
    for name in PRELOAD_MODULES:
        importlib.import_module(name)
imported = cpu()
import data_designer.config as dd
from data_designer.interface import DataDesigner
job = json.loads(sys.argv[2])
provider = dd.ModelProvider(name="bench", endpoint=job["endpoint"], provider_type="openai", api_key="BENCH_KEY")
designer = DataDesigner(artifact_path=job["out"], model_providers=[provider])
builder = dd.DataDesignerConfigBuilder(model_configs=[dd.ModelConfig(alias="gen", model="m", provider="bench")])
builder.add_column(dd.SamplerColumnConfig(name="topic", sampler_type="category",
                                          params=dd.CategorySamplerParams(values=["rain", "salt", "moss"])))
builder.add_column(dd.LLMTextColumnConfig(name="text", model_alias="gen", prompt="Write about {{ topic }}"))
designer.create(builder, num_records=job["records"])
print(json.dumps({"import_s": imported - start, "create_s": cpu() - imported}))
"""


def one(variant: str, endpoint: str, records: int, folder: Path) -> dict[str, float | str]:
    """One client-like process of ``variant``: its CPU-seconds, whole (exit included) and by phase."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(folder),
        "BENCH_KEY": "bench-key",
        "DATA_DESIGNER_HOME": str(folder / "dd-home"),
        "TIKTOKEN_CACHE_DIR": str(folder / "no-tiktoken"),
    }
    job = {"endpoint": endpoint, "records": records, "out": str(folder / variant)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, variant, json.dumps(job)],
        capture_output=True, text=True, env=env, cwd=folder, timeout=300, check=False,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the {variant} client failed:\n{done.stderr[-3000:]}")
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"variant": variant, "cpu_s": round(total, 3), **{k: round(v, 3) for k, v in phases.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float | str]]] = {"plain": [], "frozen": []}
    with tempfile.TemporaryDirectory(prefix="bench-client-cpu-") as tmp, start_server("m", api_key="bench-key") as s:
        for i in range(args.repeat):
            for variant in ("plain", "frozen") if i % 2 == 0 else ("frozen", "plain"):
                row = one(variant, s.base_url, args.records, Path(tmp))
                results[variant].append(row)
                print(json.dumps(row), flush=True)

    def median(variant: str, key: str) -> float:
        return round(statistics.median(float(r[key]) for r in results[variant]), 3)

    summary = {key: {v: median(v, key) for v in results} for key in ("cpu_s", "import_s", "create_s")}
    summary["ratio_frozen_to_plain"] = {"cpu_s": round(summary["cpu_s"]["frozen"] / summary["cpu_s"]["plain"], 3)}
    print(json.dumps({"summary": summary, "records": args.records, "repeat": args.repeat}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
