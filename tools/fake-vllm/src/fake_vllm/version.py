"""The stand-in's version, read from the installed distribution's metadata."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "ddslurm-fake-vllm"


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0.0.0"


def version_string() -> str:
    """What ``fake-vllm --version`` prints and the start-up log reports."""
    return f"fake-vllm {version()} (vLLM stand-in)"
