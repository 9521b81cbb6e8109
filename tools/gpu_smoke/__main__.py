"""``python -m tools.gpu_smoke``: see :mod:`tools.gpu_smoke.cli`."""

from __future__ import annotations

import sys

from tools.gpu_smoke.cli import main

sys.exit(main(sys.argv[1:]))
