"""The builder subprocess of :mod:`ddslurm.launcher._recipe` (``python -P -m ddslurm.launcher._builder``).

Reads ``{"script" | "module", "function", "run_dir"}`` as JSON on stdin, loads the script the way Data Designer's
CLI loads a ``.py`` config source (``data_designer/cli/utils/config_loader.py``), calls the function and writes
``{"ok": true, "yaml", "file", "line"}`` or ``{"ok": false, "error", "file", "line"}`` as JSON on stdout. What the
script prints goes to stderr. Data Designer is imported here only, never by the submitting process.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ddslurm.config import DD_BUILDER_FUNCTION


class _Failure(Exception):
    def __init__(self, message: str, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.message, self.file, self.line = message, file, line


def _installed_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parents[1])}
    with contextlib.suppress(ImportError, AttributeError):
        import ddslurm

        roots |= {str(Path(p).resolve()) for p in ddslurm.__path__}
    return tuple(sorted(roots))


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The traceback's frames in the user's own files (not Python's, not installed packages', not ddslurm's)."""
    roots = _installed_roots()
    frames = []
    for frame in traceback.extract_tb(exc.__traceback__):
        name = frame.filename
        if name.startswith("<") or any(name.startswith(root + os.sep) for root in roots):
            continue
        frames.append(frame)
    return frames


def _raised(exc: BaseException, what: str, fallback: str | None, fallback_line: int | None = None) -> _Failure:
    """``what`` raised ``exc``: placed at the deepest line of the user's code, with those frames."""
    if isinstance(exc, SystemExit):
        detail = f"called sys.exit({exc.code!r})"
    else:
        detail = f"raised {type(exc).__name__}: {str(exc).strip() or '(no message)'}"
    file, line = fallback, fallback_line
    if isinstance(exc, SyntaxError) and exc.filename:
        file, line = exc.filename, exc.lineno
    frames = _user_frames(exc)
    if frames and not isinstance(exc, SyntaxError):
        file, line = frames[-1].filename, frames[-1].lineno
    trace = "".join(
        f"\n    {f.filename}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else "") for f in frames[-6:]
    )
    return _Failure(f"{what} {detail}" + (f"\n  traceback (your code):{trace}" if trace else ""), file, line)


def _load_script(path: Path) -> ModuleType:
    """The script as a module, exactly as Data Designer's CLI loads a ``.py`` config source."""
    module_name = f"_dd_config_{path.resolve().as_posix().replace('/', '_').replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise _Failure("cannot be loaded as a Python module", str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    parent = str(path.resolve().parent)
    if parent not in sys.path:  # sibling helper modules import, as with Data Designer's CLI
        sys.path.insert(0, parent)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        raise _raised(exc, "running the script", str(path)) from None
    return module


_LOOKED = "looked beside the run file, on PYTHONPATH and in ddslurm's Python environment"


def _import_module(name: str, run_dir: str) -> tuple[ModuleType, Path]:
    sys.path.insert(0, run_dir)
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as exc:
        raise _Failure(f"module {name!r} cannot be imported: {exc} ({_LOOKED})") from None
    except (Exception, SystemExit) as exc:
        raise _raised(exc, f"importing the packages of {name!r}", None) from None
    if spec is None:
        raise _Failure(f"module {name!r} was not found ({_LOOKED})")
    if spec.origin is None or not Path(spec.origin).is_file():
        raise _Failure(f"module {name!r} is not a Python source file")
    path = Path(spec.origin).resolve()
    os.chdir(path.parent)  # relative seed paths: from the module's directory, as for a script
    try:
        module = importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        raise _raised(exc, f"importing {name}", str(path)) from None
    return module, path


