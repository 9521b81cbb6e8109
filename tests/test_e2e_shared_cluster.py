"""Issue 18 on the local Slurm cluster, with a second, unprivileged user (``nobody``) on the same nodes.

- A queued run's directory cannot be renamed aside or replaced by another user (the workspace, ``runs/`` and the
  run directory are 0700 whatever the submitter's umask, here 000, in a shared, world-writable project
  directory); and a run directory that was replaced all the same (done here by root, standing in for an attacker
  who could) is refused by the job before anything runs: the plan's sha256 in the batch script differs, the
  provider gets no request, and the API key is in no file.
- A shard cancelled while it is still pending ends ``cancelled``: ``wait`` returns, and ``retry
  --resume-cancelled`` brings it back.

Jobs stay pending by ``--begin`` (``extra_sbatch``) until the test releases them (``scontrol update
StartTime=now``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import array_jobs, as_nobody, run_cli, until
from tests.e2e import cli_json as _cli

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.dd,
    pytest.mark.skipif(os.getuid() != 0 or not Path("/usr/bin/python3").exists(), reason="another user needs root"),
]

SERVED = ["--served-model-name", "demo/writer-8b", "demo/judge-70b"]
PENDING = "  extra_sbatch: ['--begin=now+3600']\n"  # under submission: queued until the test releases it


def _release(run_dir: Path) -> None:
    for array in array_jobs(run_dir):
        subprocess.run(["scontrol", "update", f"JobId={array}", "StartTime=now"], capture_output=True, timeout=60)


@contextlib.contextmanager
def _shared_project(files: Any, key: str) -> Iterator[tuple[dict[str, str], Path, Path]]:
    """A world-writable, sticky project directory (``/tmp``-like, as a shared project space is) holding the
    workspace; a provider of this test's own that records every request. Yields (env, project, request log)."""
    from fake_vllm.testing import start_server

    project = Path(tempfile.mkdtemp(prefix="ddslurm-shared-", dir="/tmp"))
    project.chmod(0o1777)
    requests = files.root / "provider-requests.jsonl"
    try:
        args = [*SERVED, "--fake-latency", "0.05", "--fake-request-log", str(requests)]
        with start_server("demo", args=args, api_key=key) as srv:
            (files.dd_home / "model_providers.yaml").write_text(
                f"providers:\n- {{name: demo-hosted, endpoint: '{srv.base_url}', api_key: DEMO_HOSTED_API_KEY}}\n"
            )
            profile = files.profile.read_text().replace(f"workspace: {files.workspace}", f"workspace: {project}/ws")
            files.profile.write_text(profile)
            yield {**files.env, "DEMO_HOSTED_API_KEY": key}, project, requests
    finally:
        shutil.rmtree(project, ignore_errors=True)


def _cancel_quietly(run_dir: Path, env: dict[str, str]) -> None:
    run_cli("cancel", str(run_dir), env=env, timeout=120)


SWAP = r"""
import os, sys
run = sys.argv[1]
out = []
for what, act in (
    ("rename", lambda: os.rename(run, run + ".aside")),
    ("replace plan", lambda: open(os.path.join(run, "run.json"), "w")),
    ("new run", lambda: os.mkdir(os.path.join(os.path.dirname(run), "theirs"))),
    ("list runs", lambda: os.listdir(os.path.dirname(run))),
):
    try:
        act(); out.append(f"{what}: done")
    except OSError as exc:
        out.append(f"{what}: {exc.strerror}")
print("\n".join(out))
"""


def test_a_queued_run_directory_cannot_be_swapped_and_a_swapped_one_is_refused_by_the_job(
    make_run_files: Any, scan_for_secret: Any
) -> None:
    files = make_run_files("swap", num_records=6, shards=1, buffer_size=3, extra_run=PENDING)
    key = "sk-swap-" + os.urandom(12).hex()
    with _shared_project(files, key) as (env, project, requests):
        run_dir = Path(_cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env,
                            umask=0)["run_dir"])  # fmt: skip
        try:
            for path in (project / "ws", run_dir.parent, run_dir):
                assert path.stat().st_mode & 0o777 == 0o700, path  # whatever the umask (000 here)
            # Another user on the same machine: nothing of the queued run can be moved, replaced or even listed.
            assert as_nobody(SWAP, str(run_dir)).splitlines() == [
                "rename: Permission denied",
                "replace plan: Permission denied",
                "new run: Permission denied",
                "list runs: Permission denied",
            ]
            # Had someone swapped it all the same: a run directory like the victim's, with a plan of theirs.
            plan = json.loads((run_dir / "run.json").read_text())
            plan["num_records"] += 1
            (run_dir / "run.json").chmod(0o600)
            (run_dir / "run.json").write_text(json.dumps(plan))
            _release(run_dir)
            [array] = array_jobs(run_dir)
            until(lambda: not subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True,
                                              check=False).stdout.strip(), 180, "the job to end")  # fmt: skip
            logs = "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("slurm-*.out"))
            assert "the run directory was replaced after submission" in logs, logs[-3000:]
            assert not list(run_dir.glob("shards/*/attempts/*")), "an attempt began from the swapped plan"
            seen = [json.loads(line) for line in requests.read_text().splitlines()]  # the start's own /health only
            assert [(r["path"], r["auth_present"]) for r in seen] == [("/health", False)], seen  # no key was sent
            assert scan_for_secret(project, key) == [] and scan_for_secret(files.root, key) == []
        finally:
            _cancel_quietly(run_dir, env)


def test_a_shard_cancelled_while_pending_ends_cancelled_wait_returns_and_retry_brings_it_back(
    make_run_files: Any,
) -> None:
    files = make_run_files("pending-cancel", num_records=12, shards=2, buffer_size=3, extra_run=PENDING)
    key = "sk-pending-" + os.urandom(12).hex()
    with _shared_project(files, key) as (env, _project, _requests):
        run_dir = Path(
            _cli("submit", str(files.run_file), "--profile", str(files.profile), "--json", env=env)["run_dir"]
        )
        try:
            status = _cli("status", str(run_dir), "--json", env=env)
            assert [s["state"] for s in status["shards"]] == ["pending", "pending"], status
            _cli("cancel", str(run_dir), "--shards", "1", "--json", env=env)
            status = until(
                lambda: (
                    (s := _cli("status", str(run_dir), "--json", env=env))["shards"][1]["state"] == "cancelled" and s
                ),
                60,
                "the pending shard to show cancelled",
            )
            assert status["shards"][0]["state"] == "pending"
            _release(run_dir)  # shard 0 runs; the cancelled shard never does
            final = _cli("wait", str(run_dir), "--json", "--timeout", "180", env=env, timeout=210, codes=(1,))
            assert final["state"] == "cancelled"  # not every shard succeeded: wait's exit status is 1
            assert [s["state"] for s in final["shards"]] == ["succeeded", "cancelled"], final
            assert final["records_done"] == 6
            retried = _cli("retry", str(run_dir), "--resume-cancelled", "--json", env=env)
            assert retried["shards"] == [1], retried
            _release(run_dir)  # the retry's array is held by the run file's --begin too
            final = _cli("wait", str(run_dir), "--json", "--timeout", "180", env=env, timeout=210)
            assert final["state"] == "succeeded" and final["records_done"] == 12, final
        finally:
            _cancel_quietly(run_dir, env)
