"""A pytest plugin that hands the long tests out first and keeps a shared run on one worker.

``--long-first``: the tests that need the Slurm cluster (``slurm``), then those that run Data Designer (``dd``), then
the rest, each group in its collection order. pytest-xdist gives the workers tests in the order it has them: in
collection order the end-to-end files come last (``tests/test_e2e_*``), and a run ended with one or two workers busy
on a long cluster test while the others had nothing left. Long first, the cluster tests (which mostly wait on Slurm)
run beside the short CPU-bound ones, and the run ends on short tests.

``--share-module-fixtures``: every test that uses a fixture of module (or class, or package) scope is put in its
module's ``xdist_group``, so that with ``--dist loadgroup`` one worker runs the whole module and the fixture (a
shared cluster run, a Data Designer oracle) runs once, not once on every worker that received one of its tests.

``make test`` loads it (``-p tools.pytest_order --long-first --share-module-fixtures --dist loadgroup``)."""

from __future__ import annotations

import pytest

LONG_MARKERS = ("slurm", "dd")
"""The markers of long tests, the longest kind first."""
SHARED_SCOPES = frozenset({"module", "class", "package"})
"""The fixture scopes whose value several tests of one module share."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long-first",
        action="store_true",
        default=False,
        help="run the tests marked slurm first, then dd, then the rest (each in collection order)",
    )
    parser.addoption(
        "--share-module-fixtures",
        action="store_true",
        default=False,
        help="put the tests that use a module-scoped fixture in their module's xdist_group (use --dist loadgroup)",
    )


def rank(item: pytest.Item) -> int:
    """0 for a cluster test, 1 for a Data Designer test, 2 for the rest."""
    for index, marker in enumerate(LONG_MARKERS):
        if item.get_closest_marker(marker) is not None:
            return index
    return len(LONG_MARKERS)


def shared_group(item: pytest.Item) -> str | None:
    """The group of a test that uses a fixture of a scope wider than the function (its module's path), else None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for definitions in info.name2fixturedefs.values():
        if any(definition.scope in SHARED_SCOPES for definition in definitions):
            return item.nodeid.split("::", 1)[0]
    return None


class ShareModuleFixtures:
    """Registered by ``--share-module-fixtures``: marks each test of :func:`shared_group` with its group."""

    @pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker names the group in the test's id
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            group = shared_group(item)
            if group is not None and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--share-module-fixtures"):
        config.pluginmanager.register(ShareModuleFixtures(), "ddslurm-share-module-fixtures")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long-first"):
        items.sort(key=rank)  # stable: collection order within each rank
