"""Run every benchmark in bench/ (each prints ratios against a baseline measured in the same run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = [
    "client_cpu.py",
    "client_path.py",
    "collect.py",
    "gpu_busy.py",
    "hosted_cluster.py",
    "hosted_keys.py",
    "proxy.py",
    "startup.py",
    "submit.py",
]


def main() -> int:
    here = Path(__file__).resolve().parent
    rc = 0
    for name in BENCHES:
        print(f"== {name}", flush=True)
        rc |= subprocess.run([sys.executable, str(here / name)], check=False).returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
