"""A pytest plugin that hands the long tests out first: with ``--long-first``, the tests that need the Slurm cluster
(``slurm``), then those that run Data Designer (``dd``), then the rest, each group in its collection order.

pytest-xdist gives the workers tests in the order it has them: in collection order the end-to-end files come last
(``tests/test_e2e_*``), and a run ended with one or two workers busy on a long cluster test while the others had
nothing left. Long first, the cluster tests (which mostly wait on Slurm) run beside the short CPU-bound ones, and
the run ends on short tests. ``make test`` loads it (``-p tools.pytest_order --long-first``)."""

from __future__ import annotations

import pytest

LONG_MARKERS = ("slurm", "dd")
"""The markers of long tests, the longest kind first."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long-first",
        action="store_true",
        default=False,
        help="run the tests marked slurm first, then dd, then the rest (each in collection order)",
    )


def rank(item: pytest.Item) -> int:
    """0 for a cluster test, 1 for a Data Designer test, 2 for the rest."""
    for index, marker in enumerate(LONG_MARKERS):
        if item.get_closest_marker(marker) is not None:
            return index
    return len(LONG_MARKERS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long-first"):
        items.sort(key=rank)  # stable: collection order within each rank
