"""A whole ddslurm run on the local Slurm cluster against one rate-limited hosted key (issue 36's done-when).

A stand-in key admits 120 requests a minute and 16 at once (429 with ``Retry-After`` and OpenAI's rate headers
above either, 1 s a request). ``ddslurm submit`` runs the hosted-only example recipe (two LLM columns a record):
by default 240 records over 40 shards, one array task each; ``--shards 200 --allocations 20 --records 600`` runs
200 shards over 20 pulling allocations. It waits for the run and prints one JSON line: its state and rows, the
share of the key's answers that were 429, the admitted rate as a fraction of the limit (200s over the minutes from
the first chat request to the last answer, over 120 a minute), and what ``status --json`` says of the key (which
must equal the stand-in's own count). The baseline in the same line is the key's limit itself (1.0).
``uv run python bench/hosted_cluster.py [--shards N] [--allocations N] [--records N]`` (needs ``make cluster``).
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
BIN = Path(sys.executable).parent
KEY_ENV = "DEMO_HOSTED_API_KEY"
KEY = "sk-bench-hosted-cluster-" + "0" * 12
LIMIT_RPM, LIMIT_AT_ONCE, LATENCY_S = 120, 16, 1.0


def _cli(*args: str, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([str(BIN / "ddslurm"), *args, "--json"], capture_output=True, text=True, env=env)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"ddslurm {' '.join(args)}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def run(root: Path, shards: int, allocations: int | None, records: int) -> dict[str, object]:
    from fake_vllm.testing import start_server

    log = root / "key.jsonl"
    args = ["--served-model-name", "demo/writer-8b", "demo/judge-70b", "--fake-latency", str(LATENCY_S),
            "--fake-rate-limit-rpm", str(LIMIT_RPM), "--fake-rate-limit-in-flight", str(LIMIT_AT_ONCE),
            "--fake-request-log", str(log)]  # fmt: skip
    (root / "dd-home").mkdir(parents=True)
    (root / "recipe.yaml").write_bytes((REPO / "examples" / "hosted-only" / "recipe.yaml").read_bytes())
    layout = f"allocations: {allocations}\n" if allocations else ""
    (root / "run.yaml").write_text(
        f"name: keys\nrecipe: recipe.yaml\nnum_records: {records}\nshards: {shards}\n{layout}"
        "submission:\n  time_limit: '01:00:00'\n  cpus: 1\n  memory: 400M\n"
    )
    (root / "profile.yaml").write_text(
        f"name: bench\nworkspace: {root / 'work'}\npython_env: {REPO / '.venv'}\npartition: gpu\ncpu_partition: cpu\n"
    )
    env = {**os.environ, KEY_ENV: KEY, "DATA_DESIGNER_HOME": str(root / "dd-home")}
    with start_server("demo", args=args, api_key=KEY) as server:
        (root / "dd-home" / "model_providers.yaml").write_text(
            f"providers:\n- {{name: demo-hosted, endpoint: '{server.base_url}', api_key: {KEY_ENV}}}\n"
        )
        began = time.monotonic()
        submitted = _cli("submit", str(root / "run.yaml"), "--profile", str(root / "profile.yaml"), env=env)
        final = _cli("wait", str(submitted["run_dir"]), env=env)
        wall = time.monotonic() - began
        status = _cli("status", str(submitted["run_dir"]), env=env)
    chats = [json.loads(line) for line in log.read_text().splitlines() if '"/v1/chat/completions"' in line]
    ok = [c for c in chats if c["status"] == 200]
    times = sorted(float(c["time"]) for c in chats)
    minutes = max((times[-1] - times[0]) / 60, 1 / 60) if times else 1.0
    [key] = status["hosted"]  # type: ignore[misc]
    return {
        "shards": shards,
        "allocations": allocations,
        "state": final["state"],
        "rows": final["records_done"],
        "requests": len(chats),
        "share_429": round((len(chats) - len(ok)) / len(chats), 4) if chats else None,
        "admitted_of_limit": round(len(ok) / minutes / LIMIT_RPM, 3),
        "status_requests": key["requests"],
        "status_429": key["limited"],
        "wall_s": round(wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--allocations", type=int, default=None)
    parser.add_argument("--records", type=int, default=240)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddslurm-bench-cluster-keys-") as tmp:
        print(json.dumps(run(Path(tmp), args.shards, args.allocations, args.records)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
