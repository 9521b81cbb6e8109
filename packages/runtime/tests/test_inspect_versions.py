"""``ddslurm-runtime inspect`` answers ``{"action": "versions"}`` with the versions of the distributions the nodes
run, as this environment's package metadata records them, and the plan format it reads (``ddslurm doctor`` judges
them against the submit host's)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from ddslurm.config import LAYOUT_VERSION, PLAN_VERSION


def test_the_versions_answer_is_what_the_package_metadata_records() -> None:
    runtime = Path(sys.executable).parent / "ddslurm-runtime"
    done = subprocess.run(
        [str(runtime), "inspect"], input='{"action": "versions"}', capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    answer = json.loads(done.stdout)
    assert answer == {
        "versions": {name: version(name) for name in ("ddslurm-runtime", "ddslurm-config", "data-designer")},
        "plan": {"version": PLAN_VERSION, "layout": LAYOUT_VERSION},
    }
