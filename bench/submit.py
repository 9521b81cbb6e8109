"""The control plane at scale: plan + render + submit on the real local cluster at 1k and 5k shards.

Jobs are held with ``--begin`` an hour ahead (nothing runs) and cancelled right after. 10,000 shards do not fit
the local cluster's MaxJobCount (10,000) under ddslurm's 90 % headroom rule (finished and cancelled jobs count
for MinJobAge, 300 s), so that size shows the refusal with the numbers. Prints one JSON line: wall time per phase
and size, the large/small ratio of per-shard cost without ``prepare`` (whose Data Designer validation is paid
once per process; 1.0 = linear), run-directory entries per shard, and the scheduler calls one ``status`` refresh
makes (1 squeue + 1 sacct whatever the size).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

KEY_ENV = "DEMO_HOSTED_API_KEY"


class CountingRunner:
    """The real scheduler client, counting each command it runs."""

    def __init__(self, env: Mapping[str, str]) -> None:
        from ddslurm.launcher.cluster._slurm import SubprocessRunner

        self._inner = SubprocessRunner.from_env(env)
        self.calls: Counter[str] = Counter()

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Any:
        self.calls[argv[0]] += 1
        return self._inner(argv, env=env)


def _files(root: Path, shards: int) -> tuple[Path, Path, dict[str, str]]:
    recipe = REPO / "examples" / "hosted-only" / "recipe.yaml"
    (root / "recipe.yaml").write_bytes(recipe.read_bytes())
    run = root / "run.yaml"
    run.write_text(
        f"name: bench\nrecipe: recipe.yaml\nnum_records: {shards}\nshards: {shards}\nbuffer_size: 1\n"
        "submission:\n  time_limit: '00:10:00'\n  cpus: 1\n  memory: 100M\n"
        "  extra_sbatch: ['--begin=now+1hour']\n"
    )
    profile = root / "profile.yaml"
    profile.write_text(
        f"name: bench\nworkspace: {root / 'work'}\npython_env: {REPO / '.venv'}\npartition: gpu\n"
        "cpu_partition: cpu\ngpus_per_node: 4\n"
    )
    env = {**os.environ, "DATA_DESIGNER_HOME": str(REPO / "examples" / "hosted-only" / "dd-home")}
    env.setdefault(KEY_ENV, "bench-key-not-used-0123456789")
    return run, profile, env


def _measure(shards: int, *, dry: bool) -> dict[str, Any]:
    """The phases of ``ddslurm submit`` (``launcher.submission._submit.submit``), each timed; then one status
    refresh."""
    from ddslurm.config import encode_pretty, publish_once
    from ddslurm.launcher import Slurm, prepare, run_status, write_run_dir
    from ddslurm.launcher.runs._steer import cancel
    from ddslurm.launcher.submission._arrays import new_stamp, read_limits, submit_arrays, submit_lock
    from ddslurm.launcher.submission._render import render_generation
    from ddslurm.planner import plan_submission

    root = Path(tempfile.mkdtemp(prefix=f"ddslurm-bench-submit-{shards}-"))
    try:
        run, profile, env = _files(root, shards)
        runner = CountingRunner(env)
        slurm = Slurm(runner, env=env)
        now = datetime.now(UTC)
        t0 = time.perf_counter()
        prepared = prepare(run, profile, env, now)
        layout, plan = prepared.layout, prepared.plan
        t1 = time.perf_counter()
        try:
            planned = plan_submission(
                plan, layout, [s.index for s in plan.shards], read_limits(slurm, plan), stamp=new_stamp(now)
            )
        except Exception as exc:  # the refusal with the numbers is the result at this size
            return {"shards": shards, "prepare_s": round(t1 - t0, 3), "refused": str(exc).splitlines()[-1]}
        t2 = time.perf_counter()
        scripts = [render_generation(plan, layout, list(a.shards)) for a in planned.arrays]
        t3 = time.perf_counter()
        out: dict[str, Any] = {
            "shards": shards,
            "arrays": len(planned.arrays),
            "prepare_s": round(t1 - t0, 3),
            "plan_s": round(t2 - t1, 3),
            "render_s": round(t3 - t2, 3),
            "script_bytes": sum(len(text) for text in scripts),
        }
        if dry:
            return out
        write_run_dir(prepared)
        t4 = time.perf_counter()
        with submit_lock(layout):
            publish_once(layout.submit_plan, encode_pretty(planned.record(now)))
            submit_arrays(layout, plan, planned.arrays, slurm, env, now)
        t5 = time.perf_counter()
        entries = sum(1 for _ in layout.root.rglob("*"))
        runner.calls.clear()
        t6 = time.perf_counter()
        status = run_status(layout, slurm)
        t7 = time.perf_counter()
        refresh_calls = dict(runner.calls)
        cancel(layout, slurm)
        out.update(
            write_s=round(t4 - t3, 3),
            submit_s=round(t5 - t4, 3),
            status_s=round(t7 - t6, 3),
            status_state=status.state,
            entries_per_shard=round(entries / shards, 3),
            calls_per_status_refresh=refresh_calls,
        )
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    small = _measure(1000, dry=False)
    large = _measure(5000, dry=False)
    huge = _measure(10000, dry=True)
    phases = ("plan_s", "render_s", "write_s", "submit_s", "status_s")

    def per_shard(m: dict[str, Any]) -> float:
        return sum(m.get(p, 0.0) for p in phases) / m["shards"]

    ratio = None
    if "refused" not in small and "refused" not in large:
        ratio = round(per_shard(large) / per_shard(small), 2)
    print(json.dumps({"bench": "submit", "1k": small, "5k": large, "10k": huge, "per_shard_cost_5k_over_1k": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
