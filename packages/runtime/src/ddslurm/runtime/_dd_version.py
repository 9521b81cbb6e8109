"""What is installed here (the distributions' versions), the Data Designer a run was planned with, and the node's
refusal of another.

At submit, ``ddslurm-runtime inspect`` in the profile's ``python_env`` says which Data Designer it holds (its
``check`` answer); the plan records it (``Plan.data_designer_version``). A node whose ``python_env`` holds another
version (reinstalled since the submit, or another environment at the same path) would run the recipe under rules
the submit did not check: the controller refuses before any server starts and every client step before it runs
Data Designer, with ``recipe_invalid`` (never retried automatically: every attempt would repeat it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from ddslurm.config import DATA_DESIGNER
from ddslurm.runtime.errors import RecipeError


def installed_versions(names: Sequence[str]) -> dict[str, str | None]:
    """The version of each distribution of ``names`` installed here, None for one that is not."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def installed_data_designer() -> str | None:
    """The version of Data Designer installed in this environment; None when it has none."""
    return installed_versions((DATA_DESIGNER,))[DATA_DESIGNER]


def check_data_designer(planned: str) -> None:
    """Refuse (:class:`RecipeError`) to run here when this environment's Data Designer is not ``planned``, the
    version the plan records; an empty ``planned`` (a plan made before ddslurm recorded it) is not checked."""
    if not planned:
        return
    here = installed_data_designer()
    if here == planned:
        return
    has = f"data-designer {here}" if here is not None else "no data-designer"
    again = f" (its plan then records {here})" if here is not None else ""
    raise RecipeError(
        f"the run was planned with data-designer {planned} (the profile's python_env at submit); this node's "
        f"python_env {sys.prefix} has {has}: install data-designer=={planned} there and `ddslurm retry RUN`, or "
        f"submit the run again{again}"
    )
