"""Scenarios of the fault campaign (tools/chaos, docs/reliability.md#randomized-fault-campaign) that failed once,
each rerun from its seed by the harness on the local cluster: the same layout, recipe, numbers and faults, the
same recovery and the same oracle. Each entry says what the seed draws and what the campaign found; a fast test
checks that the seeds still draw what they drew (a change to tools/chaos/draw.py changes every seed's meaning)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.chaos.draw import draw  # noqa: E402
from tools.chaos.reference import ReferenceCache  # noqa: E402
from tools.chaos.run import run_one  # noqa: E402

# seed: (what it draws: Scenario.describe() | describe_faults(), what the campaign found before the fix)
#
# None yet with the current drawing: its campaigns (seeds 4000+, 5000+, 5143, 6000, 6186, 6571; see
# docs/reliability.md) passed. The one failure so far, seed 3012, was drawn by an earlier version of draw.py and
# depends on a sub-second window (a node taken down between a shard's winner and the end of its task leaves the
# requeued tasks PENDING after `wait` says succeeded), so it is described in docs/reliability.md, not pinned here.
# Seed 500106 of the compact profile (a CPU stage that drops a column of its own lost the row numbers its fills
# read: five retries partial) is held without the cluster, by the engine test that failed before its fix
# (tests/test_fixed_seed_resume.py -k cpu_stage; docs/reliability.md).
REGRESSIONS: dict[int, tuple[str, str]] = {}


def _drawn(seed: int) -> str:
    scenario = draw(seed)
    return f"{scenario.describe()} | {scenario.describe_faults()}"


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_regression_seeds_still_draw_their_scenarios(seed: int) -> None:
    assert _drawn(seed) == REGRESSIONS[seed][0]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceCache]:
    cache = ReferenceCache(tmp_path_factory.mktemp("chaos-references"))
    yield cache
    cache.close()


@pytest.mark.slurm
@pytest.mark.dd
@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_campaign_scenario_passes(seed: int, references: ReferenceCache, tmp_path: Path) -> None:
    outcome = run_one(seed, tmp_path, references)
    found = REGRESSIONS[seed][1]
    assert outcome.verdict == "ok", f"{outcome.line()}\n  found before: {found}\n  kept: {outcome.run_dir}"
