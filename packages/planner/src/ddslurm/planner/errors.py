"""Errors of the planner.

PlanError          root: the run cannot be compiled into a plan; the message says which numbers disagree
"""

from __future__ import annotations


class PlanError(Exception):
    """Root of the errors raised by ddslurm.planner."""
