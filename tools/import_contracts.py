"""import-linter contract types of this workspace (registered in ``.importlinter`` under ``contract_types``).

``private_modules``: no package imports another package's private modules (any module path with a segment that
starts with ``_`` below the package, such as ``ddslurm.runtime._serving``); what a package offers the others is
what its public modules export. Imports within a package are free.

``only_importers``: the ``modules`` (an external library, such as plotly) are imported by the ``importers`` (and
the modules below them) alone: one place owns a heavy or replaceable dependency, and every other module goes
through it.
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _is_private_below(module: str, package: str) -> bool:
    return any(part.startswith("_") for part in module.removeprefix(package + ".").split("."))


def _owner(module: str, packages: list[str]) -> str | None:
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


class PrivateModulesContract(Contract):
    """``packages``: the packages whose private modules only they themselves may import."""

    type_name = "private_modules"
    packages = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        packages = [m.name for m in self.packages]  # type: ignore[attr-defined]
        violations: list[dict[str, object]] = []
        for importer in sorted(graph.modules):
            own = _owner(importer, packages)
            if own is None:
                continue
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                target = _owner(imported, packages)
                if target is None or target == own or not _is_private_below(imported, target):
                    continue
                lines = graph.get_import_details(importer=importer, imported=imported)
                violations.append(
                    {"importer": importer, "imported": imported, "lines": [d["line_number"] for d in lines]}
                )
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for violation in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in violation["lines"])
            output.print_error(
                f"{violation['importer']} imports {violation['imported']}, a private module of another package "
                f"({lines}); import what that package's public modules export",
                bold=False,
            )
            output.new_line()


def _within(module: str, parents: list[str]) -> bool:
    return _owner(module, parents) is not None


class OnlyImportersContract(Contract):
    """``modules``: what only ``importers`` (each with the modules below it) may import, directly."""

    type_name = "only_importers"
    modules = fields.ListField(subfield=fields.ModuleField())
    importers = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        guarded = [m.name for m in self.modules]  # type: ignore[attr-defined]
        allowed = [m.name for m in self.importers]  # type: ignore[attr-defined]
        violations: list[dict[str, object]] = []
        for imported in sorted(m for m in graph.modules if _within(m, guarded)):
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if _within(importer, allowed):
                    continue
                lines = graph.get_import_details(importer=importer, imported=imported)
                violations.append(
                    {"importer": importer, "imported": imported, "lines": [d["line_number"] for d in lines]}
                )
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(m.name for m in self.importers)  # type: ignore[attr-defined]
        for violation in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in violation["lines"])
            output.print_error(
                f"{violation['importer']} imports {violation['imported']} ({lines}); only {allowed} may import "
                "it: use what that offers",
                bold=False,
            )
            output.new_line()
