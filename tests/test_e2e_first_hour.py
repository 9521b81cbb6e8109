"""A newcomer's first hour on the embedded cluster: ``ddslurm init --example mixed --dir TMP/x``, then every command
it prints (read from its ``--json``), in one shell, as they stand: the key made up in the shell, the hosted stand-in
started on the port init chose, ``providers``, the dry run, ``submit``, ``wait``, ``collect`` and ``report``. The
dataset holds the run's rows, and the key was never on a command line nor in a file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.e2e import DDSLURM

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

BIN = Path(DDSLURM).parent
"""This environment's entry points (ddslurm, fake-vllm), on the shell's PATH as after `source .venv/bin/activate`."""
CHECKS = """\
tr '\\0' ' ' < "/proc/$!/cmdline" > stand-in.cmdline
python3 - "$DATA_DESIGNER_HOME" > unauthenticated.status <<'PY'
import sys, urllib.error, urllib.request
endpoint = open(sys.argv[1] + "/model_providers.yaml").read().split("endpoint: ")[1].split()[0]
try:
    print(urllib.request.urlopen(endpoint + "/models", timeout=10).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
PY
printf '%s\\n%s\\n' "$RUN_DIR" "$STAND_IN_API_KEY" > harness.out
"""
"""What the test reads afterwards, run in the same shell: the stand-in's command line (as ps shows it), what it
answers a request without the key, the run directory and the key the shell made up."""


def test_the_commands_init_prints_take_a_new_user_to_a_dataset(tmp_path: Path, scan_for_secret: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"UV", "DATA_DESIGNER_HOME", "DDSLURM_PROFILE"}}
    env["PATH"] = f"{BIN}:{env['PATH']}"
    target = tmp_path / "x"
    init = subprocess.run(
        ["ddslurm", "init", "--example", "mixed", "--dir", str(target), "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    shown = json.loads(init.stdout)
    assert shown["embedded"] is True and shown["todo"] is None and shown["name"] == "x"
    commands = [step["command"] for step in shown["next"]]

    script = "\n".join(["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT", *commands, CHECKS])
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    run_dir, key = (tmp_path / "harness.out").read_text().splitlines()
    assert Path(run_dir).parent == target / "ddslurm-work" / "runs" and len(key) == 32

    rows = 20  # the run file's num_records, read back below
    assert f"num_records: {rows}\n" in (target / "run.yaml").read_text()
    table = pq.read_table(Path(run_dir) / "dataset")
    assert table.num_rows == rows
    data = table.to_pylist()
    assert {r["topic"] for r in data} <= {"weather", "bread", "trains", "gardens"}
    assert all(r["question"] for r in data) and all(r["question_chars"] == len(r["question"]) for r in data)
    assert all(r["quality"]["Clarity"]["score"] in {"1", "2", "3", 1, 2, 3} for r in data)  # the hosted judge's
    assert (Path(run_dir) / "report.html").is_file()

    assert (tmp_path / "unauthenticated.status").read_text().strip() == "401"  # the stand-in required the key
    assert "fake-vllm serve stand-in" in (tmp_path / "stand-in.cmdline").read_text()
    assert key not in (tmp_path / "stand-in.cmdline").read_text()
    assert key not in done.stdout + done.stderr
    assert scan_for_secret(target, key) == []
