"""``fake-sglang-python``: a Python interpreter as far as ddslurm starts SGLang with one, whose ``sglang`` is the
stand-in's.

ddslurm runs ``<sglang python> -c BOOT ARGS...`` (BOOT appends ``--api-key`` from the environment to ``sys.argv``
and runs ``sglang.launch_server`` with ``runpy``), ``<python> -m sglang.launch_server ARGS`` and
``<python> -c "import sglang; print(sglang.__version__)"``. As ``python`` does: ``-c CODE ARGS`` executes CODE as
``__main__`` with ``sys.argv == ["-c", *ARGS]``; ``-m MODULE ARGS`` runs MODULE with ``runpy.run_module(...,
run_name="__main__", alter_sys=True)`` and ``sys.argv == [<its file>, *ARGS]``; ``SCRIPT ARGS`` runs a file;
``-V``/``--version`` prints the version. The shim directory holding the fake ``sglang`` package comes first on
``sys.path``; it ships inside ``fake_vllm``, so the venv itself has no top-level ``sglang``.
"""

from __future__ import annotations

import builtins
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

SHIM_DIR = Path(__file__).with_name("_sglang_shim")
_IGNORED_OPTIONS = frozenset({"-u", "-B", "-s", "-E", "-I", "-P", "-q", "-O", "-OO"})
_USAGE = "usage: fake-sglang-python [-u] (-c CODE | -m MODULE | SCRIPT) [ARGS...]\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fake-sglang-python`` console script; returns (or exits with) the program's status."""
    args = list(sys.argv[1:] if argv is None else argv)
    while args and args[0] in _IGNORED_OPTIONS:
        args.pop(0)
    if not args:
        sys.stderr.write(_USAGE + "fake-sglang-python: no interactive mode\n")
        return 2
    if args[0] in ("-V", "--version"):
        print(f"Python {sys.version.split()[0]}")
        return 0
    sys.path.insert(0, str(SHIM_DIR))
    first = args[0]
    if first == "-c" or (first.startswith("-c") and len(first) > 2):
        code, rest = (args[1], args[2:]) if first == "-c" and len(args) > 1 else (first[2:], args[1:])
        if first == "-c" and len(args) < 2:
            sys.stderr.write("Argument expected for the -c option\n")
            return 2
        sys.argv = ["-c", *rest]
        namespace = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None, "__package__": None}
        exec(compile(code, "<string>", "exec"), namespace)  # what `python -c` does
        return 0
    if first == "-m" or (first.startswith("-m") and len(first) > 2):
        module, rest = (args[1], args[2:]) if first == "-m" and len(args) > 1 else (first[2:], args[1:])
        if first == "-m" and len(args) < 2:
            sys.stderr.write("Argument expected for the -m option\n")
            return 2
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    if first.startswith("-"):
        sys.stderr.write(_USAGE + f"fake-sglang-python: unknown option {first}\n")
        return 2
    sys.argv = list(args)
    sys.path[0] = str(Path(first).resolve().parent)
    sys.path.insert(0, str(SHIM_DIR))
    runpy.run_path(first, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
