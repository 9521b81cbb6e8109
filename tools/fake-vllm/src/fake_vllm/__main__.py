"""``python -m fake_vllm`` is the ``fake-vllm`` console script."""

from __future__ import annotations

import sys

from fake_vllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
