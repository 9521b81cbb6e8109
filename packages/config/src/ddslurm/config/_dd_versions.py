"""The Data Designer versions ddslurm supports: one statement of the range.

The packages' requirements repeat it (``data-designer`` of ddslurm-runtime and ddslurm-launcher,
``data-designer-config`` of ddslurm-providers) and the Makefile's ``DD_OLDEST``/``DD_NEWEST`` test its bounds;
``tests/test_dd_cli.py`` fails when any of them says otherwise. ``ddslurm doctor`` refuses a ``python_env`` whose
Data Designer is outside it; the submit host and the nodes may hold different versions within it.
"""

from __future__ import annotations

DATA_DESIGNER = "data-designer"
"""The distribution the nodes run (with ``data-designer-config`` and ``data-designer-engine`` of its version)."""

DATA_DESIGNER_VERSIONS = ">=0.8.0,<1.1"
"""PEP 440 specifiers of the supported versions; a pre-release within them (1.0.0rc1) is supported too."""
