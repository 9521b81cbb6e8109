"""The starter recipes of ``ddslurm init --example`` (the option's choices; ``_starter`` writes them), apart from
``_starter`` so that the command line knows them without loading the providers."""

from __future__ import annotations

from enum import StrEnum


class Example(StrEnum):
    """The starter recipes of ``init --example``."""

    hosted = "hosted"
    mixed = "mixed"
