"""Errors of the planner.

PlanError          root (a DdslurmError): the run cannot be compiled into a plan; the message says which
                   numbers disagree
└── LimitError     the arrays of a submission do not fit the scheduler's limits (the numbers, and what would fit)
"""

from __future__ import annotations

from ddslurm.config import DdslurmError


class PlanError(DdslurmError):
    """Root of the errors raised by ddslurm.planner."""


class LimitError(PlanError):
    """A submission's arrays do not fit under the scheduler's limits (or the cluster accepts no arrays)."""
