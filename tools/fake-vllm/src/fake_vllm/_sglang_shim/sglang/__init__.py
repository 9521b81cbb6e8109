"""The fake SGLang package that ``fake-sglang-python`` puts first on ``sys.path``: just ``__version__`` and
``sglang.launch_server``, which runs the fake-vllm stand-in in SGLang mode. Not importable from the venv itself."""

from fake_vllm.version import version

__version__ = f"0.4.7+fakevllm.{version()}"
