"""Lazy package exports, as Data Designer's own packages do: a package's ``__init__`` names each exported name's
module, and the name is imported when first used, so a process pays only for the modules it uses."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def lazy_exports(
    package: str, modules: Mapping[str, str], exported: Sequence[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name of ``modules`` (name -> its module) is imported
    from its module when first used and kept in the package's namespace; any other name is an AttributeError."""

    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later uses find it without this function
        return value

    def __dir__() -> list[str]:
        return list(exported)

    return __getattr__, __dir__
