"""Issue 37, item 3 on the local Slurm cluster, with a second, unprivileged user (``nobody``): files another user
can plant in a workspace.

``nobody`` plants a ``facts.json`` of fake measurements (a load of a second, a crawling replica: every GPU at once
looks cheapest) in a workspace that was made writable by every user with the sticky bit (ddslurm's old advice).
``submit --dry-run`` refuses that workspace at the profile's ``workspace`` and says to use a directory of one's own;
once the workspace is the user's alone, the planted file left in it is ignored with a warning (the plan is the one
no facts give), and a FIFO planted in its place neither hangs the dry run nor is read.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import MIXED_RECIPE, NOBODY, as_nobody, generator, run_cli

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.dd,
    pytest.mark.skipif(os.getuid() != 0 or not Path("/usr/bin/python3").exists(), reason="another user needs root"),
]

FAKE = {
    "version": 1,
    "models": [
        {
            "shape": {"engine": "vllm", "model": "Qwen/Qwen3-8B", "tensor_parallel": 1, "pipeline_parallel": 1,
                      "data_parallel": 1, "gpu_type": ""},
            "load_s": 1.0, "requests_per_s": 0.01, "capacity": 8, "measured_by": "run", "run_id": "planted",
            "measured_at": "2026-01-01T00:00:00+00:00",
        }
    ],
    "recipes": [],
}  # fmt: skip
"""The fake measurement of the generator's shape (the local cluster's GRES are untyped: GPU type "")."""

PLANT = r"""
import json, os, sys
path, text, fifo = sys.argv[1], sys.argv[2], sys.argv[3] == "fifo"
if os.path.lexists(path):
    os.remove(path)  # their own file: the sticky bit lets them replace it
if fifo:
    os.mkfifo(path, 0o666)
else:
    with open(path, "w") as fh:
        fh.write(text)
st = os.lstat(path)
print(st.st_uid, oct(st.st_mode))
"""


def _dry_run(files: Any, env: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    """``submit --dry-run --json``: its exit status, its JSON and its standard error (the subprocess's timeout is a
    safety net against a hang, nothing is timed)."""
    done = run_cli("submit", str(files.run_file), "--profile", str(files.profile), "--dry-run", "--json", env=env,
                   timeout=300)  # fmt: skip
    return done.returncode, json.loads(done.stdout), done.stderr


def test_planted_facts_and_a_fifo_in_a_workspace_are_neither_trusted_nor_waited_on(make_run_files: Any) -> None:
    extra = "gpus: 4\n" + generator(extra_args=["--max-num-seqs", "8"])
    files = make_run_files("planted", num_records=40, shards=8, buffer_size=None, recipe=MIXED_RECIPE, extra_run=extra)
    project = Path(tempfile.mkdtemp(prefix="ddslurm-shared-ws-", dir="/tmp"))
    project.chmod(0o755)  # nobody can reach the workspace
    try:
        workspace = project / "ws"
        workspace.mkdir(mode=0o700)
        files.profile.write_text(files.profile.read_text().replace(f"workspace: {files.workspace}",
                                                                   f"workspace: {workspace}"))  # fmt: skip
        facts = workspace / "facts.json"
        env = files.env

        code, clean, err = _dry_run(files, env)
        assert code == 0, err
        baseline = clean["plan"]["prediction"]["chosen"]
        assert {f["origin"] for f in clean["plan"]["prediction"]["facts"]} == {"default"}

        # The old advice: a workspace every user can write, with the sticky bit. Another user plants facts in it.
        workspace.chmod(0o1777)
        assert as_nobody(PLANT, str(facts), json.dumps(FAKE), "file").startswith(f"{NOBODY} ")
        code, refused, err = _dry_run(files, env)
        message = refused["error"]["message"]
        assert code != 0 and f"workspace: {workspace}: mode 1777 lets other users write in it" in message, message
        assert f"mkdir -m 700 {workspace}/root" in message, message  # what to do instead

        # Made the user's alone: the planted file left in it is ignored, with a warning, and the plan is the one
        # without facts (the fake numbers would have chosen another layout: below).
        workspace.chmod(0o700)
        code, ignored, err = _dry_run(files, env)
        assert code == 0, err
        [warning] = [w for w in ignored["warnings"] if w.startswith(f"{facts}: ")]
        assert f"belongs to uid {NOBODY}" in warning and "ignored" in warning, warning
        assert ignored["plan"]["prediction"]["chosen"] == baseline
        assert {f["origin"] for f in ignored["plan"]["prediction"]["facts"]} == {"default"}

        # A FIFO in its place: the dry run neither blocks on it nor reads it.
        workspace.chmod(0o1777)
        as_nobody(PLANT, str(facts), "", "fifo")
        workspace.chmod(0o700)
        code, fifo, err = _dry_run(files, env)
        assert code == 0, err
        assert any(w.startswith(f"{facts}: is a FIFO, not a regular file") for w in fifo["warnings"]), fifo["warnings"]
        assert fifo["plan"]["prediction"]["chosen"] == baseline

        # The same numbers in the user's own file are used: they do change the layout.
        facts.unlink()
        facts.write_text(json.dumps(FAKE))
        facts.chmod(0o600)
        code, trusted, err = _dry_run(files, env)
        assert code == 0, err
        assert trusted["plan"]["prediction"]["chosen"] != baseline
        assert "run" in {f["origin"] for f in trusted["plan"]["prediction"]["facts"]}
        assert not any(str(facts) in w for w in trusted["warnings"])
    finally:
        shutil.rmtree(project, ignore_errors=True)
