"""The fake SGLang package that ``fake-sglang-python`` puts first on ``sys.path``: just ``__version__`` and
``sglang.launch_server``, which runs the fake-vllm stand-in in SGLang mode. Not importable from the venv itself."""

import os

from fake_vllm.settings import engine_version

__version__ = engine_version("sglang", os.environ)
