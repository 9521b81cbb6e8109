"""The randomized, seeded fault campaign on the real local Slurm cluster.

    uv run python -m tools.chaos --seed S --n N [--parallel P] [--budget-seconds T] [--only SEED] [--json]

Scenario ``i`` of a campaign has the seed ``S + i``; ``--only SEED`` reruns one scenario alone. One line per
scenario (seed, what was drawn, the faults injected and when, the verdict, seconds), then a summary; the exit
status is 1 if any scenario failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: tools/chaos/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.chaos.draw import PROFILES, draw
from tools.chaos.reference import ReferenceCache
from tools.chaos.scenario import Outcome, ScenarioRun, abort_all

REPO = Path(__file__).resolve().parents[2]
SCENARIO_BUDGET_S = 420.0
TIME_LIMIT_BUDGET_S = 660.0
# What a scenario needs at least (a time limit: Slurm's two minutes, then a retry); with --budget-seconds T a
# scenario starts only while this still fits in T, and its own budget ends at most GRACE_S after T.
MIN_SECONDS = 150.0
MIN_SECONDS_TIME_LIMIT = 330.0
GRACE_S = 90.0


def run_one(
    seed: int, work: Path, references: ReferenceCache, budget_s: float | None = None, profile: str = "full"
) -> Outcome:
    """Draw the scenario of ``seed`` and run it on the cluster (used by the campaign and the regression tests)."""
    scenario = draw(seed, profile)
    if budget_s is None:
        budget_s = TIME_LIMIT_BUDGET_S if scenario.time_limit_minutes <= 2 else SCENARIO_BUDGET_S
    root = work / f"seed-{seed}"
    root.mkdir(parents=True, exist_ok=True)
    return ScenarioRun(scenario, root, references, budget_s).execute()


def summary(outcomes: list[Outcome], not_run: int, wall: float) -> dict[str, object]:
    per_layout: dict[str, Counter[str]] = {}
    per_fault: dict[str, Counter[str]] = {}
    per_recipe: dict[str, Counter[str]] = {}
    for o in outcomes:
        per_layout.setdefault(o.layout, Counter())[o.verdict] += 1
        per_recipe.setdefault(o.recipe, Counter())[o.verdict] += 1
        for kind in set(o.faults):
            per_fault.setdefault(kind, Counter())[o.verdict] += 1
    return {
        "scenarios": len(outcomes),
        "verdicts": dict(Counter(o.verdict for o in outcomes)),
        "not_run_budget": not_run,
        "failed_seeds": [o.seed for o in outcomes if o.verdict != "ok"],
        "per_layout": {k: dict(v) for k, v in sorted(per_layout.items())},
        "per_fault": {k: dict(v) for k, v in sorted(per_fault.items())},
        "per_recipe": {k: dict(v) for k, v in sorted(per_recipe.items())},
        "wall_seconds": round(wall, 1),
        "scenario_seconds": sorted(round(o.seconds) for o in outcomes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="campaign seed (default: time-based, printed)")
    parser.add_argument("--n", type=int, default=10, help="scenarios: seeds SEED .. SEED+N-1")
    parser.add_argument("--parallel", type=int, default=1, help="scenarios at once")
    parser.add_argument("--budget-seconds", type=float, default=None, help="start no scenario after this")
    parser.add_argument("--only", type=int, default=None, help="run this one scenario seed alone")
    parser.add_argument("--json", action="store_true", help="JSON lines on stdout (human lines on stderr)")
    parser.add_argument("--work", type=Path, default=None, help="where scenarios run (default .ddslurm-work/chaos)")
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="full", help="the sizes drawn (compact: what CI runs)"
    )
    parser.add_argument("--draw-only", action="store_true", help="print the drawn scenarios and exit")
    args = parser.parse_args(argv)

    seed = args.only if args.only is not None else args.seed if args.seed is not None else int(time.time()) % 1_000_000
    seeds = [args.only] if args.only is not None else [seed + i for i in range(args.n)]
    human = sys.stderr if args.json else sys.stdout
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            print(text, file=human, flush=True)

    if args.only is None:
        rerun = "--only SEED" + ("" if args.profile == "full" else f" --profile {args.profile}")
        say(f"chaos: campaign seed {seed}, profile {args.profile}, {len(seeds)} scenario(s) (rerun one: {rerun})")
    if args.draw_only:
        for s in seeds:
            scenario = draw(s, args.profile)
            say(f"seed={s} [{scenario.describe()}] faults: {scenario.describe_faults()}")
        return 0
    work = args.work or REPO / ".ddslurm-work" / "chaos" / f"{seed}-{int(time.time())}"
    work.mkdir(parents=True, exist_ok=True)
    references = ReferenceCache(work)
    started = time.monotonic()
    outcomes: list[Outcome] = []
    not_run = 0

    def job(s: int) -> Outcome | None:
        scenario = draw(s, args.profile)
        own = TIME_LIMIT_BUDGET_S if scenario.time_limit_minutes <= 2 else SCENARIO_BUDGET_S
        if args.budget_seconds is not None:
            elapsed = time.monotonic() - started
            need = MIN_SECONDS_TIME_LIMIT if scenario.time_limit_minutes <= 2 else MIN_SECONDS
            if elapsed + need > args.budget_seconds:
                return None
            own = min(own, args.budget_seconds + GRACE_S - elapsed)
        say(f"seed={s} start [{scenario.describe()}] planned: {scenario.describe_faults()}")
        outcome = run_one(s, work, references, own, args.profile)
        say(outcome.line() + (f"\n    kept: {outcome.run_dir}" if outcome.verdict != "ok" and outcome.run_dir else ""))
        if args.json:
            with lock:
                print(json.dumps(outcome.as_json()), flush=True)
        return outcome

    def interrupted(signum: int, frame: object) -> None:
        say(f"chaos: interrupted by signal {signum}: cancelling the scenarios under way")
        abort_all()
        references.close()
        os._exit(130)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            futures: list[Future[Outcome | None]] = [pool.submit(job, s) for s in seeds]
            for future in futures:
                result = future.result()
                if result is None:
                    not_run += 1
                else:
                    outcomes.append(result)
    finally:
        references.close()
    report = summary(outcomes, not_run, time.monotonic() - started)
    say(
        f"chaos: seed {seed}: {len(outcomes)} scenario(s), "
        + ", ".join(f"{k} {v}" for k, v in sorted(Counter(o.verdict for o in outcomes).items()))
        + (f", {not_run} not run (budget)" if not_run else "")
        + f", {report['wall_seconds']}s"
    )
    say("  per layout: " + json.dumps(report["per_layout"]))
    say("  per fault:  " + json.dumps(report["per_fault"]))
    say("  per recipe: " + json.dumps(report["per_recipe"]))
    failed = [o.seed for o in outcomes if o.verdict != "ok"]
    if failed:
        say("  failed seeds: " + " ".join(map(str, failed)))
        # again at the end, whole: a log kept only by its tail (CI's) still says why each failed
        for o in outcomes:
            if o.verdict != "ok":
                say(f"  {o.line()}" + (f"\n    kept: {o.run_dir}" if o.run_dir else ""))
    if args.json:
        print(json.dumps({"summary": report, "seed": seed}), flush=True)
    return 1 if any(o.verdict != "ok" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
