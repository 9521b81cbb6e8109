"""What a run file's ``recipe`` names: a Data Designer config file, a builder script and its function, or an
importable module's function (:class:`RecipeRef`, :func:`parse_recipe_ref`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DD_BUILDER_FUNCTION = "load_config_builder"
"""The function Data Designer's own CLI calls in a Python config module (``data-designer create build.py``;
``USER_MODULE_FUNC_NAME`` in ``data_designer/cli/utils/config_loader.py``): a run file's ``recipe: build.py`` means
this function of ``build.py``, as it does for Data Designer."""

RecipeKind = Literal["config", "script", "module"]
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class RecipeRef:
    """What a run file's ``recipe`` names: a Data Designer config file (``recipe.yaml``, YAML or JSON), a builder
    script and its function (``build.py``, ``build.py:make``), or an importable module's function
    (``package.module:make``). Paths are relative to the run file."""

    kind: RecipeKind
    target: str
    """The file (config, script) or the dotted module name."""
    function: str | None = None
    """The function that returns the config (scripts and modules); None for config files."""

    def __str__(self) -> str:
        return self.target if self.function is None else f"{self.target}:{self.function}"


def parse_recipe_ref(text: str) -> RecipeRef:
    """The reference a run file's ``recipe`` holds; ValueError says why a reference cannot be one.

    ``*.py`` is a builder script whose :data:`DD_BUILDER_FUNCTION` is called (Data Designer's convention);
    ``FILE.py:NAME`` calls ``NAME`` instead; ``a.b.c:NAME`` imports module ``a.b.c`` and calls ``NAME``;
    anything else is a config file."""
    value = text.strip()
    if not value:
        raise ValueError("names no recipe (a Data Designer config file, a builder script build.py, or module:function)")
    head, sep, function = value.rpartition(":")
    if sep and head and function.isidentifier():
        if head.lower().endswith(".py"):
            return RecipeRef("script", head, function)
        if head.lower().endswith(_CONFIG_SUFFIXES):
            raise ValueError(
                f"{value!r}: a ':{function}' suffix names the function of a Python builder script "
                f"(build.py:{function}) or module (package.module:{function}); a config file ({head}) has none"
            )
        if all(part.isidentifier() for part in head.split(".")):
            return RecipeRef("module", head, function)
    if value.lower().endswith(".py"):
        return RecipeRef("script", value, DD_BUILDER_FUNCTION)
    return RecipeRef("config", value)