def _call(module: ModuleType, function: str, path: Path) -> tuple[Any, int | None]:
    """Call ``function`` of ``module`` as Data Designer's CLI calls ``load_config_builder``: with no argument, or
    with one ``DataDesignerScriptParams`` (no script arguments: ``argv`` is empty)."""
    func = getattr(module, function, None)
    if func is None:
        if function == DD_BUILDER_FUNCTION:
            raise _Failure(
                f"does not define a '{DD_BUILDER_FUNCTION}()' function (Data Designer's convention for a Python "
                f"config); add: def {DD_BUILDER_FUNCTION}() -> DataDesignerConfigBuilder, or name another function "
                f"in the run file (recipe: {path.name}:FUNCTION)",
                str(path),
            )
        raise _Failure(f"defines no function {function!r}", str(path))
    code = getattr(func, "__code__", None)
    line = code.co_firstlineno if code is not None and Path(code.co_filename).resolve() == path else None
    if not callable(func):
        raise _Failure(f"{function!r} is not callable", str(path), line)
    from data_designer.config import DataDesignerScriptParams

    try:
        parameters = tuple(inspect.signature(func).parameters.values())
    except (TypeError, ValueError) as exc:
        raise _Failure(f"cannot inspect {function}(): {exc}", str(path), line) from None
    unsupported = f"{function}() must take no argument or one DataDesignerScriptParams (as Data Designer requires)"
    if len(parameters) > 1:
        raise _Failure(unsupported, str(path), line)
    params = DataDesignerScriptParams()
    try:
        if not parameters:
            return func(), line
        parameter = parameters[0]
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return func(params), line
        if parameter.kind == inspect.Parameter.KEYWORD_ONLY:
            return func(**{parameter.name: params}), line
    except (Exception, SystemExit) as exc:
        raise _raised(exc, f"{function}()", str(path), line) from None
    raise _Failure(unsupported, str(path), line)


def _to_yaml(value: Any, function: str, path: Path, line: int | None) -> str:
    """The config as Data Designer writes it: ``builder.write_config("recipe.yaml")``, or ``to_yaml`` of a config
    object (after the check ``write_config`` makes: an in-memory DataFrame seed cannot be written)."""
    import data_designer.config as dd
    from data_designer.config.config_builder import BuilderConfig

    try:
        if isinstance(value, dd.DataDesignerConfigBuilder):
            with tempfile.TemporaryDirectory(prefix="ddslurm-recipe-") as scratch:
                target = Path(scratch) / "recipe.yaml"
                value.write_config(target)
                return target.read_text(encoding="utf-8")
        if isinstance(value, dd.DataDesignerConfig):
            value = BuilderConfig(data_designer=value)
        if isinstance(value, BuilderConfig):
            seed = value.data_designer.seed_config
            if seed is not None and isinstance(seed.source, dd.DataFrameSeedSource):
                raise ValueError(
                    "the config has a DataFrame seed dataset, which cannot be written to a config file; save it "
                    "(LocalFileSeedSource.from_dataframe(df, 'seed.parquet')) and use that file"
                )
            return str(value.to_yaml(indent=2))  # no path: the YAML text
    except Exception as exc:
        raise _Failure(
            f"{function}() returned a config that Data Designer cannot write: {type(exc).__name__}: {exc}",
            str(path),
            line,
        ) from None
    raise _Failure(
        f"{function}() returned {type(value).__name__}, expected a DataDesignerConfigBuilder (or a Data Designer "
        "config: DataDesignerConfig, BuilderConfig)",
        str(path),
        line,
    )


def build(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Load the script or module, call its function and serialise the config (in the builder subprocess)."""
    function = str(payload["function"])
    try:
        if "script" in payload:
            path = Path(str(payload["script"]))
            os.chdir(path.parent)
            module = _load_script(path)
        else:
            module, path = _import_module(str(payload["module"]), str(payload["run_dir"]))
        value, line = _call(module, function, path)
        text = _to_yaml(value, function, path, line)
    except _Failure as failure:
        return {"ok": False, "error": failure.message, "file": failure.file, "line": failure.line}
    return {"ok": True, "yaml": text, "file": str(path), "line": line}


def main() -> int:
    payload = json.load(sys.stdin)
    result = os.dup(1)
    os.dup2(2, 1)  # whatever the script prints goes to stderr: stdout carries the result only
    try:
        answer = build(payload)
    except BaseException as exc:  # ddslurm's own failure: report it rather than a bare traceback
        answer = {"ok": False, "error": f"loading the recipe failed: {type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(result, "w") as out:
        json.dump(answer, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
