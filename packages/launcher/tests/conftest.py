"""Fixtures the launcher's tests share."""

from __future__ import annotations

import pytest

from ddslurm.config import Plan
from ddslurm.launcher.submission import _prepare as prepare_module
from ddslurm.planner import PlanInputs


@pytest.fixture
def planner_inputs(monkeypatch: pytest.MonkeyPatch) -> list[PlanInputs]:
    """What ``prepare`` gives the planner, each compile's inputs in order (the planner still runs)."""
    seen: list[PlanInputs] = []
    compile_plan = prepare_module.compile_plan

    def spy(inputs: PlanInputs) -> Plan:
        seen.append(inputs)
        return compile_plan(inputs)

    monkeypatch.setattr(prepare_module, "compile_plan", spy)
    return seen
