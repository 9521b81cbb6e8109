"""Scenarios of the fault campaign (tools/chaos, docs/reliability.md#randomized-fault-campaign) that failed once,
each rerun from its seed by the harness on the local cluster: the same layout, recipe, numbers and faults, the
same recovery and the same oracle. Each entry says what the campaign found."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.chaos.reference import ReferenceCache  # noqa: E402
from tools.chaos.run import run_one  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.dd]

# seed: what the scenario draws, and the verdict the campaign gave before the fix
REGRESSIONS: dict[int, str] = {}


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceCache]:
    cache = ReferenceCache(tmp_path_factory.mktemp("chaos-references"))
    yield cache
    cache.close()


@pytest.mark.parametrize("seed", sorted(REGRESSIONS), ids=[f"seed-{s}" for s in sorted(REGRESSIONS)])
def test_campaign_scenario_passes(seed: int, references: ReferenceCache, tmp_path: Path) -> None:
    outcome = run_one(seed, tmp_path, references)
    assert outcome.verdict == "ok", f"{outcome.line()}\n  found before: {REGRESSIONS[seed]}\n  kept: {outcome.run_dir}"
