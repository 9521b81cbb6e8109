"""Where Data Designer keeps its settings. The only module in ddslurm that may look at the home directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

DD_HOME_ENV = "DATA_DESIGNER_HOME"


def settings_dir(env: Mapping[str, str], home: Path | None = None) -> Path:
    """``$DATA_DESIGNER_HOME`` if set and non-empty, else ``~/.data-designer`` (as Data Designer decides)."""
    configured = env.get(DD_HOME_ENV, "")
    if configured:
        return Path(configured)
    return (home if home is not None else Path.home()) / ".data-designer"


def is_home_relative(path: str) -> bool:
    """Whether ``path`` names a place in somebody's home directory (``~``, ``~user``): the nodes must never
    depend on the submitter's home, so such paths in a recipe are refused rather than expanded."""
    return path.startswith("~")
