"""Whether the profile's ``python_env`` can run what this submit host plans: ``doctor``'s ``python_env`` check judges
what ``<python_env>/bin/ddslurm-runtime inspect`` answers to a :class:`~ddslurm.config.VersionsRequest`
(:func:`ddslurm.runtime._inspect.versions`) by compatibility, not equality (a ``python_env`` whose ddslurm speaks
another inspect protocol gets no further: ``doctor`` says so, :mod:`ddslurm.launcher.cluster._engine_host`):

- ddslurm's own distributions (``ddslurm-runtime``, ``ddslurm-config``) at the submit host's versions, reading the
  plan format the submit host writes (:data:`~ddslurm.config.PLAN_VERSION`, :data:`~ddslurm.config.LAYOUT_VERSION`):
  the plan is their contract, and its structs refuse any field they do not know;
- Data Designer at any version ddslurm supports (:data:`~ddslurm.config.DATA_DESIGNER_VERSIONS`), whichever the
  submit host has: every check that needs Data Designer's engine runs in ``python_env`` (``ddslurm-runtime
  inspect``), the submit host uses only its config models. The plan records the nodes' version and each node
  refuses another (:mod:`ddslurm.runtime._dd_version`).
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ddslurm.config import DATA_DESIGNER, DATA_DESIGNER_VERSIONS, LAYOUT_VERSION, PLAN_VERSION, VersionsAnswer

DDSLURM_DISTRIBUTIONS = ("ddslurm-runtime", "ddslurm-config")
"""What writes (on the submit host) and reads (on the nodes) the plan: the same versions on both."""


def supported_data_designer(version: str) -> bool:
    """Whether ddslurm supports Data Designer ``version`` (a pre-release within the range counts)."""
    try:
        return SpecifierSet(DATA_DESIGNER_VERSIONS).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def judge_versions(answer: VersionsAnswer, ours: Mapping[str, str | None], python_env: str) -> tuple[bool, str]:
    """``(ok, detail)`` for the ``versions`` answer of ``python_env``'s runtime, against this host's versions
    ``ours`` (of :data:`ddslurm.runtime.NODE_DISTRIBUTIONS`): what each side has when it is ok, every problem (and
    what to install) when not."""
    theirs = answer.versions
    problems: list[str] = []
    none = "(not installed)"
    differ = [
        f"{name} {theirs.get(name) or none} where the submit host has {ours.get(name) or none}"
        for name in DDSLURM_DISTRIBUTIONS
        if theirs.get(name) != ours.get(name)
    ]
    if differ:
        problems.append(
            f"{python_env} has {'; '.join(differ)} (ddslurm's own packages write and read the plan: install the "
            "submit host's versions there)"
        )
    plan = answer.plan
    if (plan.version, plan.layout) != (PLAN_VERSION, LAYOUT_VERSION):
        problems.append(
            f"its ddslurm-runtime reads plan {plan.version}, layout {plan.layout}; the submit host "
            f"writes plan {PLAN_VERSION}, layout {LAYOUT_VERSION}"
        )
    nodes, here = theirs.get(DATA_DESIGNER), ours.get(DATA_DESIGNER)
    wanted = f"{DATA_DESIGNER}{DATA_DESIGNER_VERSIONS}"
    if not nodes:
        problems.append(f"{python_env} has no {DATA_DESIGNER} (the nodes run it): install {wanted} there")
    elif not supported_data_designer(str(nodes)):
        problems.append(
            f"{python_env} has {DATA_DESIGNER} {nodes}, which ddslurm does not support: install {wanted} there"
        )
    if problems:
        return False, "; ".join(problems)
    same = ", ".join(f"{name} {ours.get(name)}" for name in DDSLURM_DISTRIBUTIONS)
    where = (
        f"{DATA_DESIGNER} {nodes} on the nodes and the submit host"
        if nodes == here
        else f"{DATA_DESIGNER} {nodes} on the nodes, {here or 'none'} on the submit host"
    )
    return True, (
        f"{same} as on the submit host (plan {PLAN_VERSION}, layout {LAYOUT_VERSION}); {where} (ddslurm supports "
        f"{wanted}; each run records the nodes' version)"
    )
