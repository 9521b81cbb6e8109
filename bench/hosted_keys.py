"""Many clients against one rate-limited hosted key, with and without ddslurm's shared budget (issue 36).

A stand-in key admits 120 requests a minute and 16 at once (429 with ``Retry-After`` and OpenAI's rate headers
above either, 1 s a request). N client processes at once (8 and 40 by default; ``--clients 8 40 200``) each run
Data Designer's ``create`` on the hosted-only example recipe (two LLM columns a record) for their part of 240
records: **without** the budget each talks to the key directly, as N independent Data Designer processes do
(their own admission each); **with** it each puts the key behind its own gate (``ddslurm.runtime._hosted_gate``)
sharing one budget directory, as a run's client steps do. No Slurm: the two differ only in the budget.

Prints one JSON line a configuration: the share of the key's answers that were 429, the admitted rate as a
fraction of the limit (200s over the minutes from the first request to the last answer, over 120 a minute; above
1 while the key's first minute's bucket lasts), the rows the clients wrote, the failed clients, and the wall
time. ``uv run python bench/hosted_keys.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "hosted-only" / "recipe.yaml"
KEY_ENV = "DEMO_HOSTED_API_KEY"
KEY = "sk-bench-hosted-keys-" + "0" * 16
LIMIT_RPM, LIMIT_AT_ONCE, LATENCY_S, RECORDS = 120, 16, 1.0, 240

CLIENT = r"""
import os, sys, contextlib
from pathlib import Path
import data_designer.config as dd
from data_designer.interface import DataDesigner
import yaml
from ddslurm.config import ProviderSnapshot, SnapshotModel, SnapshotProvider, request_timeout_s
from ddslurm.runtime._engine import checked_aliases
from ddslurm.runtime._hosted_gate import MAX_WAIT_S, HostedGate

endpoint, records, budgets, out, member = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), sys.argv[5]
provider = SnapshotProvider(name="demo-hosted", endpoint=endpoint, api_key_env="DEMO_HOSTED_API_KEY")
gate = HostedGate([provider], budgets=Path(budgets), member=member, requests_file=out / f"{member}.jsonl") \
    if budgets != "-" else None
with (gate.running() if gate else contextlib.nullcontext({})) as hosted:
    url = hosted.get("demo-hosted", endpoint)
    providers = [dd.ModelProvider(name="demo-hosted", endpoint=url, provider_type="openai",
                                  api_key="DEMO_HOSTED_API_KEY")]
    config = yaml.safe_load(Path(sys.argv[6]).read_text())
    if gate:  # as the runtime does: the gate checks each alias under the budget, Data Designer then skips its own
        configs = config["data_designer"]["model_configs"]
        models = [SnapshotModel(alias=m["alias"], model=m["model"], provider="demo-hosted",
                                inference_parameters=m.get("inference_parameters")) for m in configs]
        checked = checked_aliases(gate.check(models, os.environ), ProviderSnapshot(providers=(provider,),
                                                                                   models=tuple(models)))
        for model in configs:  # and waits its timeout plus the gate's hold (recipe_with_models)
            params = model.setdefault("inference_parameters", {})
            params["timeout"] = request_timeout_s(params) + MAX_WAIT_S
            model["skip_health_check"] = model["alias"] in checked
    builder = dd.DataDesignerConfigBuilder.from_config(config)
    designer = DataDesigner(artifact_path=out / member, model_providers=providers)
    designer.set_run_config(dd.RunConfig(buffer_size=max(1, records)))
    result = designer.create(builder, num_records=records, dataset_name="d")
    print("ROWS", len(result.load_dataset()))
"""


def _measure(log: Path, wall_s: float, rows: int, failed: int) -> dict[str, object]:
    chats = [json.loads(line) for line in log.read_text().splitlines() if '"/v1/chat/completions"' in line]
    answered = [c for c in chats if c["status"] in (200, 429)]
    ok = [c for c in answered if c["status"] == 200]
    limited = len(answered) - len(ok)
    times = sorted(float(c["time"]) for c in answered)
    minutes = max((times[-1] - times[0]) / 60, 1 / 60) if times else 1.0
    return {
        "requests": len(answered),
        "share_429": round(limited / len(answered), 4) if answered else None,
        "admitted_of_limit": round(len(ok) / minutes / LIMIT_RPM, 3),
        "rows": rows,
        "failed_clients": failed,
        "wall_s": round(wall_s, 1),
    }


def run(clients: int, budget: bool, root: Path) -> dict[str, object]:
    from fake_vllm.testing import start_server

    log = root / f"key-{clients}-{budget}.jsonl"
    args = ["--served-model-name", "demo/writer-8b", "demo/judge-70b", "--fake-latency", str(LATENCY_S),
            "--fake-rate-limit-rpm", str(LIMIT_RPM), "--fake-rate-limit-in-flight", str(LIMIT_AT_ONCE),
            "--fake-request-log", str(log)]  # fmt: skip
    out = root / f"out-{clients}-{budget}"
    out.mkdir()
    budgets = str(root / f"budgets-{clients}") if budget else "-"
    env = {**os.environ, KEY_ENV: KEY, "DATA_DESIGNER_HOME": str(root / "dd-home")}
    parts = [RECORDS // clients + (i < RECORDS % clients) for i in range(clients)]
    with start_server("demo", args=args, api_key=KEY) as server:
        began = time.monotonic()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, server.base_url, str(n), budgets, str(out), f"c{i}", str(RECIPE)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for i, n in enumerate(parts)
        ]
        outputs = [p.communicate()[0] for p in procs]
        wall = time.monotonic() - began
    rows = sum(int(line.split()[1]) for o in outputs for line in o.splitlines() if line.startswith("ROWS "))
    failed = sum(p.returncode != 0 for p in procs)
    return {"clients": clients, "budget": budget, **_measure(log, wall, rows, failed)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 40])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddslurm-bench-keys-") as tmp:
        root = Path(tmp)
        (root / "dd-home").mkdir()
        for clients in args.clients:
            for budget in (False, True):
                print(json.dumps(run(clients, budget, root)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
